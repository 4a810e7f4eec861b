"""Sends the spool's records to Kafka in order and acknowledges them as the broker confirms.

The producer is idempotent and never gives up on a record (``message.timeout.ms`` 0): while
the broker is away, librdkafka holds at most ``max_in_flight`` records and the rest wait in
the spool on disk; when it returns, they go out once each and in order. A record the broker
refuses for good (too large, unknown topic) is logged, counted and skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from confluent_kafka import KafkaError, Producer

from producers.spool import Position, Spool
from schemas.kafka_config import producer_config

log = logging.getLogger(__name__)


class Forwarder:
    def __init__(self, spool: Spool, bootstrap: str, max_in_flight: int = 20_000, **overrides: object) -> None:
        self.spool = spool
        self.max_in_flight = max_in_flight
        config = {"message.timeout.ms": 0, "queue.buffering.max.messages": max_in_flight + 1000}
        config.update(overrides)
        self.producer = Producer(producer_config(bootstrap, **config))
        self._next = spool.cursor()
        self._in_flight: deque[Position] = deque()
        self._done: set[Position] = set()
        self._lock = threading.Lock()
        self.sent = 0
        self.failed = 0

    def _on_delivery(self, position: Position, err: KafkaError | None) -> None:
        with self._lock:
            if err is not None:
                self.failed += 1
                log.error("the broker refused a spooled record for good (%s); skipping it", err)
            self._done.add(position)

    def _acknowledge(self) -> None:
        last, n = None, 0
        with self._lock:
            while self._in_flight and self._in_flight[0] in self._done:
                last = self._in_flight.popleft()
                self._done.discard(last)
                n += 1
        if last is not None:
            self.spool.acknowledge(last, n)

    def step(self, wait_s: float = 0.1) -> int:
        """Send what the spool holds (up to the in-flight limit), serve delivery reports; returns records sent."""
        n = 0
        room = self.max_in_flight - len(self._in_flight)
        if room > 0:
            for record in self.spool.read(max(self._next, self.spool.cursor()), limit=min(room, 5000)):
                self.producer.produce(
                    record.topic, value=record.value, key=record.key,
                    on_delivery=lambda err, msg, pos=record.position: self._on_delivery(pos, err),
                )
                self._in_flight.append(record.position)
                self._next = record.position
                n += 1
        self.producer.poll(wait_s if n == 0 else 0)
        self._acknowledge()
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
            if not self._in_flight and self.spool.pending() == 0:
                return True
        self.producer.flush(max(0.0, deadline - time.monotonic()))
        self._acknowledge()
        return not self._in_flight and self.spool.pending() == 0
