"""The trace stage: kernel events of profiler traces, one session per trace (a rank's trace),
analysed in one pass as they come (``streams.traces.sessions``, ``streams.traces.analyze``,
``streams.traces.antipatterns``, ``streams.traces.rules``) -> ``TraceAnalysis`` and ``Finding``
records; for a requested profile also its ``ProfileResult`` (back to the window stage, for the
alert's root cause) and an ANALYSED status for the requester."""

from __future__ import annotations

import logging
import time

import faust

from schemas.codec import Codec
from schemas.topics import (
    DEAD_LETTERS,
    FINDINGS,
    KERNEL_EVENTS,
    PROFILE_RESULTS,
    PROFILE_STATUSES,
    TRACE_ANALYSES,
    request_of_trace,
)
from schemas.validate_ids import ids_error
from streams.profiling.root_cause import profile_result
from streams.settings import StreamSettings
from streams.stages.io import by_partition, topic_of
from streams.stages.state import StageState
from streams.traces.batch import columns_error, event_error
from streams.traces.sessions import TraceSessions

log = logging.getLogger(__name__)

STAGE = "trace-analysis"


class TraceStage:
    def __init__(self, app: faust.App, settings: StreamSettings, codec: Codec) -> None:
        self.app, self.settings, self.codec = app, settings, codec

        def topic(spec, **kwargs):
            return topic_of(app, settings, spec, **kwargs)

        self.events_topic = topic(KERNEL_EVENTS, partitions=settings.trace_partitions)
        self.analyses_topic, self.findings_topic = topic(TRACE_ANALYSES), topic(FINDINGS)
        self.statuses_topic, self.results_topic = topic(PROFILE_STATUSES), topic(PROFILE_RESULTS)
        self.dlq_topic = topic(DEAD_LETTERS)
        # One entry per trace; the changelog partition is the trace's source partition.
        self.table = app.Table("trace-state", default=None, partitions=settings.trace_partitions, key_type=str)
        self.sessions = TraceSessions(settings.trace_sessions, self.table.data, settings.thresholds.default)
        self.state = StageState(app, STAGE, codec)
        self.state.table(self.table)

    def register(self) -> None:
        app = self.app
        app.on_rebalance_complete.connect(self.on_rebalance_complete)
        app.agent(self.events_topic, name=STAGE)(self.kernel_events)
        app.timer(interval=self.settings.trace_sessions.timeout_ms / 4000)(self.expire)

    async def on_rebalance_complete(self, sender, **kwargs) -> None:
        self.sessions.forget()  # its indexes are built again from the restored table

    async def kernel_events(self, stream: faust.StreamT) -> None:
        async for events in stream.take_events(self.settings.batch_size, within=self.settings.batch_within_s):
            now = int(time.time() * 1000)
            for partition, messages in by_partition(events).items():
                async with self.state.batch():
                    records = await self._usable(messages, now)
                    await self._persist_and_emit(self.sessions.apply(partition, records, now))

    async def expire(self) -> None:
        """Sessions without events for the configured time end (analysed as partial)."""
        if self.app.rebalancing:  # the table is being restored
            return
        async with self.state.batch():
            await self._persist_and_emit(self.sessions.expire(int(time.time() * 1000)))

    async def _usable(self, messages: list, now: int) -> list[tuple[str, dict]]:
        """The kernel events and trace ends of ``messages``; the rest are dead letters."""
        ok, errors = self.codec.decode_many([m.value for m in messages])
        records = []
        for i, name, record in ok:
            if not KERNEL_EVENTS.carries(name):
                errors.append((i, f"expected KernelEventColumns, KernelEvent or TraceEnd, got {name}"))
            elif reason := ids_error(record) or _events_error(name, record):
                errors.append((i, reason))
            else:
                records.append((name, record))
        for i, reason in errors:
            await self.state.dead_letter(self.dlq_topic, messages[i], reason, now)
        return records

    async def _persist_and_emit(self, result) -> None:
        """The analyses, findings and results, then the sessions' states marked changed: a
        state that says a trace is done makes a new owner skip its events, so the commit writes
        it only once the analysis is durable (``streams.stages.state``)."""
        for analysis in result.analyses:
            log.info("trace %s analysed (%d events%s)", analysis["trace_id"], analysis["events"],
                     ", partial" if analysis["partial"] else "")
            await self.state.send(self.analyses_topic, TRACE_ANALYSES, analysis)
        for finding in result.findings:
            await self.state.send(self.findings_topic, FINDINGS, finding)
        for analysis in result.analyses:  # a requested profile: its result, and the requester told
            await self._report_to_requester(analysis, result.findings)
        for tid in result.changed:
            self.state.changed(self.table, tid, self.table.data[tid]["partition"])
        for tid, partition in result.removed.items():
            self.state.changed(self.table, tid, partition)

    async def _report_to_requester(self, analysis: dict, findings: list[dict]) -> None:
        origin = request_of_trace(analysis["trace_id"])
        if origin is None:
            return
        request_id, host, rank = origin
        now = int(time.time() * 1000)
        mine = [f for f in findings if f["trace_id"] == analysis["trace_id"]]
        await self.state.send(self.results_topic, PROFILE_RESULTS,
                              profile_result(analysis, mine, request_id, host, rank, now))
        await self.state.send(self.statuses_topic, PROFILE_STATUSES, {
            "request_id": request_id, "workflow_id": analysis["workflow_id"], "host": host, "rank": rank,
            "pid": None, "state": "ANALYSED", "reason": analysis.get("error"),
            "trace_id": analysis["trace_id"], "at": now})


def _events_error(name: str, record: dict) -> str | None:
    """What is wrong with the events of a message that its schema cannot say, or None."""
    if name == "KernelEventColumns":
        return columns_error(record)
    return event_error(record) if name == "KernelEvent" else None


def register(app: faust.App, settings: StreamSettings, codec: Codec) -> None:
    """The trace stage's agent, timer and table on ``app``."""
    TraceStage(app, settings, codec).register()
