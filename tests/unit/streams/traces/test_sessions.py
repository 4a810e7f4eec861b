import json

import pytest

from schemas.records.trace_end import PROFILE_SYSTEM_CONTEXT
from streams.traces.analyze import analyze_events
from streams.traces.sessions import TraceSessionConfig, TraceSessions
from tests.support.kernel_events import end, kernel_events

CFG = TraceSessionConfig(timeout_ms=1000, done_retention_ms=5000)


def test_marker_ends_the_trace_with_the_offline_result():
    store: dict = {}
    sessions = TraceSessions(CFG, store)
    events = kernel_events()
    r = sessions.apply(0, events + [end()], now_ms=10)
    assert len(r.analyses) == 1
    a = r.analyses[0]
    offline = analyze_events([e for _, e in events])
    assert a["gpu_events"] == offline["gpu_events"] == 20
    assert a["kernel_time_us"] == offline["temporal"]["kernel_time_us"]
    assert a["launches"] == 20 and not a["partial"] and a["error"] is None and a["rank"] == 1
    assert store["wf/t.json"]["done"] and a["system"] is None


def test_the_hosts_view_of_a_requested_profile_travels_from_the_marker_to_the_analysis():
    system = {**dict.fromkeys(f.name for f in PROFILE_SYSTEM_CONTEXT.fields),  # as a TraceEnd decodes
              "ticks": 3, "span_ms": 300, "gpus": 2, "host_cpu_mean_pct": 99.0}
    r = TraceSessions(CFG, {}).apply(0, kernel_events() + [end(system=system)], now_ms=10)
    assert r.analyses[0]["system"] == system


def test_the_flops_the_trace_counted_become_its_mfu():
    # 20 kernels over 1,960 us of GPU timeline (the first starts at 10, the last ends at 1,960)
    r = TraceSessions(CFG, {}).apply(0, kernel_events() + [end(flops={"bf16": 989_500_000_000 // 1000,
                                                                          "fp32": 1000}, gpu_name="NVIDIA H200")],
                                     now_ms=10)
    a = r.analyses[0]
    assert (a["gpu_name"], a["model_flops_precision"], a["peak_tflops"]) == ("NVIDIA H200", "bf16", 989.5)
    assert a["mfu_pct"] == pytest.approx(100 * (989_500_000 + 1000) / 1.95e-3 / 989.5e12)


def test_restart_mid_trace_resumes_from_the_store_and_skips_replays():
    store: dict = {}
    events = kernel_events()
    TraceSessions(CFG, store).apply(0, events[:25], now_ms=1)
    restored = json.loads(json.dumps(store))  # the changelog, read back by a new worker
    sessions = TraceSessions(CFG, restored)
    r = sessions.apply(0, events[20:] + [end()], now_ms=2)  # 20..24 are replays
    assert r.replayed == 5
    whole = TraceSessions(CFG, {}).apply(0, events + [end()], now_ms=2).analyses[0]
    assert r.analyses[0] == whole


def test_missing_events_make_the_analysis_partial():
    events = kernel_events()
    r = TraceSessions(CFG, {}).apply(0, events[:10] + events[12:] + [end()], now_ms=1)
    a = r.analyses[0]
    assert a["partial"] and "2 events never arrived" in a["error"]


def test_a_damaged_trace_stays_partial_with_its_reason():
    r = TraceSessions(CFG, {}).apply(
        0, kernel_events(n=2) + [end(events=4, partial=True, error="trace damaged after 9 events")], now_ms=1
    )
    assert r.analyses[0]["partial"] and "damaged" in r.analyses[0]["error"]


def test_silent_trace_times_out_and_done_markers_expire():
    store: dict = {}
    sessions = TraceSessions(CFG, store)
    sessions.apply(0, kernel_events()[:10], now_ms=0)
    assert sessions.expire(now_ms=500).analyses == []
    r = sessions.expire(now_ms=1500)
    assert len(r.analyses) == 1 and "no end-of-trace marker within 1 s" in r.analyses[0]["error"]
    # A late tail of the ended trace does not reopen it.
    assert sessions.apply(0, kernel_events()[10:], now_ms=1600).replayed == 30
    assert sessions.expire(now_ms=7000).removed == {"wf/t.json": 0} and store == {}


