"""What every stage of the worker does the same way with Kafka: send a record, dead-letter a
message, decode a batch, group it by partition, drop what another worker now owns, and act
just before the consumer commits."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import MutableMapping

import faust

from kafka_client.metrics import ComponentMetrics
from schemas.codec import Codec
from schemas.dead_letter import dead_letter
from schemas.topics import DEAD_LETTERS, key_of
from streams import faust_fixes

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


async def decoded(codec: Codec, dlq_topic: faust.TopicT, stage: str, spec, messages, now: int) -> list[dict]:
    """The records of ``messages`` that decode as ``spec``'s schema; the others go to the
    dead-letter topic with the reason."""
    ok, errors = codec.decode_many([m.value for m in messages])
    for i, reason in errors:
        await send_dead_letter(codec, dlq_topic, stage, messages[i], reason, now)
    records = []
    for i, name, record in ok:
        if name == spec.schema:
            records.append(record)
        else:
            await send_dead_letter(codec, dlq_topic, stage, messages[i], f"expected {spec.schema}, got {name}", now)
    return records


def by_partition(events) -> dict[int, list]:
    """The messages of a batch of stream events, per partition, in offset order."""
    out: dict[int, list] = defaultdict(list)
    for event in events:
        out[event.message.partition].append(event.message)
    for messages in out.values():
        messages.sort(key=lambda m: m.offset)
        METRICS.records_in(messages[0].topic, len(messages))
    return out


def drop_unowned(data: MutableMapping, owned: set[int], unsaved: dict[str, int]) -> int:
    """Remove the entries of ``data`` (each naming its ``partition``: a dict's key, or a typed
    state's field) whose partition is not in ``owned``, and their unsaved changes; returns how many."""
    gone = [k for k, v in data.items() if v is not None and _partition(v) not in owned]
    for key in gone:
        del data[key]
    for key in [k for k, p in unsaved.items() if p not in owned]:
        del unsaved[key]
    return len(gone)


def _partition(entry) -> int | None:
    return entry.get("partition") if isinstance(entry, dict) else getattr(entry, "partition", None)


def write_state(table, partition: int, key, value, **kwargs) -> None:
    """``key``'s entry of ``table`` (``value``; None: deleted) to its changelog partition; the
    next offset commit waits until the broker has it (``faust_fixes``, fix 6)."""
    faust_fixes.state_writes(table.app).append(table.send_changelog(partition, key, value, **kwargs))


class BeforeCommit(faust.Sensor):
    """Calls ``hook`` when the consumer starts a commit, before it takes the offsets."""

    def __init__(self, hook) -> None:
        super().__init__()
        self.hook = hook

    def on_commit_initiated(self, consumer) -> None:
        self.hook()
