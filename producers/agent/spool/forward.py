"""Sends the spool's records to Kafka in order and acknowledges them as the broker confirms.

Batches: up to ``max_in_flight`` records go to an idempotent producer that never gives up on
a record (``message.timeout.ms`` 0); when the producer holds none of them any more, the
batch is acknowledged in the spool and the next one goes. While the broker is away, one
batch waits inside librdkafka and everything after it in the spool on disk; when it
returns, they go out once each and in order. Only failures are reported back
(``delivery.report.only.error``): a record the broker refuses for good (too large, unknown
topic) is logged, counted and skipped.

With ``send_every_s`` the forwarder sends what the spool holds every so many seconds (at
once while a backlog drains), and merges the ``GpuSampleColumns`` messages of a send into one
per host and workflow: five 1 Hz ticks in one message instead of five. Part of the stream
worker's cost is per message (Faust's handling of each event), so it reads 10,000 GPUs at
1 Hz with room to spare this way (``benchmarks/bench_stream.py``); the samples are late by
at most that interval, within the windows' allowed lateness.
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import KafkaError, KafkaException, Producer

from kafka_client.config import Connection, producer_config
from producers.agent.spool.disk import Position, Spool
from schemas.codec import Codec, CodecError
from schemas.sample_columns import NAME as COLUMNS
from schemas.sample_columns import merged, shape_error
from schemas.topics import GPU_SAMPLES

log = logging.getLogger(__name__)


class SampleCoalescer:
    """Collects one send's records (``add``, as ``Producer.produce`` is called) and produces
    them (``flush``) with the ``GpuSampleColumns`` messages of each host and workflow merged,
    in order: a merged batch goes where its first part was, and any other record of the same
    topic and key closes it, so the records of a key keep their order."""

    def __init__(self, codec: Codec, max_samples: int = 1000) -> None:
        self.codec = codec
        self.max_samples = max_samples
        self._out: list = []  # (topic, key, value), or [topic, key, blocks] being merged
        self._open: dict[tuple[str, bytes | None], dict[str, list]] = {}

    def add(self, topic: str, value: bytes, key: bytes | None) -> None:
        if topic.endswith(GPU_SAMPLES.name):
            try:
                name, record = self.codec.decode(value)
            except CodecError:
                name = None  # sent as it is: the worker dead-letters it with the reason
            if name == COLUMNS and shape_error(record) is None:
                groups = self._open.setdefault((topic, key), {})
                group = groups.get(record["host"])
                if group is None:
                    group = groups[record["host"]] = [topic, key, []]
                    self._out.append(group)
                group[2].append(record)
                return
        self._open.pop((topic, key), None)
        self._out.append((topic, key, value))

    def flush(self, produce) -> int:
        """Produce what was collected; returns the number of messages."""
        n = 0
        for entry in self._out:
            if isinstance(entry, list):
                topic, key, blocks = entry
                for block in merged(blocks, self.max_samples):
                    produce(topic, value=self.codec.encode(COLUMNS, block), key=key)
                    n += 1
            else:
                produce(entry[0], value=entry[2], key=entry[1])
                n += 1
        self._out.clear()
        self._open.clear()
        return n


class Forwarder:
    def __init__(self, spool: Spool, kafka: str | Connection, max_in_flight: int = 20_000, send_every_s: float = 0.0,
                 clock=time.monotonic, **overrides: object) -> None:
        self.spool = spool
        self.max_in_flight = max_in_flight
        self.send_every_s = send_every_s
        self.clock = clock
        self._next_send = 0.0
        self.coalescer = SampleCoalescer(Codec()) if send_every_s > 0 else None
        config = {
            "message.timeout.ms": 0,
            "queue.buffering.max.messages": max_in_flight + 1000,
            "delivery.report.only.error": True,
            "linger.ms": 5,  # a batch is acknowledged when its last record is: do not hold it back
            "on_delivery": self._on_error,
        }
        config.update(overrides)
        self.producer = Producer(producer_config(kafka, **config))
        self._batch_end: Position | None = None  # end of the batch in flight
        self._batch_size = 0
        self.sent = 0
        self.messages = 0  # messages produced (fewer than records sent where batches merge)
        self.failed = 0

    def _on_error(self, err: KafkaError | None, msg: object) -> None:
        if err is not None:
            self.failed += 1
            log.error("the broker refused a spooled record for good (%s); skipping it", err)

    def _produce(self, topic: str, value: bytes | None = None, key: bytes | None = None) -> None:
        """Produce, and treat a record the client refuses at once (a topic the broker says does
        not exist) as one the broker refused for good: logged, counted, skipped."""
        try:
            self.producer.produce(topic, value=value, key=key)
        except KafkaException as exc:
            self._on_error(exc.args[0], None)

    def step(self, wait_s: float = 0.1, now: bool = False) -> int:
        """Confirm the batch in flight if the producer is done with it, else send the next one
        (when it is time, or ``now``); returns records sent."""
        self.producer.poll(0)
        if self._batch_end is not None:
            if len(self.producer) > 0:
                self.producer.poll(wait_s)
                return 0
            self.spool.acknowledge(self._batch_end, self._batch_size)
            self._batch_end, self._batch_size = None, 0
        started = self.clock()
        if not now and started < self._next_send:
            self.producer.poll(min(wait_s, self._next_send - started))
            return 0
        if self.coalescer is None:
            end, n = self.spool.send(self.spool.cursor(), self.max_in_flight, self._produce)
            messages = n
        else:
            end, n = self.spool.send(self.spool.cursor(), self.max_in_flight, self.coalescer.add)
            messages = self.coalescer.flush(self._produce)
        if not n:
            self.producer.poll(wait_s)
            return 0
        if n < self.max_in_flight:  # caught up: the next send in send_every_s; a backlog goes on at once
            self._next_send = started + self.send_every_s
        self._batch_end, self._batch_size = end, n
        self.sent += n
        self.messages += messages
        return n

    def hurry(self) -> None:
        """Send what the spool holds at the next step, not at the next send interval (a job's
        end: its summary waits on it). Safe from another thread."""
        self._next_send = 0.0

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.step()

    def drain(self, timeout_s: float = 30.0) -> bool:
        """Send and confirm everything spooled so far; True if nothing is left."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.step(0.05, now=True)
            if self._batch_end is None and self.spool.pending() == 0:
                return True
        return self._batch_end is None and self.spool.pending() == 0
