"""The trace stage's decisions, called directly (``streams.stages.trace_step``: sessions and a
batch in, records out, no app and no broker): what is a dead letter, what an analysis sends and
in which order, and what the timer ends."""

from __future__ import annotations

from schemas.topics import FINDINGS, PROFILE_RESULTS, PROFILE_STATUSES, TRACE_ANALYSES, trace_id_of
from streams.stages.trace_step import TraceStep
from streams.stages.window_step import Decoded
from streams.traces.sessions import TraceSessionConfig, TraceSessions
from tests.support.kernel_events import end, kernel_events

CFG = TraceSessionConfig(timeout_ms=1000, done_retention_ms=5000)


def decoded(records: list[tuple[str, dict]]) -> list[Decoded]:
    return [Decoded(i, name, record, i) for i, (name, record) in enumerate(records)]


def test_what_cannot_be_analysed_is_a_dead_letter_and_the_rest_is_analysed():
    store: dict = {}
    step = TraceStep(TraceSessions(CFG, store))
    events = kernel_events()
    hostile = ("KernelEvent", {**events[0][1], "workflow_id": "wf\nrm -rf /"})
    out = step.events(0, decoded([("WorkflowEvent", {"workflow_id": "wf"}), hostile, *events, end()]), now=10)
    assert [i for i, _ in out.dead] == [0, 1]
    assert "expected KernelEventColumns, KernelEvent or TraceEnd, got WorkflowEvent" in out.dead[0][1]
    assert "U+000A" in out.dead[1][1]
    analysis, = out.of(TRACE_ANALYSES)
    assert analysis["trace_id"] == "wf/t.json" and analysis["gpu_events"] == 20 and not analysis["partial"]
    assert out.of(PROFILE_RESULTS) == [] and out.of(PROFILE_STATUSES) == []  # nobody requested it
    assert out.changed == {"wf/t.json": 0} and store["wf/t.json"]["done"]


def test_a_requested_profile_sends_its_analysis_then_findings_then_the_requesters_result_and_status():
    tid = trace_id_of("req-7", "gpu-host-003", 1)
    step = TraceStep(TraceSessions(CFG, {}))
    out = step.events(2, decoded([*kernel_events(trace_id=tid), end(trace_id=tid)]), now=1234)
    kinds = [spec for spec, _ in out.records]
    assert kinds[0] is TRACE_ANALYSES and kinds[-2:] == [PROFILE_RESULTS, PROFILE_STATUSES]
    assert all(k is FINDINGS for k in kinds[1:-2])
    result, = out.of(PROFILE_RESULTS)
    assert (result["request_id"], result["host"], result["rank"]) == ("req-7", "gpu-host-003", 1)
    status, = out.of(PROFILE_STATUSES)
    assert status == {"request_id": "req-7", "workflow_id": "wf", "host": "gpu-host-003", "rank": 1, "pid": None,
                      "state": "ANALYSED", "reason": None, "trace_id": tid, "at": 1234}
    assert out.changed == {tid: 2}


def test_the_timer_ends_a_session_without_events_as_partial():
    step = TraceStep(TraceSessions(CFG, {}))
    assert step.events(1, decoded(kernel_events()[:30]), now=10).of(TRACE_ANALYSES) == []
    assert step.expire(now=500).of(TRACE_ANALYSES) == []  # within the timeout: it waits
    out = step.expire(now=10 + CFG.timeout_ms + 1)
    analysis, = out.of(TRACE_ANALYSES)
    assert analysis["partial"] and out.changed == {"wf/t.json": 1}
