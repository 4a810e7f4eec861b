"""Wires the stages to Kafka, in flow order: samples -> validate -> windows -> detectors -> topics."""

from __future__ import annotations

import logging
import time
from collections import defaultdict

import faust

from schemas.codec import Codec
from schemas.dead_letter import dead_letter
from schemas.topics import ALERTS, DEAD_LETTERS, GPU_SAMPLES, WORKFLOW_WINDOWS, key_of
from schemas.validate_sample import validate_sample
from streams.detect_low_utilization import detect_low_utilization
from streams.window_utilization import Incoming, WindowAggregator

log = logging.getLogger(__name__)

STAGE = "window-utilization"


def register(app: faust.App, settings) -> None:  # settings: streams.app.StreamSettings
    """Add the windowing agent and its state table to ``app``."""
    codec = Codec()
    samples_topic = app.topic(settings.topic(GPU_SAMPLES.name), partitions=GPU_SAMPLES.partitions)
    windows_topic = app.topic(settings.topic(WORKFLOW_WINDOWS.name))
    alerts_topic = app.topic(settings.topic(ALERTS.name))
    dlq_topic = app.topic(settings.topic(DEAD_LETTERS.name))
    # One entry per workflow; the changelog partition is the workflow's source partition.
    table = app.Table(
        "window-state", default=None, partitions=GPU_SAMPLES.partitions,
        key_type=str,
    )
    aggregator = WindowAggregator(settings.window, table.data)
    stats = defaultdict(int)

    @app.on_partitions_assigned.connect
    async def _reindex(*args, **kwargs) -> None:
        aggregator.forget_partitions()

    async def send(topic: faust.TopicT, spec, name: str, record: dict) -> None:
        # force=True: hand to the producer now; Faust flushes the producer before it commits offsets.
        await topic.send(key=key_of(spec, record), value=codec.encode(name, record), force=True)

    @app.agent(samples_topic, name="window-utilization")
    async def window_samples(stream: faust.StreamT) -> None:
        async for events in stream.take_events(settings.batch_size, within=settings.batch_within_s):
            now = int(time.time() * 1000)
            by_partition: dict[int, list] = defaultdict(list)
            for event in events:
                by_partition[event.message.partition].append(event.message)
            for partition, messages in by_partition.items():
                messages.sort(key=lambda m: m.offset)
                good: list[Incoming] = []
                ok, errors = codec.decode_many([m.value for m in messages])
                bad = [(messages[i], reason) for i, reason in errors]
                for i, name, record in ok:
                    if name != GPU_SAMPLES.schema:
                        bad.append((messages[i], f"expected {GPU_SAMPLES.schema}, got {name}"))
                        continue
                    reason = validate_sample(record)
                    if reason:
                        bad.append((messages[i], reason))
                    else:
                        good.append(Incoming(messages[i].offset, record))
                result = aggregator.process(partition, good, closed_at=now)
                for wf in result.changed:
                    table.send_changelog(partition, wf, table.data[wf])
                for wf in result.removed:
                    table.send_changelog(partition, wf, None)
                for window in result.closed:
                    await send(windows_topic, WORKFLOW_WINDOWS, WORKFLOW_WINDOWS.schema, window)
                    alert = detect_low_utilization(window, settings.low_utilization, fired_at=now)
                    if alert is not None:
                        await send(alerts_topic, ALERTS, ALERTS.schema, alert)
                        stats["alerts"] += 1
                by_offset = {m.offset: m for m in messages}
                late = [(by_offset[inc.offset], reason) for inc, reason in result.late]
                for message, reason in bad + late:
                    log.warning("dead-letter %s[%d]@%d: %s", message.topic, partition, message.offset, reason)
                    record = dead_letter(STAGE, reason, message.topic, partition, message.offset,
                                         message.key, message.value, now)
                    await send(dlq_topic, DEAD_LETTERS, DEAD_LETTERS.schema, record)
                stats["samples"] += len(good)
                stats["windows"] += len(result.closed)
                stats["late"] += len(result.late)
                stats["invalid"] += len(bad)
                stats["replayed"] += result.replayed

    @app.timer(interval=10.0)
    async def _report() -> None:
        log.info("window-utilization: %s", dict(stats))

