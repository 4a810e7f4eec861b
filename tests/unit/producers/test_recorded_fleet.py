"""A recorded fleet in the generic layout (``producers.serving.recorded``) as the records an agent
sends: GPU samples standing for the time to the next reading, serving samples for the time since
the one before, every time shifted alike; each record is the schema's."""

from __future__ import annotations

import io
import itertools
import statistics
import tarfile
import time
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.serving.recorded import (
    MAX_INTERVAL_S,
    RecordingError,
    messages,
    read_alibaba,
    read_generic,
    records,
    select,
)
from schemas.codec import Codec

CSV = """timestamp,container,metric,value
2026-11-30T00:00:00+00:00,pod-a,gpu_util_pct,10
2026-11-30T00:01:00+00:00,pod-a,gpu_util_pct,0
2026-11-30T00:02:00+00:00,pod-a,gpu_util_pct,150
2026-11-30T00:01:00+00:00,pod-a,requests_per_s,0.5
2026-11-30T00:00:30+00:00,pod-a,queue_time_ms,100
2026-11-30T00:01:00+00:00,pod-a,queue_time_ms,300
1795996800,pod-b,gpu_util_pct,50
1795997100,pod-b,gpu_util_pct,50
"""


def test_a_generic_recording_becomes_gpu_and_serving_samples(tmp_path):
    path = tmp_path / "fleet.csv"
    path.write_text(CSV)
    series = read_generic(path)
    ticks = list(records(series, shift_s=86_400, service="chat"))
    a = [r for _, batch in ticks for name, r in batch if r["workflow_id"] == "replay-pod-a"]
    gpu = [r for r in a if "utilization_pct" in r]
    served = [r for r in a if "requests" in r]
    assert [r["interval_ms"] for r in gpu] == [60_000, 60_000, 120_000]  # to the next reading; the last: at most 120 s
    assert [r["utilization_pct"] for r in gpu] == [10.0, 0.0, 150.0]  # sent as recorded: the worker refuses 150 %
    assert [r["requests"] for r in served] == [0.0, 30.0, 0.0]  # 0.5/s over the 60 s since the reading before
    assert [r["queue_time_ms"] for r in served] == [None, 200.0, None]
    assert gpu[0]["event_time"] == (1795996800 + 86_400) * 1000
    b = [r for _, batch in ticks for name, r in batch if r["workflow_id"] == "replay-pod-b" and "requests" in r]
    assert [r["interval_ms"] for r in b] == [300_000, 120_000]  # its own spacing; a gap counts 120 s at most
    codec = Codec()
    for _, batch in ticks:
        for schema, record in messages(batch):
            codec.encode(schema, record)
    assert list(select(series, hours=0.02)["pod-a"]["gpu_util_pct"]) == [1795996800.0, 1795996860.0]
    assert list(select(series, containers=1)) == ["pod-a"]


@pytest.mark.parametrize("text, why", [
    ("time,pod,value\n1,a,3\n", "expected the header"),
    ("timestamp,container,metric,value\n1,a,temperature,3\n", "row 2: metric 'temperature'"),
    ("timestamp,container,metric,value\nyesterday,a,gpu_util_pct,3\n", "row 2: timestamp and value"),
])
def test_a_recording_it_cannot_read_says_which_row_and_why(tmp_path, text, why):
    path = tmp_path / "fleet.csv"
    path.write_text(text)
    with pytest.raises(RecordingError, match=why):
        read_generic(path)


NOW = 1_796_000_000.0  # 2026-12-01T01:33:20Z: the recordings below end before it


@pytest.mark.parametrize("row, why", [
    ("nan,a,gpu_util_pct,3", r"row 3: timestamp 'nan' is not a time"),
    ("-inf,a,gpu_util_pct,3", r"row 3: timestamp '-inf' is not a time"),
    ("1795996800000,a,gpu_util_pct,3", r"row 3: timestamp '1795996800000' is after now .*milliseconds\?"),
    ("1795996800000000,a,gpu_util_pct,3", r"row 3: timestamp '1795996800000000' is after now .*microseconds\?"),
    ("2027-06-01T00:00:00+00:00,a,gpu_util_pct,3", r"row 3: timestamp '2027-06-01T00:00:00\+00:00' is after now"),
])
def test_a_time_that_is_no_time_or_yet_to_come_is_refused_with_its_row(tmp_path, row, why):
    """Before, NaN and infinite times failed later, at the shift, with Python's own words, and a
    recording in milliseconds was read as seconds ~57,000 years ahead: shifted to end now, its
    readings a minute apart stood 1000 minutes apart, each counted as 120 s."""
    path = tmp_path / "fleet.csv"
    path.write_text(f"timestamp,container,metric,value\n1795996740,a,gpu_util_pct,1\n{row}\n")
    with pytest.raises(RecordingError, match=why):
        read_generic(path, now=NOW)


