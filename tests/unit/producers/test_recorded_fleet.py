"""A recorded fleet in the generic layout (``producers.serving.recorded``) as the records an agent
sends: GPU samples standing for the time to the next reading, serving samples for the time since
the one before, every time shifted alike; each record is the schema's."""

from __future__ import annotations

import pytest

from producers.serving.recorded import RecordingError, messages, read_generic, records, select
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
