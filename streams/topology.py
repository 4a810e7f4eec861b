"""Wires the stages to Kafka, in flow order:
samples -> validate -> windows -> detectors -> topics; kernel events -> trace sessions -> analyses."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import defaultdict
from collections.abc import MutableMapping

import faust
from faust.types import TP

from schemas.codec import Codec
from schemas.dead_letter import dead_letter
from schemas.sample_columns import CLOCK, blocks_of, size
from schemas.topics import (
    ALERTS,
    DEAD_LETTERS,
    FINDINGS,
    GPU_SAMPLES,
    KERNEL_EVENTS,
    PROFILE_REQUESTS,
    PROFILE_RESULTS,
    PROFILE_SCHEDULE,
    PROFILE_STATUSES,
    TRACE_ANALYSES,
    WORKFLOW_EVENTS,
    WORKFLOW_SUMMARIES,
    WORKFLOW_WINDOWS,
    key_of,
    request_of_trace,
)
from schemas.validate_ids import ids_error
from streams import faust_fixes
from streams.auto_profile import auto_profile_requests
from streams.in_order import InOrder
from streams.raise_alerts import raise_alerts
from streams.root_cause import apply_profile_result, profile_result
from streams.schedule_profiles import FleetSchedule, is_periodic
from streams.summarize_workflow import accumulate, correct, summary
from streams.trace_sessions import TraceSessions
from streams.window_utilization import BatchResult, Incoming, WindowAggregator

log = logging.getLogger(__name__)

STAGE = "window-utilization"
CLOCK_REPEAT_MS = 30_000
TRACE_STAGE = "trace-analysis"


def register(app: faust.App, settings) -> None:  # settings: streams.app.StreamSettings
    """Add every stage's agents and state tables to ``app``."""
    codec = Codec()
    _register_windows(app, settings, codec)
    _register_trace_analysis(app, settings, codec)
    _register_schedule(app, settings, codec)


async def _send(codec: Codec, topic: faust.TopicT, spec, record: dict) -> None:
    # force=True: hand to the producer now; Faust flushes the producer before it commits offsets.
    await topic.send(key=key_of(spec, record), value=codec.encode(spec.schema, record), force=True)


async def _dead_letter(codec: Codec, topic: faust.TopicT, stage: str, message, reason: str, now: int) -> None:
    log.warning("dead-letter %s[%d]@%d: %s", message.topic, message.partition, message.offset, reason)
    record = dead_letter(stage, reason, message.topic, message.partition, message.offset,
                         message.key, message.value, now)
    await _send(codec, topic, DEAD_LETTERS, record)


async def _decoded(codec: Codec, dlq_topic: faust.TopicT, stage: str, spec, messages, now: int) -> list[dict]:
    """The records of ``messages`` that decode as ``spec``'s schema; the others go to the
    dead-letter topic with the reason."""
    ok, errors = codec.decode_many([m.value for m in messages])
    for i, reason in errors:
        await _dead_letter(codec, dlq_topic, stage, messages[i], reason, now)
    records = []
    for i, name, record in ok:
        if name == spec.schema:
            records.append(record)
        else:
            await _dead_letter(codec, dlq_topic, stage, messages[i], f"expected {spec.schema}, got {name}", now)
    return records


def _by_partition(events) -> dict[int, list]:
    by_partition: dict[int, list] = defaultdict(list)
    for event in events:
        by_partition[event.message.partition].append(event.message)
    for messages in by_partition.values():
        messages.sort(key=lambda m: m.offset)
    return by_partition


def drop_unowned(data: MutableMapping, owned: set[int], unsaved: dict[str, int]) -> int:
    """Remove the entries of ``data`` (each a dict naming its ``partition``) whose partition is
    not in ``owned``, and their unsaved changes; returns how many."""
    gone = [k for k, v in data.items() if isinstance(v, dict) and v.get("partition") not in owned]
    for key in gone:
        del data[key]
    for key in [k for k, p in unsaved.items() if p not in owned]:
        del unsaved[key]
    return len(gone)


class _BeforeCommit(faust.Sensor):
    """Calls ``hook`` when the consumer starts a commit, before it takes the offsets."""

    def __init__(self, hook) -> None:
        super().__init__()
        self.hook = hook

    def on_commit_initiated(self, consumer) -> None:
        self.hook()


