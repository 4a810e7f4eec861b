"""The window stage: one state per workflow, fed by the three topics keyed and partitioned like
the GPU samples (so a workflow's samples, life cycle and profile results meet in this worker).

- **samples** (``window-utilization``): blocks are checked, added to event-time windows
  (``window_utilization``); a closed window is judged by the detectors, raises or resolves
  alerts, adds to the job's totals and may ask for a profile;
- **life cycle** (``workflow-life-cycle``): the agents' STARTED/HEARTBEAT/ENDED; a workflow
  whose every host said ENDED is ending, and is summarised once its last window closed;
- **profile results** (``root-cause``): an automatic profile's findings go into its alert;
- **timers**: what runs here, to the periodic scheduler; the newest event time of this
  worker's partitions, to every partition of the samples topic (``PartitionClock``), which
  quiet partitions follow.

The states change, and the records they lead to are sent, only inside the stage's batches
(``streams.stage_state``: the rule every stage keeps, in one place): a state records what it
has applied, and the commit writes it only after the records of every batch so far are
durable. Partitions that move away are dropped with their unsaved changes.
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
from schemas.sample_columns import CLOCK, blocks_of, size
from schemas.topics import (
    ALERTS,
    DEAD_LETTERS,
    ENFORCEMENT,
    GPU_SAMPLES,
    PROFILE_REQUESTS,
    PROFILE_RESULTS,
    PROFILE_SCHEDULE,
    WORKFLOW_EVENTS,
    WORKFLOW_SUMMARIES,
    WORKFLOW_WINDOWS,
)
from schemas.validate_ids import ids_error
from schemas.validate_sample import NOT_WORKFLOWS
from streams import faust_fixes
from streams.alerts.raising import raise_alerts
from streams.enforcement.ladder import climb
from streams.in_order import InOrder
from streams.profiling.auto import auto_profile_requests
from streams.profiling.root_cause import apply_profile_result
from streams.profiling.schedule import is_periodic
from streams.settings import StreamSettings
from streams.stage_io import METRICS, by_partition, received_ms, topic_of
from streams.stage_state import StageState
from streams.windows import workflow_state
from streams.windows.batches import BatchResult, Incoming
from streams.windows.state_table import STATE_CODEC, StateType
from streams.windows.summary import accumulate, correct, summary
from streams.windows.utilization import WindowAggregator

log = logging.getLogger(__name__)

# The window stage's own metrics, beside the worker's (``stage_io.METRICS``).
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
        self.aggregator = WindowAggregator(settings.window, self.table.data, self.history.data)
        # The samples topic has no gaps in its offsets: a partition's messages are applied in order.
        self.samples_name = settings.topic(GPU_SAMPLES.name)
        faust_fixes.CONTIGUOUS.add(self.samples_name)
        self.in_order = InOrder()
        self.state = StageState(app, STAGE, codec)
        self.state.table(self.table, lambda value: codecs.dumps(STATE_CODEC, value))
        self.state.table(self.history, lambda value: codecs.dumps(self.history.value_serializer, value))
        self.lock = self.state.lock
        self.stats: dict[str, int] = defaultdict(int)
        self.ended_after_ms = int(settings.workflow_ended_s * 1000)
        self.quiet_ms = int(settings.idle_partition_s * 1000)
        self.worker_name = f"{socket.gethostname()}:{os.getpid()}"
        self.clock_sent = {"time": -1, "at": 0}  # the last PartitionClock this worker sent, and when

    def register(self) -> None:
        app, settings = self.app, self.settings
        app.on_partitions_assigned.connect(self.on_assigned)
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

    async def on_assigned(self, sender, assigned: set, **kwargs) -> None:
        """What this worker no longer owns is dropped, unsaved changes included: the new owner
        restores the state as of the last commit from the changelog and reads on from the
        committed offsets, and nothing more is emitted for it here."""
        name = self.samples_topic.get_topic_name()
        mine = {tp.partition for tp in assigned if tp.topic == name}
        dropped = self.state.drop(mine)
        if dropped:
            log.info("dropped the state of %d workflows and kept windows of partitions now owned elsewhere", dropped)

    async def on_rebalance_complete(self, sender, **kwargs) -> None:
        """The tables are restored: the per-partition indexes (open windows, clocks) are built
        again from them when next used. Built earlier, during the restore, they would miss
        the windows restored after them, which would then never close. Each partition's
        messages are taken in order again from where the consumer is sought."""
        self.aggregator.forget_partitions()
        self.in_order.reset()

    # -- what a batch leads to ----------------------------------------------------------------

    async def finish(self, partition: int, result: BatchResult, now: int) -> None:
        """Alerts and job totals for the windows ``result`` closed, corrected totals for the
        windows late samples completed (judged once, when they closed: no alerts again),
        summaries of workflows that ended or whose ended totals changed, then the state to the
        changelog and the records to their topics."""
        alerts, requests, steps = self._judge(result.closed, now)
        corrected = self._correct(result) | self._end(partition, result)
        summaries = [record for wf in sorted(corrected)  # its first summary, or one corrected by late samples
                     if (record := summary(wf, self.table.data[wf], self.table.data[wf].end_reason or "ended",
                                           now)) is not None]
        for window in [*result.closed, *(window for window, _ in result.updated)]:
            await self.state.send(self.windows_topic, WORKFLOW_WINDOWS, window)
        for alert in alerts:
            await self.state.send(self.alerts_topic, ALERTS, alert)
        for request in requests:  # the root cause of the waste, while the owner reads the alert
            await self.state.send(self.requests_topic, PROFILE_REQUESTS, request)
        for step in steps:  # the enforcement ladder: warnings, the action falling due (gpufleet enforce)
            log.info("enforcement %s of %s (ladder %s): %s", step["step"], step["workflow_id"], step["policy"],
                     step["reason"])
            await self.state.send(self.enforcement_topic, ENFORCEMENT, step)
        for record in summaries:
            await self.state.send(self.summaries_topic, WORKFLOW_SUMMARIES, record)
        for wf in result.changed | result.removed:
            self.state.changed(self.table, wf, partition)
        for key in result.history_changed | result.history_removed:
            self.state.changed(self.history, key, partition)
        WINDOWS_CLOSED.inc(len(result.closed))
        for alert in alerts:
            ALERTS_RAISED.labels(alert["detector"], alert["status"]).inc()
        self.stats["windows"] += len(result.closed)
        self.stats["windows_updated"] += len(result.updated)
        self.stats["alerts"] += len(alerts)
        self.stats["summaries"] += len(summaries)

    def _judge(self, closed: list[dict], now: int) -> tuple[list[dict], list[dict], list[dict]]:
        """The alerts, profile requests and enforcement steps of newly closed windows; their job totals."""
        alerts, requests, steps = [], [], []
        for window in closed:
            if window["workflow_id"] in NOT_WORKFLOWS:
                continue  # GPUs no workflow holds: capacity, counted by their windows; nobody to alert
            state = self.table.data.get(window["workflow_id"])
            if state is not None:  # (a workflow forgotten in this batch has no more alerts)
                raised = raise_alerts(state, window, self.settings.alerts, now)
                accumulate(state, window, raised)
                alerts += raised
                requests += auto_profile_requests(state, raised, self.settings.auto_profile, now)
                steps += climb(state, window, self.settings.enforcement, now)
        return alerts, requests, steps

    def _correct(self, result: BatchResult) -> set[str]:
        """Job totals corrected for windows late samples completed; the ended workflows among them."""
        corrected = set()
        for window, before in result.updated:
            state = self.table.data.get(window["workflow_id"])
            if state is not None:
                correct(state, before, window)
                result.changed.add(window["workflow_id"])
                if state.ended:
                    corrected.add(window["workflow_id"])
        return corrected

    def _end(self, partition: int, result: BatchResult) -> set[str]:
        """The workflows of ``partition`` that have ended now, marked so."""
        ended = set()
        for wf in self.aggregator.ended(partition, self.ended_after_ms):
            state = self.table.data[wf]
            state.ended = True
            state.end_reason = ((state.end_reason or "its hosts reported it ended") if state.ending
                                else f"no samples for {self.settings.workflow_ended_s:g} s")
            result.changed.add(wf)
            ended.add(wf)
        return ended

    # -- the agents -----------------------------------------------------------------------

    async def samples(self, stream: faust.StreamT) -> None:
        async for events in stream.take_events(self.settings.batch_size, within=self.settings.batch_within_s):
            now = int(time.time() * 1000)
            for partition, messages in by_partition(events).items():
                messages = await self._in_order(partition, messages)
                if messages:
                    await self._apply_samples(partition, messages, now)

    async def _in_order(self, partition: int, messages: list) -> list:
        """The messages to apply now, strictly in offset order (``streams.in_order``): a hole
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
        good: list[Incoming] = []
        clocks: list[int] = []
        ends: list[dict] = []  # the scheduler's ends of jobs, after their samples
        ok, errors = self.codec.decode_many([m.value for m in messages])
        bad = [(messages[i], reason) for i, reason in errors]
        for i, name, record in ok:
            if name == CLOCK:
                clocks.append(record["event_time"])
                continue
            if name == WORKFLOW_EVENTS.schema and record["event"] == "ENDED":
                reason = ids_error(record)
                if reason:
                    bad.append((messages[i], reason))
                else:
                    ends.append(record)
                continue
            if not GPU_SAMPLES.carries(name):
                bad.append((messages[i], f"expected {GPU_SAMPLES.schema}, got {name}"))
                continue
            blocks, reasons = blocks_of(name, record, received_ms(messages[i]))
            offset = messages[i].offset
            good += [Incoming(offset, block, j) for j, block in enumerate(blocks)]
            bad += [(messages[i], reason) for reason in reasons]
        async with self.state.batch():
            result = self.aggregator.process(partition, good, closed_at=now)
            refused = []
            if result.refused:  # rare: index the batch only then
                by_offset = {m.offset: m for m in messages}
                refused = [(by_offset[inc.offset], reason) for inc, reason in result.refused]
            for message, reason in bad + refused:
                await self.state.dead_letter(self.dlq_topic, message, reason, now)
            await self.finish(partition, result, now)
            for event in ends:
                await self._scheduler_end(partition, event, now)
            if clocks:
                await self.finish(partition, self.aggregator.follow(partition, max(clocks), self.quiet_ms,
                                                                    closed_at=now), now)
        applied = sum(size(inc.record) for inc in good)
        SAMPLES_APPLIED.inc(applied)
        self.stats["samples"] += applied
        self.stats["refused"] += len(result.refused)
        self.stats["invalid"] += len(bad)
        self.stats["replayed"] += result.replayed

    async def _scheduler_end(self, partition: int, event: dict, now: int) -> None:
        """A job's end from its scheduler, read after the samples its agent sent before it (they
        travel in one partition, in order): once every host it ran on has ended it, its windows
        close now, without waiting for the fleet's clock, and its summary goes out."""
        self._hear(partition, event)
        state = self.table.data[event["workflow_id"]]
        result = BatchResult()
        result.changed.add(event["workflow_id"])
        if state.ending:
            state.end_reason = f"its scheduler ({event.get('scheduler') or 'unknown'}) ended it"
            result = self.aggregator.close_workflow(partition, event["workflow_id"], closed_at=now)
            result.changed.add(event["workflow_id"])
        await self.finish(partition, result, now)

    async def life_cycle(self, stream: faust.StreamT) -> None:
        """The agents' STARTED/HEARTBEAT/ENDED: a workflow whose every host said ENDED is ending;
        its summary goes out once its last window has closed."""
        async for events in stream.take_events(1000, within=self.settings.batch_within_s):
            now = int(time.time() * 1000)
            for partition, messages in by_partition(events).items():
                ok, errors = self.codec.decode_many([m.value for m in messages])
                async with self.state.batch():
                    for i, reason in errors:
                        await self.state.dead_letter(self.dlq_topic, messages[i], reason, now, LIFE_CYCLE)
                    result = BatchResult()
                    for i, name, event in ok:
                        if name != WORKFLOW_EVENTS.schema:
                            continue
                        if event["event"] == "ENDED" and event.get("scheduler"):
                            continue  # read in order with the job's samples, on the samples topic
                        reason = ids_error(event)
                        if reason:
                            await self.state.dead_letter(self.dlq_topic, messages[i], reason, now, LIFE_CYCLE)
                            continue
                        self._hear(partition, event)
                        result.changed.add(event["workflow_id"])
                    await self.finish(partition, result, now)

    def _hear(self, partition: int, event: dict) -> None:
        """One life-cycle event into its workflow's state (``workflow_state.hear``)."""
        workflow_state.hear(self.aggregator.state_of(event["workflow_id"], partition, event["owner"], event["team"]),
                            event)

    async def root_causes(self, stream: faust.StreamT) -> None:
        """Analysed ranks of requested profiles: an automatic profile's findings go into the
        alert that asked for it; a periodic profile's end frees the scheduler's slot."""
        async for events in stream.take_events(100, within=self.settings.batch_within_s):
            now = int(time.time() * 1000)
            for partition, messages in by_partition(events).items():
                result, updates, finished = BatchResult(), [], []
                async with self.state.batch():
                    for record in await self.state.decoded(self.dlq_topic, PROFILE_RESULTS, messages, now, ROOT_CAUSE):
                        if is_periodic(record["request_id"]):
                            finished.append(record["workflow_id"])
                        state = self.table.data.get(record["workflow_id"])
                        update = apply_profile_result(state, record, now) if state is not None else None
                        if update is not None:
                            updates.append(update)
                            result.changed.add(record["workflow_id"])
                    for alert in updates:
                        log.info("alert %s: root cause from profile %s", alert["alert_id"], alert["profile_request_id"])
                        await self.state.send(self.alerts_topic, ALERTS, alert)
                    await self.finish(partition, result, now)
                    if finished:  # the scheduler's slots are free again
                        await self.state.send(self.schedule_topic, PROFILE_SCHEDULE, {
                            "source_partition": None, "at": now, "running": [], "finished": sorted(set(finished))})
                self.stats["root_causes"] += len(updates)

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
                await self.finish(p, BatchResult(), now)
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
