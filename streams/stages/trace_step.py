"""The trace stage's decisions as plain steps: a partition's decoded messages of the kernel-events
topic (and the timer's expiry) in; the records to send, in the order to send them, the dead
letters and the trace sessions whose state changed, out.

``streams.stages.traces`` reads the topic, calls a step inside its batch and sends what it
returns (records before state: ``streams.stages.state``); everything decided here is tested
without a broker or an app (``tests/unit/streams/stages/test_trace_step.py``).

- ``events``: kernel events (one by one or as columns) and trace ends into each rank's session;
  a message of another kind, with a hostile id or with events its schema cannot vouch for is a
  dead letter with the reason.
- ``expire``: sessions without events for the configured time end, analysed as partial.

For each analysis: the ``TraceAnalysis``, then the findings, then, for a requested profile, its
``ProfileResult`` (back to the window stage, for the alert's root cause) and an ANALYSED status
for the requester.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.topics import (
    FINDINGS,
    KERNEL_EVENTS,
    PROFILE_RESULTS,
    PROFILE_STATUSES,
    TRACE_ANALYSES,
    TopicSpec,
    request_of_trace,
)
from schemas.validate_ids import ids_error
from streams.profiling.root_cause import profile_result
from streams.stages.window_step import Decoded
from streams.traces.batch import columns_error, event_error
from streams.traces.sessions import TraceSessions


@dataclass
class TraceOutput:
    """What a step decided, in the order it is sent."""

    records: list[tuple[TopicSpec, dict]] = field(default_factory=list)
    dead: list[tuple[int, str]] = field(default_factory=list)  # (the message's index in the batch, why)
    changed: dict[str, int] = field(default_factory=dict)  # trace id -> its state's partition (changed or gone)

    def of(self, spec: TopicSpec) -> list[dict]:
        return [r for s, r in self.records if s is spec]


class TraceStep:
    def __init__(self, sessions: TraceSessions) -> None:
        self.sessions = sessions

    def events(self, partition: int, batch: list[Decoded], now: int) -> TraceOutput:
        """A partition's decoded messages: the usable ones into their sessions."""
        out, usable = TraceOutput(), []
        for d in batch:
            if not KERNEL_EVENTS.carries(d.name):
                out.dead.append((d.index, f"expected KernelEventColumns, KernelEvent or TraceEnd, got {d.name}"))
            elif reason := ids_error(d.record) or _events_error(d.name, d.record):
                out.dead.append((d.index, reason))
            else:
                usable.append((d.name, d.record))
        self._emit(out, self.sessions.apply(partition, usable, now), now)
        return out

    def expire(self, now: int) -> TraceOutput:
        """The sessions without events for the configured time, ended and analysed as partial."""
        out = TraceOutput()
        self._emit(out, self.sessions.expire(now), now)
        return out

    def _emit(self, out: TraceOutput, result, now: int) -> None:
        out.records += [(TRACE_ANALYSES, analysis) for analysis in result.analyses]
        out.records += [(FINDINGS, finding) for finding in result.findings]
        for analysis in result.analyses:  # a requested profile: its result, and the requester told
            origin = request_of_trace(analysis["trace_id"])
            if origin is None:
                continue
            request_id, host, rank = origin
            mine = [f for f in result.findings if f["trace_id"] == analysis["trace_id"]]
            out.records.append((PROFILE_RESULTS, profile_result(analysis, mine, request_id, host, rank, now)))
            out.records.append((PROFILE_STATUSES, {
                "request_id": request_id, "workflow_id": analysis["workflow_id"], "host": host, "rank": rank,
                "pid": None, "state": "ANALYSED", "reason": analysis.get("error"),
                "trace_id": analysis["trace_id"], "at": now}))
        for tid in result.changed:
            out.changed[tid] = self.sessions.store[tid]["partition"]
        out.changed.update(result.removed)


def _events_error(name: str, record: dict) -> str | None:
    """What is wrong with the events of a message that its schema cannot say, or None."""
    if name == "KernelEventColumns":
        return columns_error(record)
    return event_error(record) if name == "KernelEvent" else None