def _register_windows(app: faust.App, settings, codec: Codec) -> None:
    samples_topic = app.topic(settings.topic(GPU_SAMPLES.name), partitions=settings.partitions)
    windows_topic = app.topic(settings.topic(WORKFLOW_WINDOWS.name))
    summaries_topic = app.topic(settings.topic(WORKFLOW_SUMMARIES.name))
    alerts_topic = app.topic(settings.topic(ALERTS.name))
    requests_topic = app.topic(settings.topic(PROFILE_REQUESTS.name))
    dlq_topic = app.topic(settings.topic(DEAD_LETTERS.name))
    # One entry per workflow; the changelog partition is the workflow's source partition.
    table = app.Table("window-state", default=None, partitions=settings.partitions, key_type=str)
    # Closed windows within the update horizon, for late samples: "<workflow>@<start>" -> window.
    history = app.Table("window-history", default=None, partitions=settings.partitions, key_type=str)
    aggregator = WindowAggregator(settings.window, table.data, history.data)
    # The samples topic has no gaps in its offsets: a partition's messages are applied in order.
    samples_name = settings.topic(GPU_SAMPLES.name)
    faust_fixes.CONTIGUOUS.add(samples_name)
    in_order = InOrder()
    unsaved: dict[str, int] = {}  # workflow -> its partition: state changed since the last commit
    unsaved_history: dict[str, int] = {}  # the same for kept windows

    def save_state() -> None:
        """The state of each workflow changed since the last commit, to the changelog, once
        however many batches changed it. Runs as the consumer starts a commit and before it
        takes the offsets to commit; the commit waits for the producer, so the offsets it
        commits never run ahead of the state written."""
        for wf, partition in unsaved.items():
            table.send_changelog(partition, wf, table.data.get(wf))  # None: it was forgotten
        unsaved.clear()
        for key, partition in unsaved_history.items():
            history.send_changelog(partition, key, history.data.get(key))
        unsaved_history.clear()

    app.sensors.add(_BeforeCommit(save_state))
    stats = defaultdict(int)
    ended_after_ms = int(settings.workflow_ended_s * 1000)
    quiet_ms = int(settings.idle_partition_s * 1000)
    worker_name = f"{socket.gethostname()}:{os.getpid()}"
    clock_sent = {"time": -1, "at": 0}  # the last PartitionClock this worker sent, and when

    def assigned() -> list[int]:
        """The partitions of the sample topics this worker owns now."""
        name = samples_topic.get_topic_name()
        return sorted(tp.partition for tp in app.consumer.assignment() if tp.topic == name)

    @app.on_partitions_assigned.connect
    async def _reindex(sender, assigned: set, **kwargs) -> None:
        """What this worker no longer owns is dropped, unsaved changes included: the new owner
        restores the state as of the last commit from the changelog and reads on from the
        committed offsets, and nothing more is emitted for it here."""
        name = samples_topic.get_topic_name()
        mine = {tp.partition for tp in assigned if tp.topic == name}
        dropped = drop_unowned(table.data, mine, unsaved) + drop_unowned(history.data, mine, unsaved_history)
        if dropped:
            log.info("dropped the state of %d workflows and kept windows of partitions now owned elsewhere", dropped)

    @app.on_rebalance_complete.connect
    async def _reindex_restored(sender, **kwargs) -> None:
        """The tables are restored: the per-partition indexes (open windows, clocks) are built
        again from them when next used. Built earlier, during the restore, they would miss
        the windows restored after them, which would then never close. Each partition's
        messages are taken in order again from where the consumer is sought."""
        aggregator.forget_partitions()
        in_order.reset()

    async def finish(partition: int, result, now: int) -> None:
        """Alerts and job totals for the windows ``result`` closed, corrected totals for the
        windows late samples completed (judged once, when they closed: no alerts again),
        summaries of workflows that ended or whose ended totals changed, then the state to the
        changelog and the records to their topics."""
        alerts, requests = [], []
        for window in result.closed:
            state = table.data.get(window["workflow_id"])
            if state is not None:  # (a workflow forgotten in this batch has no more alerts)
                raised = raise_alerts(state, window, settings.alerts, now)
                accumulate(state, window, raised)
                alerts += raised
                requests += auto_profile_requests(state, raised, settings.auto_profile, now)
        summaries, corrected = [], set()
        for window, before in result.updated:
            state = table.data.get(window["workflow_id"])
            if state is not None:
                correct(state, before, window)
                result.changed.add(window["workflow_id"])
                if state.get("ended"):
                    corrected.add(window["workflow_id"])
        for wf in aggregator.ended(partition, ended_after_ms):
            state = table.data[wf]
            state["ended"] = True
            state["end_reason"] = ("its hosts reported it ended" if state.get("ending")
                                   else f"no samples for {settings.workflow_ended_s:g} s")
            result.changed.add(wf)
            corrected.add(wf)
        for wf in sorted(corrected):  # its first summary, or a summary corrected by late samples
            state = table.data[wf]
            record = summary(wf, state, state.get("end_reason", "ended"), now)
            if record is not None:
                summaries.append(record)
        for wf in result.changed | result.removed:
            unsaved[wf] = partition
        for key in result.history_changed | result.history_removed:
            unsaved_history[key] = partition
        for window in result.closed:
            await _send(codec, windows_topic, WORKFLOW_WINDOWS, window)
        for window, _ in result.updated:
            await _send(codec, windows_topic, WORKFLOW_WINDOWS, window)
        for alert in alerts:
            await _send(codec, alerts_topic, ALERTS, alert)
        for request in requests:  # the root cause of the waste, while the owner reads the alert
            await _send(codec, requests_topic, PROFILE_REQUESTS, request)
        for record in summaries:
            await _send(codec, summaries_topic, WORKFLOW_SUMMARIES, record)
        stats["windows"] += len(result.closed)
        stats["windows_updated"] += len(result.updated)
        stats["alerts"] += len(alerts)
        stats["summaries"] += len(summaries)

    @app.agent(samples_topic, name="window-utilization")
    async def window_samples(stream: faust.StreamT) -> None:
        async for events in stream.take_events(settings.batch_size, within=settings.batch_within_s):
            now = int(time.time() * 1000)
            for partition, messages in _by_partition(events).items():
                tp = TP(samples_name, partition)
                kept, seek = in_order.take(partition, messages, app.consumer._committed_offset.get(tp))
                if seek is not None:
                    await app.consumer.seek(tp, seek)
                    stats["reread"] += 1
                else:
                    stats["copies_skipped"] += len(messages) - len(kept)
                messages = kept
                if not messages:
                    continue
                good: list[Incoming] = []
                clocks: list[int] = []
                ok, errors = codec.decode_many([m.value for m in messages])
                bad = [(messages[i], reason) for i, reason in errors]
                for i, name, record in ok:
                    if name == CLOCK:
                        clocks.append(record["event_time"])
                        continue
                    if not GPU_SAMPLES.carries(name):
                        bad.append((messages[i], f"expected {GPU_SAMPLES.schema}, got {name}"))
                        continue
                    blocks, reasons = blocks_of(name, record)
                    offset = messages[i].offset
                    good += [Incoming(offset, block, j) for j, block in enumerate(blocks)]
                    bad += [(messages[i], reason) for reason in reasons]
                result = aggregator.process(partition, good, closed_at=now)
                await finish(partition, result, now)
                if clocks:
                    await finish(partition, aggregator.follow(partition, max(clocks), quiet_ms, closed_at=now), now)
                refused = []
                if result.refused:  # rare: index the batch only then
                    by_offset = {m.offset: m for m in messages}
                    refused = [(by_offset[inc.offset], reason) for inc, reason in result.refused]
                for message, reason in bad + refused:
                    await _dead_letter(codec, dlq_topic, STAGE, message, reason, now)
                stats["samples"] += sum(size(inc.record) for inc in good)
                stats["refused"] += len(result.refused)
                stats["invalid"] += len(bad)
                stats["replayed"] += result.replayed

    events_topic = app.topic(settings.topic(WORKFLOW_EVENTS.name), partitions=settings.partitions)

    @app.agent(events_topic, name="workflow-life-cycle")
    async def life_cycle(stream: faust.StreamT) -> None:
        """The agents' STARTED/HEARTBEAT/ENDED: a workflow whose every host said ENDED is ending;
        its summary goes out once its last window has closed. The topic is keyed and partitioned
        like the samples, so the workflow's state is in this worker's table."""
        async for events in stream.take_events(1000, within=settings.batch_within_s):
            now = int(time.time() * 1000)
            for partition, messages in _by_partition(events).items():
                ok, errors = codec.decode_many([m.value for m in messages])
                for i, reason in errors:
                    await _dead_letter(codec, dlq_topic, "workflow-life-cycle", messages[i], reason, now)
                result = BatchResult()
                for i, name, event in ok:
                    if name != WORKFLOW_EVENTS.schema:
                        continue
                    reason = ids_error(event)
                    if reason:
                        await _dead_letter(codec, dlq_topic, "workflow-life-cycle", messages[i], reason, now)
                        continue
                    state = aggregator.state_of(event["workflow_id"], partition, event["owner"], event["team"])
                    hosts = set(state.get("hosts", []))
                    if event["event"] == "ENDED":
                        hosts.discard(event["host"])
                        if not hosts:
                            state["ending"] = True
                            log.info("workflow %s ended on its last host (%s)", event["workflow_id"], event["host"])
                    else:
                        hosts.add(event["host"])
                        state.pop("ending", None)
                    state["hosts"] = sorted(hosts)
                    result.changed.add(event["workflow_id"])
                await finish(partition, result, now)

    results_topic = app.topic(settings.topic(PROFILE_RESULTS.name), partitions=settings.partitions)
    schedule_topic = app.topic(settings.topic(PROFILE_SCHEDULE.name))

    @app.agent(results_topic, name="root-cause")
    async def root_cause(stream: faust.StreamT) -> None:
        """Analysed ranks of requested profiles: an automatic profile's findings go into the alert
        that asked for it. Keyed and partitioned like the samples: the workflow's alert state is here."""
        async for events in stream.take_events(100, within=settings.batch_within_s):
            now = int(time.time() * 1000)
            for partition, messages in _by_partition(events).items():
                result, updates, finished = BatchResult(), [], []
                for record in await _decoded(codec, dlq_topic, "root-cause", PROFILE_RESULTS, messages, now):
                    if is_periodic(record["request_id"]):
                        finished.append(record["workflow_id"])
                    state = table.data.get(record["workflow_id"])
                    update = apply_profile_result(state, record, now) if state is not None else None
                    if update is not None:
                        updates.append(update)
                        result.changed.add(record["workflow_id"])
                await finish(partition, result, now)
                for alert in updates:
                    log.info("alert %s: root cause from profile %s", alert["alert_id"], alert["profile_request_id"])
                    await _send(codec, alerts_topic, ALERTS, alert)
                stats["root_causes"] += len(updates)
                if finished:  # the scheduler's slots are free again
                    await _send(codec, schedule_topic, PROFILE_SCHEDULE, {
                        "source_partition": None, "at": now, "running": [], "finished": sorted(set(finished))})

    @app.timer(interval=settings.schedule.report_s)
    async def _report_running() -> None:
        """Tell the periodic scheduler what runs on this worker's partitions."""
        if not settings.schedule.enabled or app.rebalancing:
            return
        now = int(time.time() * 1000)
        for p, running in aggregator.running(assigned()).items():
            await _send(codec, schedule_topic, PROFILE_SCHEDULE, {
                "source_partition": p, "at": now, "running": running, "finished": []})

    @app.timer(interval=max(1.0, settings.idle_partition_s / 4))
    async def _partition_clocks() -> None:
        """The newest event time of this worker's partitions, to every partition of the sample
        topic, through Kafka: a partition whose samples stopped follows it, whichever worker
        owns it (a worker that owns only quiet partitions has no clock of its own to follow).
        Also, on the partitions owned here, summaries of workflows whose ending was decided
        elsewhere (the life cycle) go out."""
        if app.rebalancing:  # the tables are being restored: nothing to decide from yet
            return
        mine = assigned()
        newest = max((aggregator.newest(p) for p in mine), default=-1)
        now = int(time.time() * 1000)
        for p in mine:
            await finish(p, BatchResult(), now)
        # Sent when it moved, and now and then (a partition that changed owner hears it again).
        if newest < 0 or (newest == clock_sent["time"] and now - clock_sent["at"] < CLOCK_REPEAT_MS):
            return
        value = codec.encode(CLOCK, {"event_time": newest, "worker": worker_name, "sent_at": now})
        for p in range(settings.partitions):
            await samples_topic.send(value=value, partition=p, force=True)
        clock_sent.update(time=newest, at=now)

    @app.timer(interval=10.0)
    async def _report() -> None:
        log.info("window-utilization: %s", dict(stats))


