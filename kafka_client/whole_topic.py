"""A small one-partition topic read whole, from its start, by every process that needs it
(the owners' actions: the notifier's acknowledgements and snoozes, the enforcer's exemptions).

A consumer group would give the partition to one member only, so each process assigns it
itself, reads from the first offset at each start, and commits nothing: what it holds is
rebuilt from the topic. ``read_to_end`` waits until everything written before it was asked is
taken (or says it could not: then nothing may act on what it has not read); ``poll`` takes
what has arrived since, without waiting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from kafka_client.config import Connection, consumer_config

log = logging.getLogger(__name__)

OFFSET_BEGINNING = -2


class WholeTopic:
    """Partition 0 of ``topic``, each record handed to ``take`` in order, from the first."""

    def __init__(self, kafka: str | Connection, topic: str, client_id: str, take: Callable[[Message], None]) -> None:
        self.topic, self.take = topic, take
        # (group.id is required by the client; no group is joined and no offset is committed)
        self._consumer = Consumer(consumer_config(kafka, client_id, **{"client.id": client_id}))
        self._consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])

    def read_to_end(self, timeout_s: float = 10.0) -> bool:
        """Take every record written before this call; False where that cannot be done within
        ``timeout_s`` (the broker does not answer, or the reading falls behind), logged."""
        deadline = time.monotonic() + timeout_s
        partition = TopicPartition(self.topic, 0)
        try:
            first, end = self._consumer.get_watermark_offsets(partition, timeout=timeout_s)
            if end <= first:
                return True  # it holds nothing: never written, or every record expired (no position to reach)
            while time.monotonic() < deadline:
                if self._consumer.position([partition])[0].offset >= end:
                    return True
                self._take(self._consumer.consume(num_messages=500, timeout=0.5))
        except KafkaException as exc:
            log.warning("%s cannot be read (%s)", self.topic, exc)
            return False
        log.warning("%s was not read to its end within %g s", self.topic, timeout_s)
        return False

    def poll(self) -> int:
        """Take what has arrived (fetched in the background), without waiting; how many."""
        messages = self._consumer.consume(num_messages=500, timeout=0)
        self._take(messages)
        return len(messages)

    def _take(self, messages: list[Message]) -> None:
        for m in messages:
            if m.error() is None:
                self.take(m)
            else:
                log.warning("%s: %s", self.topic, m.error())

    def close(self) -> None:
        self._consumer.close()
