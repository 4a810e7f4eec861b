"""Publishes records to a gpufleet topic through confluent-kafka: Avro-encoded, keyed, idempotent."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from confluent_kafka import KafkaError, Message, Producer

from kafka_client.config import Connection, producer_config
from schemas.codec import Codec
from schemas.topics import TopicSpec, key_of

log = logging.getLogger(__name__)


class Publisher:
    """Encodes dicts with the topic's schema and produces them with the topic's key."""

    def __init__(self, kafka: str | Connection, codec: Codec, **overrides: object) -> None:
        self._producer = Producer(producer_config(kafka, **overrides))
        self._codec = codec
        self._lock = threading.Lock()
        self.delivered = 0
        self.failed = 0
        self.last_error: KafkaError | None = None

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        with self._lock:
            if err is None:
                self.delivered += 1
            else:
                self.failed += 1
                self.last_error = err
                log.error("delivery to %s failed: %s", msg.topic(), err)

    def publish(
        self, spec: TopicSpec, records: Iterable[dict], topic: str | None = None, schema: str | None = None,
    ) -> int:
        """Queue ``records`` for ``spec``'s topic (or ``topic``, its namespaced name), encoded with
        ``schema`` (default: the topic's main schema); return how many."""
        name = topic or spec.name
        schema = schema or spec.schema
        if not spec.carries(schema):
            raise ValueError(f"{spec.name} does not carry {schema} records")
        n = 0
        for record in records:
            value = self._codec.encode(schema, record)
            key = key_of(spec, record)
            while True:
                try:
                    self._producer.produce(name, value=value, key=key, on_delivery=self._on_delivery)
                    break
                except BufferError:
                    # Local queue full: serve delivery reports until there is room.
                    self._producer.poll(0.1)
            n += 1
        self._producer.poll(0)
        return n

    def publish_everywhere(self, spec: TopicSpec, record: dict, topic: str | None = None,
                           schema: str | None = None, timeout_s: float = 30.0) -> int:
        """Queue ``record`` (unkeyed) once to every partition of the topic (a fleet's clock); how many."""
        name = topic or spec.name
        value = self._codec.encode(schema or spec.schema, record)
        partitions = self._producer.list_topics(name, timeout=timeout_s).topics[name].partitions
        for partition in sorted(partitions):
            self._producer.produce(name, value=value, partition=partition, on_delivery=self._on_delivery)
        return len(partitions)

    def flush(self, timeout: float = 30.0) -> int:
        """Wait for every queued record to be delivered; return how many are still queued."""
        return self._producer.flush(timeout)
