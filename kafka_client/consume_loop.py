"""The consume-process-commit loop of every component that reads topics with confluent-kafka
(the ClickHouse sink, the notifier, the enforcer, the Slurm comment writer), with one rule:

    a batch's offsets are committed only once everything produced for it is durable.

``commit`` flushes the producer first and checks the flush: records still undelivered after
``flush_timeout_s`` stop the loop (``NotDurable``) without committing, so the component exits,
is restarted by its supervisor and reads the batch again from the last commit; at least once,
and each component's work is idempotent (the sink's deduplication tokens, the notifier's sent
log, the enforcer's claims). A commit refused because the partitions moved or the coordinator
moved is not an error (``kafka_client.commit_offsets``).

Dead letters go through ``dead_letter`` (the reason, the source topic, partition and offset;
logged and counted). A consume error is logged and counted by its code
(``gpufleet_consume_errors``); a fatal one stops the loop. Every component serves the same
metrics (``kafka_client.metrics.ComponentMetrics``): records in and out, dead letters by kind,
consumer lag, consume errors.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer

from kafka_client.commit_offsets import Committer
from kafka_client.config import Connection, consumer_config, producer_config
from kafka_client.leave_group import leave_and_close
from kafka_client.metrics import ComponentMetrics, consumer_lag
from kafka_client.watchdog import Watchdog
from schemas.codec import Codec
from schemas.dead_letter import dead_letter
from schemas.topics import DEAD_LETTERS

log = logging.getLogger(__name__)

LAG_EVERY_S = 5.0


class NotDurable(RuntimeError):
    """Records produced for a batch were not delivered in time: its offsets are not committed."""


class ConsumeLoop:
    def __init__(self, kafka: str | Connection, group_id: str, topics: Iterable[str], metrics: ComponentMetrics,
                 stage: str, topic_prefix: str = "", consumer_overrides: dict | None = None,
                 flush_timeout_s: float = 30.0, codec: Codec | None = None) -> None:
        self.topics, self.metrics, self.stage = list(topics), metrics, stage
        self.flush_timeout_s = flush_timeout_s
        self.codec = codec or Codec()
        self.consumer = Consumer(consumer_config(kafka, group_id, **(consumer_overrides or {})))
        self.producer = Producer(producer_config(kafka))
        self.committer = Committer(self.consumer)
        self.dead_letter_topic = topic_prefix + DEAD_LETTERS.name
        self.dead_letters = 0
        self.consume_errors = 0
        self._lag_at = 0.0
        # the process ends where a round of the loop (or its leaving the group) stalls: set by the
        # command that runs the component (``kafka_client.watchdog``: one per process)
        self.watchdog: Watchdog | None = None

    # -- the loop -------------------------------------------------------------------------------

    def run(self, stop: threading.Event, step: Callable[[list[Message]], None], batch_size: int = 500,
            batch_wait_s: float = 0.5, on_assign=None, on_revoke=None, on_lost=None) -> None:
        """Subscribe, then ``step(batch)`` for every batch (empty ones too: a component may act on
        time) until ``stop`` is set; ``step`` commits what it has done through ``commit``.
        ``on_revoke`` is called with the partitions taken away in a rebalance (their offsets may
        still be committed), ``on_lost`` with those lost (they may not; ``on_revoke`` where not given)."""
        callbacks = {"on_assign": on_assign, "on_revoke": on_revoke, "on_lost": on_lost or on_revoke}
        self.consumer.subscribe(self.topics, **{k: f for k, f in callbacks.items() if f is not None})
        try:
            while not stop.is_set():
                self._alive()
                step(self.batch(stop, batch_size, batch_wait_s))
                self._report_lag()
        finally:
            self._alive()
            leave_and_close(self.consumer)  # (not close() alone: kafka_client.leave_group says why)
            self.producer.flush(self.flush_timeout_s)
            if self.watchdog is not None:
                self.watchdog.stop()

    def _alive(self) -> None:
        if self.watchdog is not None:
            self.watchdog.alive()

    def batch(self, stop: threading.Event, size: int, wait_s: float) -> list[Message]:
        """Up to ``size`` messages, within ``wait_s``; consume errors logged, counted, and a
        fatal one raised."""
        messages: list[Message] = []
        deadline = time.monotonic() + wait_s
        while len(messages) < size and not stop.is_set():
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                break
            for m in self.consumer.consume(num_messages=size - len(messages), timeout=timeout):
                error = m.error()
                if error is None:
                    messages.append(m)
                else:
                    self._consume_error(error)
        for topic in {m.topic() for m in messages}:
            self.metrics.records_in(topic, sum(1 for m in messages if m.topic() == topic))
        return messages

    def _consume_error(self, error: KafkaError) -> None:
        self.consume_errors += 1
        self.metrics.consume_error(error.name())
        if error.fatal():
            raise KafkaException(error)
        if error.code() == KafkaError._PARTITION_EOF:
            return
        log.error("consume error (%s): %s", error.name(), error.str())

    def _report_lag(self) -> None:
        if time.monotonic() - self._lag_at >= LAG_EVERY_S:
            self.metrics.set_lag(consumer_lag(self.consumer))
            self._lag_at = time.monotonic()

    # -- what a step does --------------------------------------------------------------------

    def produce(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self.producer.produce(topic, value=value, key=key)
        self.metrics.records_out(topic)

    def dead_letter(self, reason: str, message: Message | None = None, *, topic: str | None = None,
                    partition: int = -1, offset: int = -1, key: bytes | None = None, value: bytes | None = None,
                    stage: str | None = None) -> None:
        """A dead letter with the reason and its source: ``message``, or the topic, partition,
        offset, key and value given (a record of the component's own)."""
        if message is not None:
            topic, partition, offset, key, value = (message.topic(), message.partition(), message.offset(),
                                                    message.key(), message.value())
        stage = stage or self.stage
        log.warning("dead-letter %s[%d]@%d: %s", topic, partition, offset, reason)
        record = dead_letter(stage, reason, topic or "", partition, offset, key, value)
        self.produce(self.dead_letter_topic, self.codec.encode(DEAD_LETTERS.schema, record))
        self.metrics.dead_letter(stage, reason)
        self.dead_letters += 1

    def durable(self) -> None:
        """Wait until the broker has everything produced so far; NotDurable where it does not
        within ``flush_timeout_s``."""
        left = self.producer.flush(self.flush_timeout_s)
        if left:
            raise NotDurable(f"{left} record(s) produced for this batch were not delivered in "
                             f"{self.flush_timeout_s:g} s; its offsets are not committed, and it is read again")

    def commit(self, messages: Iterable[Message] = (), positions: dict[tuple[str, int], int] | None = None) -> bool:
        """Commit the positions after ``messages`` (or the ``positions`` given: topic and
        partition -> the next offset to read), once what was produced for them is durable."""
        self.durable()
        return self.committer.commit(list(messages), positions)