def _register_trace_analysis(app: faust.App, settings, codec: Codec) -> None:
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
            await _send(codec, analyses_topic, TRACE_ANALYSES, analysis)
        for finding in result.findings:
            await _send(codec, findings_topic, FINDINGS, finding)
        for analysis in result.analyses:  # a requested profile: its result, and the requester told
            origin = request_of_trace(analysis["trace_id"])
            if origin is not None:
                request_id, host, rank = origin
                now = int(time.time() * 1000)
                findings = [f for f in result.findings if f["trace_id"] == analysis["trace_id"]]
                await _send(codec, results_topic, PROFILE_RESULTS,
                            profile_result(analysis, findings, request_id, host, rank, now))
                await _send(codec, statuses_topic, PROFILE_STATUSES, {
                    "request_id": request_id, "workflow_id": analysis["workflow_id"], "host": host, "rank": rank,
                    "pid": None, "state": "ANALYSED", "reason": analysis.get("error"),
                    "trace_id": analysis["trace_id"], "at": now})

    @app.agent(events_topic, name="trace-analysis")
    async def analyze_traces(stream: faust.StreamT) -> None:
        async for events in stream.take_events(settings.batch_size, within=settings.batch_within_s):
            now = int(time.time() * 1000)
            for partition, messages in _by_partition(events).items():
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
                    await _dead_letter(codec, dlq_topic, TRACE_STAGE, messages[i], reason, now)
                await persist_and_emit(sessions.apply(partition, records, now))

    @app.timer(interval=settings.trace_sessions.timeout_ms / 4000)
    async def _expire() -> None:
        if app.rebalancing:  # the table is being restored
            return
        await persist_and_emit(sessions.expire(int(time.time() * 1000)))