def test_a_second_different_value_for_one_time_is_refused_and_the_same_one_is_taken_once(tmp_path):
    """Before, the later row silently replaced the earlier; a row repeated as it was (an export
    that overlaps another) still reads."""
    path = tmp_path / "fleet.csv"
    path.write_text("timestamp,container,metric,value\n1795996800,a,gpu_util_pct,10\n1795996860,a,gpu_util_pct,20\n"
                    "1795996800,a,gpu_util_pct,10\n")
    assert read_generic(path, now=NOW)["a"]["gpu_util_pct"] == {1795996800.0: 10.0, 1795996860.0: 20.0}
    path.write_text("timestamp,container,metric,value\n1795996800,a,gpu_util_pct,10\n1795996800,a,gpu_util_pct,70\n")
    with pytest.raises(RecordingError, match=r"row 3: a second gpu_util_pct of container 'a' at '1795996800' \(70.0, "
                                             r"after 10.0\)"):
        read_generic(path, now=NOW)


@pytest.fixture
def india_time(monkeypatch):
    """The process's local time zone five and a half hours east of UTC."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_an_iso_time_without_its_offset_is_utc_wherever_the_replay_runs(tmp_path, india_time):
    """Before, it was the local time of the machine that replayed it: the same file's windows
    moved by that machine's offset (and by half an hour off the hour, here)."""
    assert time.localtime(0).tm_gmtoff == 19_800  # (the zone is in force)
    path = tmp_path / "fleet.csv"
    path.write_text("timestamp,container,metric,value\n2026-11-30T00:00:00,a,gpu_util_pct,10\n"
                    "2026-11-30T00:01:00+00:00,a,gpu_util_pct,20\n")
    assert list(read_generic(path, now=NOW)["a"]["gpu_util_pct"]) == [1795996800.0, 1795996860.0]


def test_the_alibaba_layout_refuses_a_time_that_is_no_time_with_its_file_and_row(tmp_path):
    (tmp_path / "pod_gpu_duty_cycle_anon.tar.gz").write_bytes(
        _duty_cycles("timestamp_anon,value,container_ip\n1662858720,12.5,10.0.0.1\nnan,3,10.0.0.1\n"))
    with pytest.raises(RecordingError, match=r"pod_gpu_duty_cycle_anon.tar.gz: row 3: timestamp 'nan' is not a time"):
        read_alibaba(tmp_path, now=NOW)


def test_containers_named_alike_stay_replicas_of_their_own(tmp_path):
    """Kubernetes names a deployment's pods alike for their first 20 to 30 characters. Before, the
    ids kept 24 characters of a container's name (the host 12): two pods of ``sd-xl-serving`` were
    one workflow on one host's one GPU, read twice at each time: one replica where there were two."""
    pods = ("sd-xl-serving-6d8f9c7b5d-abcde", "sd-xl-serving-6d8f9c7b5d-fghij")
    path = tmp_path / "fleet.csv"
    path.write_text("timestamp,container,metric,value\n" + "".join(f"1795996800,{p},gpu_util_pct,40\n" for p in pods))
    gpu = [r for _, batch in records(read_generic(path, now=NOW), 3600, "sd-xl") for name, r in batch
           if name == "GpuSample"]
    assert sorted(r["workflow_id"] for r in gpu) == [f"replay-{p}" for p in pods]
    assert len({r["host"] for r in gpu}) == len({r["gpu_uuid"] for r in gpu}) == 2


@pytest.mark.parametrize("container, why", [
    ("", "row 2: no container"),
    ('"pod\na"', (r"row 2: container 'pod\\na' cannot name a replica: workflow_id 'replay-pod\\na' has the "
                  r"character U\+000A")),
    ("x" * 250, r"row 2: container 'x{60}…' cannot name a replica: workflow_id .* has 257 characters"),
])
def test_a_container_that_cannot_name_a_replica_is_refused_before_anything_is_sent(tmp_path, container, why):
    """Before, its every sample was sent, each a dead letter at the worker."""
    path = tmp_path / "fleet.csv"
    path.write_text(f"timestamp,container,metric,value\n1795996800,{container},gpu_util_pct,40\n")
    with pytest.raises(RecordingError, match=why):
        read_generic(path, now=NOW)


