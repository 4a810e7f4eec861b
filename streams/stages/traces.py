"""The trace stage: kernel events of profiler traces, one session per trace (a rank's trace),
analysed in one pass as they come (``streams.traces.sessions``, ``streams.traces.analyze``,
``streams.traces.antipatterns``, ``streams.traces.rules``) -> ``TraceAnalysis`` and ``Finding``
records; for a requested profile also its ``ProfileResult`` (back to the window stage, for the
alert's root cause) and an ANALYSED status for the requester. This module reads the topic and
sends; the decisions are ``streams.stages.trace_step``'s."""

from __future__ import annotations

import logging
import time

import faust

from schemas.codec import Codec
from schemas.topics import DEAD_LETTERS, FINDINGS, KERNEL_EVENTS, PROFILE_RESULTS, PROFILE_STATUSES, TRACE_ANALYSES
from streams.settings import StreamSettings
from streams.stages.io import by_partition, topic_of
from streams.stages.state import StageState
from streams.stages.trace_step import TraceOutput, TraceStep
from streams.stages.window_step import Decoded
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
        self.step = TraceStep(self.sessions)  # the decisions, plain
        self.topics = {spec.name: t for spec, t in (
            (TRACE_ANALYSES, self.analyses_topic), (FINDINGS, self.findings_topic),
            (PROFILE_STATUSES, self.statuses_topic), (PROFILE_RESULTS, self.results_topic))}
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
                    ok, errors = self.codec.decode_many([m.value for m in messages])
                    out = self.step.events(partition, [Decoded(i, name, r) for i, name, r in ok], now)
                    out.dead[:0] = errors
                    await self.emit(messages, out, now)

    async def expire(self) -> None:
        """Sessions without events for the configured time end (analysed as partial)."""
        if self.app.rebalancing:  # the table is being restored
            return
        async with self.state.batch():
            now = int(time.time() * 1000)
            await self.emit([], self.step.expire(now), now)

    async def emit(self, messages: list, out: TraceOutput, now: int) -> None:
        """Inside a batch: the step's dead letters, then its records in order, then the sessions'
        states marked changed: a state that says a trace is done makes a new owner skip its
        events, so the commit writes it only once the analysis is durable (``streams.stages.state``)."""
        for index, reason in out.dead:
            await self.state.dead_letter(self.dlq_topic, messages[index], reason, now)
        for spec, record in out.records:
            if spec is TRACE_ANALYSES:
                log.info("trace %s analysed (%d events%s)", record["trace_id"], record["events"],
                         ", partial" if record["partial"] else "")
            await self.state.send(self.topics[spec.name], spec, record)
        for tid, partition in out.changed.items():
            self.state.changed(self.table, tid, partition)


def register(app: faust.App, settings: StreamSettings, codec: Codec) -> None:
    """The trace stage's agent, timer and table on ``app``."""
    TraceStage(app, settings, codec).register()
