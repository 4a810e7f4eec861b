"""What every stage of the worker does the same way with Kafka: send a record, dead-letter a
message, group a batch by partition, and act just before the consumer commits. A stage sends
through its ``streams.stages.state.StageState``, which keeps the rule on its state and records."""

from __future__ import annotations

import logging
from collections import defaultdict

import faust

from kafka_client.metrics import ComponentMetrics
from schemas.codec import Codec
from schemas.dead_letter import dead_letter
from schemas.topics import DEAD_LETTERS, key_of

log = logging.getLogger(__name__)


def topic_of(app: faust.App, settings, spec, **kwargs) -> faust.TopicT:
    """``spec``'s topic under the deployment's prefix (settings: streams.app.StreamSettings)."""
    return app.topic(settings.topic(spec.name), **kwargs)


# The worker's metrics (``kafka_client.metrics``); the stages add theirs to its registry.
METRICS = ComponentMetrics("worker")


async def send(codec: Codec, topic: faust.TopicT, spec, record: dict) -> None:
    """``record`` to ``topic``, keyed as ``spec`` says. force=True: handed to the producer
    now; Faust flushes the producer before it commits offsets."""
    await topic.send(key=key_of(spec, record), value=codec.encode(spec.schema, record), force=True)
    METRICS.records_out(topic.get_topic_name())


async def send_dead_letter(codec: Codec, topic: faust.TopicT, stage: str, message, reason: str, now: int) -> None:
    log.warning("dead-letter %s[%d]@%d: %s", message.topic, message.partition, message.offset, reason)
    METRICS.dead_letter(stage, reason)
    record = dead_letter(stage, reason, message.topic, message.partition, message.offset,
                         message.key, message.value, now)
    await send(codec, topic, DEAD_LETTERS, record)


def received_ms(message) -> int | None:
    """When Kafka received a Faust message (its record's timestamp, in ms), or None if unknown:
    what ``schemas.sample_columns.blocks_of`` judges its samples' event times against."""
    seconds = getattr(message, "timestamp", None)
    return round(seconds * 1000) if seconds and seconds > 0 else None


def by_partition(events) -> dict[int, list]:
    """The messages of a batch of stream events, per partition, in offset order."""
    out: dict[int, list] = defaultdict(list)
    for event in events:
        out[event.message.partition].append(event.message)
    for messages in out.values():
        messages.sort(key=lambda m: m.offset)
        METRICS.records_in(messages[0].topic, len(messages))
    return out


class BeforeCommit(faust.Sensor):
    """Calls ``hook`` when the consumer starts a commit, before it takes the offsets."""

    def __init__(self, hook) -> None:
        super().__init__()
        self.hook = hook

    def on_commit_initiated(self, consumer) -> None:
        self.hook()
