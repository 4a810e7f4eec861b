"""The window stage: one state per workflow, fed by the three topics keyed and partitioned like
the GPU samples (so a workflow's samples, life cycle and profile results meet in this worker).

- **samples** (``window-utilization``): blocks are checked, added to event-time windows
  (``streams.windows.utilization``); a closed window is judged by the detectors, raises or resolves
  alerts, adds to the job's totals and may ask for a profile;
- **life cycle** (``workflow-life-cycle``): the agents' STARTED/HEARTBEAT/ENDED; a workflow
  whose every host said ENDED is ending, and is summarised once its last window closed;
- **profile results** (``root-cause``): an automatic profile's findings go into its alert;
- **timers**: what runs here, to the periodic scheduler; the newest event time of this
  worker's partitions, to every partition of the samples topic (``PartitionClock``), which
  quiet partitions follow.

The states change, and the records they lead to are sent, only inside the stage's batches
(``streams.stages.state``: the rule every stage keeps, in one place): a state records what it
has applied, and the commit writes it only after the records of every batch so far are
durable. At each rebalance the tables are restored as last written, for the partitions kept
as for those taken over.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import defaultdict

import faust
from faust.serializers import codecs
from faust.types import TP

from schemas.codec import Codec
from schemas.sample_columns import CLOCK
from schemas.topics import (
    ALERTS,
    DEAD_LETTERS,
    ENFORCEMENT,
    GPU_SAMPLES,
    PROFILE_REQUESTS,
    PROFILE_RESULTS,
    PROFILE_SCHEDULE,
    SERVING_WINDOWS,
    WORKFLOW_EVENTS,
    WORKFLOW_SUMMARIES,
    WORKFLOW_WINDOWS,
)
from streams import faust_fixes
from streams.settings import StreamSettings
from streams.stages.in_order import InOrder
from streams.stages.io import METRICS, by_partition, received_ms, topic_of
from streams.stages.state import StageState
from streams.stages.window_step import Decoded, Output, WindowStep
from streams.stages.window_table import STATE_CODEC, StateType

log = logging.getLogger(__name__)

# The window stage's own metrics, beside the worker's (``streams.stages.io.METRICS``).
SAMPLES_APPLIED = METRICS.counter("gpufleet_worker_samples", "GPU samples applied to event-time windows")
WINDOWS_CLOSED = METRICS.counter("gpufleet_windows_closed", "Workflow windows closed")
ALERTS_RAISED = METRICS.counter("gpufleet_alerts", "Alert transitions, by detector and status",
                                ["detector", "status"])

STAGE = "window-utilization"
LIFE_CYCLE = "workflow-life-cycle"
ROOT_CAUSE = "root-cause"
CLOCK_REPEAT_MS = 30_000  # a PartitionClock that did not move is sent again this often


class WindowStage:
    def __init__(self, app: faust.App, settings: StreamSettings, codec: Codec) -> None:
        self.app, self.settings, self.codec = app, settings, codec

        def topic(spec, **kwargs):
            return topic_of(app, settings, spec, **kwargs)

        self.samples_topic = topic(GPU_SAMPLES, partitions=settings.partitions)
        self.events_topic = topic(WORKFLOW_EVENTS, partitions=settings.partitions)
        self.results_topic = topic(PROFILE_RESULTS, partitions=settings.partitions)
        self.windows_topic, self.summaries_topic = topic(WORKFLOW_WINDOWS), topic(WORKFLOW_SUMMARIES)
        self.alerts_topic, self.requests_topic = topic(ALERTS), topic(PROFILE_REQUESTS)
        self.schedule_topic, self.dlq_topic = topic(PROFILE_SCHEDULE), topic(DEAD_LETTERS)
        self.enforcement_topic = topic(ENFORCEMENT)
        # One WorkflowState per workflow; the changelog partition is the workflow's source partition.
        self.table = app.Table("window-state", default=None, partitions=settings.partitions, key_type=str,
                               value_type=StateType)
        # Closed windows within the update horizon, for late samples: "<workflow>@<start>" -> window.
        self.history = app.Table("window-history", default=None, partitions=settings.partitions, key_type=str)
        self.step = WindowStep(settings, self.table.data, self.history.data)  # the decisions, plain
        self.aggregator = self.step.aggregator
        self.topics = {spec.name: topic for spec, topic in (
            (WORKFLOW_WINDOWS, self.windows_topic), (WORKFLOW_SUMMARIES, self.summaries_topic),
            (ALERTS, self.alerts_topic), (PROFILE_REQUESTS, self.requests_topic),
            (PROFILE_SCHEDULE, self.schedule_topic), (ENFORCEMENT, self.enforcement_topic),
            (SERVING_WINDOWS, topic(SERVING_WINDOWS)))}
        # The samples topic has no gaps in its offsets: a partition's messages are applied in order.
        self.samples_name = settings.topic(GPU_SAMPLES.name)
        faust_fixes.CONTIGUOUS.add(self.samples_name)
        self.in_order = InOrder()
        self.state = StageState(app, STAGE, codec)
        self.state.table(self.table, lambda value: codecs.dumps(STATE_CODEC, value))
        self.state.table(self.history, lambda value: codecs.dumps(self.history.value_serializer, value))
        self.lock = self.state.lock
        self.stats: dict[str, int] = defaultdict(int)
        self.quiet_ms = int(settings.idle_partition_s * 1000)
        self.worker_name = f"{socket.gethostname()}:{os.getpid()}"
        self.clock_sent = {"time": -1, "at": 0}  # the last PartitionClock this worker sent, and when

    def register(self) -> None:
        app, settings = self.app, self.settings
        app.on_rebalance_complete.connect(self.on_rebalance_complete)
        app.agent(self.samples_topic, name=STAGE)(self.samples)
        app.agent(self.events_topic, name=LIFE_CYCLE)(self.life_cycle)
        app.agent(self.results_topic, name=ROOT_CAUSE)(self.root_causes)
        app.timer(interval=settings.schedule.report_s)(self.report_running)
        app.timer(interval=max(1.0, settings.idle_partition_s / 4))(self.partition_clocks)
        app.timer(interval=10.0)(self.log_stats)

    # -- the state and its partitions -------------------------------------------------------

    def assigned(self) -> list[int]:
        """The partitions of the sample topics this worker owns now."""
        name = self.samples_topic.get_topic_name()
        return sorted(tp.partition for tp in self.app.consumer.assignment() if tp.topic == name)

    async def on_rebalance_complete(self, sender, **kwargs) -> None:
        """The tables are restored: the per-partition indexes (open windows, clocks) are built
        again from them when next used. Built earlier, during the restore, they would miss
        the windows restored after them, which would then never close. Each partition's
        messages are taken in order again from where the consumer is sought."""
        self.aggregator.forget_partitions()
        self.in_order.reset()

    # -- what a step decided, sent ------------------------------------------------------------

    async def emit(self, partition: int, messages: list, out: Output, now: int, stage: str = STAGE) -> None:
        """Inside a batch: the step's dead letters, then its records in order, then its state
        changes (written by the next commit, after the records: ``streams.stages.state``)."""
        for index, reason in out.dead:
            await self.state.dead_letter(self.dlq_topic, messages[index], reason, now, stage)
        for spec, record in out.records:
            await self.state.send(self.topics[spec.name], spec, record)
        for wf in out.changed:
            self.state.changed(self.table, wf, partition)
        for key in out.history:
            self.state.changed(self.history, key, partition)
        WINDOWS_CLOSED.inc(out.stats["windows"])
        SAMPLES_APPLIED.inc(out.stats["samples"])
        for alert in out.of(ALERTS):
            ALERTS_RAISED.labels(alert["detector"], alert["status"]).inc()
        for key, n in out.stats.items():
            self.stats[key] += n
        self.stats["invalid"] += len(out.dead) - out.stats["refused"]

    # -- the agents -----------------------------------------------------------------------

    async def samples(self, stream: faust.StreamT) -> None:
        async for events in stream.take_events(self.settings.batch_size, within=self.settings.batch_within_s):
            now = int(time.time() * 1000)
            for partition, messages in by_partition(events).items():
                messages = await self._in_order(partition, messages)
                if messages:
                    await self._apply_samples(partition, messages, now)

    async def _in_order(self, partition: int, messages: list) -> list:
        """The messages to apply now, strictly in offset order (``streams.stages.in_order``): a hole
        is read again from where it starts."""
        tp = TP(self.samples_name, partition)
        kept, seek = self.in_order.take(partition, messages, faust_fixes.start_offset(self.app.consumer, tp))
        if seek is not None:
            await self.app.consumer.seek(tp, seek)
            self.stats["reread"] += 1
        else:
            self.stats["copies_skipped"] += len(messages) - len(kept)
        return kept

    async def _apply_samples(self, partition: int, messages: list, now: int) -> None:
        ok, errors = self.codec.decode_many([m.value for m in messages])
        batch = [Decoded(i, name, record, messages[i].offset, received_ms(messages[i])) for i, name, record in ok]
        async with self.state.batch():
            out = self.step.samples(partition, batch, now)
            out.dead[:0] = errors
            await self.emit(partition, messages, out, now)

    async def life_cycle(self, stream: faust.StreamT) -> None:
        """The agents' STARTED/HEARTBEAT/ENDED (``WindowStep.life_cycle``)."""
        async for events in stream.take_events(1000, within=self.settings.batch_within_s):
            now = int(time.time() * 1000)
            for partition, messages in by_partition(events).items():
                ok, errors = self.codec.decode_many([m.value for m in messages])
                async with self.state.batch():
                    out = self.step.life_cycle(partition, [Decoded(i, name, r) for i, name, r in ok], now)
                    out.dead[:0] = errors
                    await self.emit(partition, messages, out, now, LIFE_CYCLE)

    async def root_causes(self, stream: faust.StreamT) -> None:
        """Analysed ranks of requested profiles (``WindowStep.root_causes``)."""
        async for events in stream.take_events(100, within=self.settings.batch_within_s):
            now = int(time.time() * 1000)
            for partition, messages in by_partition(events).items():
                async with self.state.batch():
                    records = await self.state.decoded(self.dlq_topic, PROFILE_RESULTS, messages, now, ROOT_CAUSE)
                    await self.emit(partition, messages, self.step.root_causes(partition, records, now), now,
                                    ROOT_CAUSE)

    # -- the timers -----------------------------------------------------------------------

    async def report_running(self) -> None:
        """Tell the periodic scheduler what runs on this worker's partitions."""
        if not self.settings.schedule.enabled or self.app.rebalancing:
            return
        now = int(time.time() * 1000)
        async with self.state.batch():
            for p, running in self.aggregator.running(self.assigned()).items():
                await self.state.send(self.schedule_topic, PROFILE_SCHEDULE, {
                    "source_partition": p, "at": now, "running": running, "finished": []})

    async def partition_clocks(self) -> None:
        """The newest event time of this worker's partitions, to every partition of the sample
        topic, through Kafka: a partition whose samples stopped follows it, whichever worker
        owns it (a worker that owns only quiet partitions has no clock of its own to follow).
        Also, on the partitions owned here, summaries of workflows whose ending was decided
        elsewhere (the life cycle) go out."""
        if self.app.rebalancing:  # the tables are being restored: nothing to decide from yet
            return
        mine = self.assigned()
        newest = max((self.aggregator.newest(p) for p in mine), default=-1)
        now = int(time.time() * 1000)
        async with self.state.batch():  # a timer changes states and sends like a batch
            for p in mine:
                await self.emit(p, [], self.step.settle(p, now), now)
        # Sent when it moved, and now and then (a partition that changed owner hears it again).
        sent = self.clock_sent
        if newest < 0 or (newest == sent["time"] and now - sent["at"] < CLOCK_REPEAT_MS):
            return
        value = self.codec.encode(CLOCK, {"event_time": newest, "worker": self.worker_name, "sent_at": now})
        for p in range(self.settings.partitions):
            await self.samples_topic.send(value=value, partition=p, force=True)
        sent.update(time=newest, at=now)

    async def log_stats(self) -> None:
        log.info("window-utilization: %s", dict(self.stats))


def register(app: faust.App, settings: StreamSettings, codec: Codec) -> None:
    """The window stage's agents, timers and tables on ``app``."""
    WindowStage(app, settings, codec).register()