def _duty_cycles(csv_text: str) -> bytes:
    """A ``pod_gpu_duty_cycle_anon.tar.gz`` of ``csv_text``, as the trace publishes it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("pod_gpu_duty_cycle_anon.csv")
        info.size = len(csv_text)
        tar.addfile(info, io.BytesIO(csv_text.encode()))
    return buffer.getvalue()


@pytest.mark.parametrize("cut", [lambda data: b"not a tar file\n", lambda data: data[: len(data) * 2 // 3]],
                         ids=["not-a-tar", "truncated"])
def test_an_alibaba_file_that_is_no_tar_or_is_cut_short_is_named_with_why(tmp_path, cut):
    """Before, the CLI said "unexpected ReadError: ..." for the one, and for the other zlib's words
    alone, without the file's name."""
    rows = "".join(f"{1662858720 + 60 * i},{i % 100}.5,0a1b2c3d\n" for i in range(3000))
    data = _duty_cycles("timestamp_anon,value,container_ip\n" + rows)
    (tmp_path / "pod_gpu_duty_cycle_anon.tar.gz").write_bytes(cut(data))
    with pytest.raises(RecordingError, match=r"pod_gpu_duty_cycle_anon.tar.gz: cannot be read as the trace's "
                                             r"\.tar\.gz \(.+\)"):
        read_alibaba(tmp_path, now=NOW)


def reference(series, shift_s, service):
    """The records as the command first made them, all at once: every container's records put at
    their times, then sent time after time (each reading of traffic at the first GPU time at or
    after it)."""
    by_time = defaultdict(list)
    for name, metrics in series.items():
        times = sorted(metrics.get("gpu_util_pct", {}))
        if not times:
            continue
        period = statistics.median([b - a for a, b in itertools.pairwise(times)] or [60.0])
        closes = {}
        for metric in ("requests_per_s", "queue_time_ms"):
            closes[metric] = [[] for _ in times]
            for t, v in sorted(metrics.get(metric, {}).items()):
                i = next((k for k, u in enumerate(times) if u >= t), None)
                if i is not None:
                    closes[metric][i].append(v)
        for i, t in enumerate(times):
            at = int((t + shift_s) * 1000)
            gap = MAX_INTERVAL_S if i + 1 == len(times) else min(times[i + 1] - t, MAX_INTERVAL_S)
            since = period if i == 0 else min(t - times[i - 1], MAX_INTERVAL_S)
            queues = closes["queue_time_ms"][i]
            by_time[at] += [("GpuSample", (name, int(gap * 1000), metrics["gpu_util_pct"][t])),
                            ("ServingSample", (name, int(since * 1000), sum(closes["requests_per_s"][i]) * period,
                                               statistics.fmean(queues) if queues else None))]
    return [(at, by_time[at]) for at in sorted(by_time)]


def told(ticks):
    """What a tick's records say, as the reference puts it."""
    return [(at, [(schema, (r["workflow_id"].removeprefix("replay-"), r["interval_ms"], r["utilization_pct"])
                   if schema == "GpuSample" else
                   (r["workflow_id"].removeprefix("replay-"), r["interval_ms"], r["requests"],
                    r["queue_time_ms"])) for schema, r in batch]) for at, batch in ticks]


readings = st.dictionaries(st.integers(0, 900), st.floats(0, 100, allow_nan=False), max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["pod-b", "pod-a", "pod-c"]),
                       st.fixed_dictionaries({"gpu_util_pct": readings},
                                             optional={"requests_per_s": readings, "queue_time_ms": readings}),
                       max_size=3))
def test_the_records_made_as_they_are_sent_are_those_made_all_at_once(series):
    """Made time after time from each container's readings (never all held), the records are
    the same, in the same order, as those the command made all at once."""
    series = {n: {m: {float(t): v for t, v in values.items()} for m, values in metrics.items()}
              for n, metrics in series.items()}
    assert told(records(series, 3600.0, "chat")) == reference(series, 3600.0, "chat")


def test_a_csv_saved_with_a_byte_order_mark_and_crlf_lines_reads_as_any_other(tmp_path):
    """Spreadsheets and Windows tools save UTF-8 with a byte order mark first. Before, its header
    was refused as not ``timestamp,container,metric,value``, which it reads as."""
    path = tmp_path / "fleet.csv"
    path.write_bytes(b"\xef\xbb\xbftimestamp,container,metric,value\r\n1795996800,pod-a,gpu_util_pct,10\r\n")
    assert read_generic(path, now=NOW) == {"pod-a": {"gpu_util_pct": {1795996800.0: 10.0}}}


@pytest.mark.parametrize("data, why", [
    (b"timestamp,container,metric,value\n1795996800,caf\xe9,gpu_util_pct,10\n",
     r"not UTF-8 text \(the byte b'\\xe9', in the rows after row 1\): save it as UTF-8"),
    (b"timestamp,container,metric,value\n1795996800,a,gpu_util_pct,10\n1795996860,\"" + b"x" * 200_000 + b"\",g,1\n",
     r"row 3: not CSV \(field larger than field limit"),
])
def test_a_file_that_is_not_utf8_csv_is_refused_with_why(tmp_path, data, why):
    """Before, the command said "unexpected UnicodeDecodeError" or "unexpected Error", without the file."""
    path = tmp_path / "fleet.csv"
    path.write_bytes(data)
    with pytest.raises(RecordingError, match=why):
        read_generic(path, now=NOW)
