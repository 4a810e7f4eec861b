"""Sends the spool's records to Kafka in order and acknowledges them as the broker confirms.

Batches: up to ``max_in_flight`` records go to an idempotent producer that never gives up on
a record (``message.timeout.ms`` 0); when the producer holds none of them any more, the
batch is acknowledged in the spool and the next one goes. While the broker is away, one
batch waits inside librdkafka and everything after it in the spool on disk; when it
returns, they go out once each and in order. Only failures are reported back
(``delivery.report.only.error``): a record the broker refuses for good (too large, unknown
topic) is logged, counted and skipped.
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import KafkaError, Producer

from producers.spool import Position, Spool
from schemas.kafka_config import producer_config

log = logging.getLogger(__name__)


class Forwarder:
    def __init__(self, spool: Spool, bootstrap: str, max_in_flight: int = 20_000, **overrides: object) -> None:
        self.spool = spool
        self.max_in_flight = max_in_flight
        config = {
            "message.timeout.ms": 0,
            "queue.buffering.max.messages": max_in_flight + 1000,
            "delivery.report.only.error": True,
            "linger.ms": 5,  # a batch is acknowledged when its last record is: do not hold it back
            "on_delivery": self._on_error,
        }
        config.update(overrides)
        self.producer = Producer(producer_config(bootstrap, **config))
        self._batch_end: Position | None = None  # end of the batch in flight
        self._batch_size = 0
        self.sent = 0
        self.failed = 0

    def _on_error(self, err: KafkaError | None, msg: object) -> None:
        if err is not None:
            self.failed += 1
            log.error("the broker refused a spooled record for good (%s); skipping it", err)

    def step(self, wait_s: float = 0.1) -> int:
        """Confirm the batch in flight if the producer is done with it, else send the next one;
        returns records sent."""
        self.producer.poll(0)
        if self._batch_end is not None:
            if len(self.producer) > 0:
                self.producer.poll(wait_s)
                return 0
            self.spool.acknowledge(self._batch_end, self._batch_size)
            self._batch_end, self._batch_size = None, 0
        end, n = self.spool.send(self.spool.cursor(), self.max_in_flight, self.producer.produce)
        if not n:
            self.producer.poll(wait_s)
            return 0
        self._batch_end, self._batch_size = end, n
        self.sent += n
        return n

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.step()

    def drain(self, timeout_s: float = 30.0) -> bool:
        """Send and confirm everything spooled so far; True if nothing is left."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.step(0.05)
            if self._batch_end is None and self.spool.pending() == 0:
                return True
        return self._batch_end is None and self.spool.pending() == 0
