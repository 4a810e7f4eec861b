"""The trace stage: kernel events of profiler traces, one session per trace (a rank's trace),
analysed in one pass as they come (``trace_sessions``, ``analyze_trace``,
``trace_antipatterns``) -> ``TraceAnalysis`` and ``Finding`` records; for a requested profile
also its ``ProfileResult`` (back to the window stage, for the alert's root cause) and an
ANALYSED status for the requester."""

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
from streams.root_cause import profile_result
from streams.stage_io import by_partition, drop_unowned, send, send_dead_letter
from streams.trace_sessions import TraceSessions

log = logging.getLogger(__name__)

STAGE = "trace-analysis"


def register(app: faust.App, settings, codec: Codec) -> None:  # settings: streams.app.StreamSettings
    """The trace stage's agent, timer and table on ``app``."""
    events_topic = app.topic(settings.topic(KERNEL_EVENTS.name), partitions=settings.trace_partitions)
    analyses_topic = app.topic(settings.topic(TRACE_ANALYSES.name))
    findings_topic = app.topic(settings.topic(FINDINGS.name))
    statuses_topic = app.topic(settings.topic(PROFILE_STATUSES.name))
    results_topic = app.topic(settings.topic(PROFILE_RESULTS.name))
    dlq_topic = app.topic(settings.topic(DEAD_LETTERS.name))
    # One entry per trace; the changelog partition is the trace's source partition.
    table = app.Table("trace-state", default=None, partitions=settings.trace_partitions, key_type=str)
    sessions = TraceSessions(settings.trace_sessions, table.data)

    @app.on_partitions_assigned.connect
    async def _forget(sender, assigned: set, **kwargs) -> None:
        """Traces of partitions now owned elsewhere are dropped: their new owner goes on with them."""
        name = events_topic.get_topic_name()
        drop_unowned(table.data, {tp.partition for tp in assigned if tp.topic == name}, {})

    @app.on_rebalance_complete.connect
    async def _reindex_restored(sender, **kwargs) -> None:
        sessions.forget()  # its indexes are built again from the restored table

    async def persist_and_emit(result) -> None:
        for tid in result.changed:
            state = table.data[tid]
            table.send_changelog(state["partition"], tid, state)
        for tid, partition in result.removed.items():
            table.send_changelog(partition, tid, None)
        for analysis in result.analyses:
            log.info("trace %s analysed (%d events%s)", analysis["trace_id"], analysis["events"],
                     ", partial" if analysis["partial"] else "")
            await send(codec, analyses_topic, TRACE_ANALYSES, analysis)
        for finding in result.findings:
            await send(codec, findings_topic, FINDINGS, finding)
        for analysis in result.analyses:  # a requested profile: its result, and the requester told
            origin = request_of_trace(analysis["trace_id"])
            if origin is not None:
                request_id, host, rank = origin
                now = int(time.time() * 1000)
                findings = [f for f in result.findings if f["trace_id"] == analysis["trace_id"]]
                await send(codec, results_topic, PROFILE_RESULTS,
                            profile_result(analysis, findings, request_id, host, rank, now))
                await send(codec, statuses_topic, PROFILE_STATUSES, {
                    "request_id": request_id, "workflow_id": analysis["workflow_id"], "host": host, "rank": rank,
                    "pid": None, "state": "ANALYSED", "reason": analysis.get("error"),
                    "trace_id": analysis["trace_id"], "at": now})

    @app.agent(events_topic, name="trace-analysis")
    async def analyze_traces(stream: faust.StreamT) -> None:
        async for events in stream.take_events(settings.batch_size, within=settings.batch_within_s):
            now = int(time.time() * 1000)
            for partition, messages in by_partition(events).items():
                ok, errors = codec.decode_many([m.value for m in messages])
                records = []
                for i, name, record in ok:
                    if not KERNEL_EVENTS.carries(name):
                        errors.append((i, f"expected KernelEvent or TraceEnd, got {name}"))
                    elif reason := ids_error(record):
                        errors.append((i, reason))
                    else:
                        records.append((name, record))
                for i, reason in errors:
                    await send_dead_letter(codec, dlq_topic, STAGE, messages[i], reason, now)
                await persist_and_emit(sessions.apply(partition, records, now))

    @app.timer(interval=settings.trace_sessions.timeout_ms / 4000)
    async def _expire() -> None:
        if app.rebalancing:  # the table is being restored
            return
        await persist_and_emit(sessions.expire(int(time.time() * 1000)))