@pytest.mark.parametrize("batch", [1, 7, 1000])
def test_the_worker_gives_the_offline_record_for_a_trace_of_overlapping_copies_batched_any_way(tmp_path, batch):
    """Copies that end in the same microsecond are counted in the file's order (KernelEvent v3's
    ``trace_order``), through Avro and a checkpoint restored halfway: the stream's record is
    ``gpufleet analyze``'s, field for field."""
    from gpufleet.analyze import analyze_file
    from producers.traces.publish import kernel_event_records
    from producers.traces.read import read_trace
    from schemas.codec import Codec
    from tests.support.overlapping_copies import overlapping_copies_trace

    codec = Codec()
    path = overlapping_copies_trace(tmp_path / "t.json", seed=2, copies_per_stream=120, kernels=200)
    trace = read_trace(path)
    wire = [codec.decode(codec.encode("KernelEvent", r)) for r in kernel_event_records(trace, "wf/t.json", "wf")]
    marker = end(events=len(wire))
    marker[1].update(rank=trace.rank, source=str(path), events_read=trace.events_seen)
    store: dict = {}
    analyses = []
    half = len(wire) // 2
    for first in range(0, len(wire), batch):
        if first <= half < first + batch:
            store = json.loads(json.dumps(store))  # the changelog, read back by a new worker
        analyses += TraceSessions(CFG, store).apply(0, wire[first:first + batch], now_ms=1).analyses
    analyses += TraceSessions(CFG, store).apply(0, [marker], now_ms=1).analyses
    (streamed,) = analyses
    offline = analyze_file(path, workflow_id="wf", trace_id="wf/t.json")
    assert any(m["kind"] == "Memcpy DtoD" and m["bw_samples"] > 100 for m in offline["memory_copies"])
    for field in ("memory_copies", "queue_lengths", "idle_by_stream", "kernel_time_us", "gpu_events"):
        assert streamed[field] == offline[field], field


@pytest.mark.parametrize("size", [1, 7, 1000])
def test_the_worker_gives_the_offline_record_for_column_messages_of_any_size_and_a_replay(tmp_path, size):
    """A trace published as KernelEventColumns messages of ``size`` events, through Avro, the
    worker restarted from its changelog halfway and the messages around the cut sent again
    cut differently (a replay that straddles what was seen): every field of the stream's record
    is ``gpufleet analyze``'s."""
    from gpufleet.analyze import analyze_file
    from producers.traces.publish import kernel_event_columns
    from producers.traces.read import read_trace
    from schemas.codec import Codec
    from tests.support.traces import synthetic_job_trace

    codec = Codec()
    path = synthetic_job_trace(tmp_path / "t.json")  # streams, NCCL, steps, copies

    def wire(n):
        return [codec.decode(codec.encode("KernelEventColumns", r))
                for r in kernel_event_columns(trace, "wf/t.json", "wf", size=n)]

    trace = read_trace(path)
    messages = wire(size)
    marker = end(events=len(trace.events))
    marker[1].update(rank=trace.rank, source=str(path), events_read=trace.events_seen, gpu_name=trace.gpu_name,
                     flops=trace.flops or None)
    store: dict = {}
    half = len(messages) // 2
    r = TraceSessions(CFG, store).apply(0, messages[:half + 1], now_ms=1)
    store = json.loads(json.dumps(store))  # the changelog, read back by a new worker
    seen = store["wf/t.json"]["next_seq"]
    again = [m for m in wire(5) if m[1]["first_seq"] + len(m[1]["ts"]) > seen - 12]  # from before the cut
    r = TraceSessions(CFG, store).apply(0, again + [marker], now_ms=1)
    (streamed,) = r.analyses
    offline = analyze_file(path, workflow_id="wf", trace_id="wf/t.json")
    assert r.replayed >= 2 and not streamed["partial"] and streamed["error"] is None
    assert {k: v for k, v in streamed.items() if k != "analyzed_at"} == \
        {k: v for k, v in offline.items() if k != "analyzed_at"}


def test_column_messages_that_do_not_hold_together_are_refused_with_the_reason():
    from streams.traces.batch import columns_error, event_error

    good = {"first_seq": 0, "strings": ["kernel", "gemm"], "kind": ["kernel"] * 2, "cat": [0, 0], "name": [1, 1],
            "ts": [1, 2], "dur": [1, 1], "stream": [7, 7], "device": [0, 0], "correlation": [1, 2], "tid": [-1, -1],
            "extras": [{"row": 1, "bytes": 8}]}
    assert columns_error(good) is None
    assert event_error({"ts": 2**53 - 1, "dur": 5}) is None
    assert event_error({"ts": 1, "dur": 2**60}) == ("KernelEvent with a duration of 1152921504606846976 us, beyond "
                                                    "the ±2**53 us (285 years) a trace's times are read in")
    cases = {
        "dur": ({"dur": [1]}, "KernelEventColumns with 2 events but 1 values of dur"),
        "name": ({"name": [1, 2]}, "KernelEventColumns refers to string 2 of name, of 2 strings"),
        "cat": ({"cat": [-1, 0]}, "KernelEventColumns refers to string -1 of cat, of 2 strings"),
        "row": ({"extras": [{"row": 2}]}, "KernelEventColumns has extras for row 2 of 2 events"),
        "seq": ({"first_seq": -3}, "KernelEventColumns with first_seq -3 (seq counts from 0)"),
        "start": ({"ts": [1, 2**62]}, ("KernelEventColumns with a start of 4611686018427387904 us, beyond the "
                                       "±2**53 us (285 years) a trace's times are read in")),
        "duration": ({"dur": [-2**53, 1]}, ("KernelEventColumns with a duration of -9007199254740992 us, beyond "
                                            "the ±2**53 us (285 years) a trace's times are read in")),
        "empty": ({k: [] for k in ("kind", "cat", "name", "ts", "dur", "stream", "device", "correlation", "tid")},
                  "KernelEventColumns with no event"),
    }
    for change, reason in cases.values():
        assert columns_error({**good, **change}) == reason