class _KeyPrefixed(MutableMapping):
    """The entries of a table whose keys start with ``prefix``, without it."""

    def __init__(self, data, prefix: str) -> None:
        self.data, self.prefix = data, prefix

    def __getitem__(self, key):
        return self.data[self.prefix + key]

    def __setitem__(self, key, value):
        self.data[self.prefix + key] = value

    def __delitem__(self, key):
        del self.data[self.prefix + key]

    def __iter__(self):
        return (k[len(self.prefix):] for k in list(self.data.keys()) if k.startswith(self.prefix))

    def __len__(self):
        return sum(1 for _ in self)


def _register_schedule(app: faust.App, settings, codec: Codec) -> None:
    """The periodic profiling scheduler: one instance for the fleet (its topic has one partition)."""
    reports_topic = app.topic(settings.topic(PROFILE_SCHEDULE.name), partitions=PROFILE_SCHEDULE.partitions)
    requests_topic = app.topic(settings.topic(PROFILE_REQUESTS.name))
    dlq_topic = app.topic(settings.topic(DEAD_LETTERS.name))
    # "report:<partition>" -> what runs there; "wf:<workflow>" -> its schedule.
    table = app.Table("profile-schedule", default=None, partitions=PROFILE_SCHEDULE.partitions, key_type=str)
    schedule = FleetSchedule(settings.schedule, _KeyPrefixed(table.data, "report:"), _KeyPrefixed(table.data, "wf:"))

    @app.agent(reports_topic, name="profile-scheduler")
    async def scheduler(stream: faust.StreamT) -> None:
        async for events in stream.take_events(100, within=settings.batch_within_s):
            now = int(time.time() * 1000)
            for partition, messages in _by_partition(events).items():
                requests = []
                for report in await _decoded(codec, dlq_topic, "profile-scheduler", PROFILE_SCHEDULE, messages, now):
                    if settings.schedule.enabled:
                        requests += schedule.apply(report, now)
                reports, changed, removed = schedule.take_changes()
                for key in reports:
                    table.send_changelog(partition, "report:" + key, table.data["report:" + key])
                for wf in changed:
                    table.send_changelog(partition, "wf:" + wf, table.data["wf:" + wf])
                for wf in removed:
                    table.send_changelog(partition, "wf:" + wf, None)
                for request in requests:
                    log.info("periodic profile of %s (%s)", request["workflow_id"], request["request_id"])
                    await _send(codec, requests_topic, PROFILE_REQUESTS, request)
