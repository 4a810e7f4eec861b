"""Consumes gpufleet's topics and writes them to ClickHouse: batch, insert, then commit.

Exactly-once into ClickHouse under at-least-once Kafka delivery: every row stores its
Kafka partition and offset, and on each partition assignment the sink starts after the
highest offset already stored, so a batch inserted just before a crash (and not yet
committed) is skipped rather than inserted again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_INVALID, Consumer, Producer, TopicPartition

from schemas.codec import Codec
from schemas.dead_letter import dead_letter
from schemas.kafka_config import consumer_config, producer_config
from schemas.sample_columns import samples_checked
from schemas.topics import DEAD_LETTERS, GPU_SAMPLES
from sinks.clickhouse_ddl import TABLES, Table
from sinks.write_clickhouse import ClickHouseWriter, Row, table_for_topic

log = logging.getLogger(__name__)

STAGE = "clickhouse-sink"


@dataclass
class SinkStats:
    rows: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    dead_letters: int = 0
    batches: int = 0


class ClickHouseSink:
    def __init__(
        self,
        bootstrap: str,
        writer: ClickHouseWriter,
        group_id: str = "gpufleet-clickhouse-sink",
        topic_prefix: str = "",
        tables: tuple[Table, ...] = TABLES,
        batch_rows: int = 20_000,
        batch_wait_s: float = 1.0,
    ) -> None:
        self.writer = writer
        self.prefix = topic_prefix
        self.tables = tables
        self.batch_rows = batch_rows
        self.batch_wait_s = batch_wait_s
        self.codec = Codec()
        self.stats = SinkStats()
        self.consumer = Consumer(consumer_config(bootstrap, group_id))
        self.producer = Producer(producer_config(bootstrap))
        self.dead_letter_topic = topic_prefix + DEAD_LETTERS.name

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        committed = {(tp.topic, tp.partition): tp.offset for tp in consumer.committed(partitions, timeout=30)}
        stored: dict[str, dict[int, int]] = {}
        ahead = []
        for tp in partitions:
            table = table_for_topic(tp.topic, self.prefix)
            if table.name not in stored:
                stored[table.name] = self.writer.resume_offsets(table)
            resume = stored[table.name].get(tp.partition)
            kafka = committed.get((tp.topic, tp.partition), OFFSET_INVALID)
            if resume is not None and (kafka < 0 or resume > kafka):
                log.info("%s[%d]: resuming at %d after rows already in ClickHouse (committed %d)",
                         tp.topic, tp.partition, resume, kafka)
                tp.offset = resume
                ahead.append(TopicPartition(tp.topic, tp.partition, resume))
        consumer.assign(partitions)
        if ahead:
            # Commit what ClickHouse already holds: a partition with nothing new to read would
            # otherwise keep the crashed run's lag (and its replay) forever.
            consumer.commit(offsets=ahead, asynchronous=False)

    def run(self, stop: threading.Event) -> SinkStats:
        """Consume until ``stop`` is set; everything consumed by then is inserted and committed."""
        self.writer.ensure_tables()
        self.consumer.subscribe([self.prefix + t.topic.name for t in self.tables], on_assign=self._on_assign)
        try:
            while not stop.is_set():
                self.run_batch(stop)
        finally:
            self.consumer.close()
            self.producer.flush(30)
        return self.stats

    def run_batch(self, stop: threading.Event) -> int:
        """Collect up to ``batch_rows`` messages or ``batch_wait_s``, insert, commit. Returns messages."""
        messages = []
        deadline = time.monotonic() + self.batch_wait_s
        while len(messages) < self.batch_rows and not stop.is_set():
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                break
            got = self.consumer.consume(num_messages=self.batch_rows - len(messages), timeout=timeout)
            for m in got:
                if m.error():
                    log.error("consume error: %s", m.error())
                else:
                    messages.append(m)
        if messages:
            self._write(messages)
        return len(messages)

    def _write(self, messages: list) -> None:
        ok, errors = self.codec.decode_many([m.value() for m in messages])
        bad = [(messages[i], reason) for i, reason in errors]
        rows: dict[str, list[Row]] = defaultdict(list)
        by_name = {}
        tables: dict[str, Table] = {}  # topic -> table, looked up once per batch
        for i, name, record in ok:
            m = messages[i]
            table = tables.get(m.topic())
            if table is None:
                table = tables[m.topic()] = table_for_topic(m.topic(), self.prefix)
            if not table.topic.carries(name):
                bad.append((m, f"expected {table.topic.schema} on {m.topic()}, got {name}"))
                continue
            by_name[table.name] = table
            if table.topic is GPU_SAMPLES:  # a sample, or a block or batch of them: one row each
                for sample, reason in samples_checked(name, record):
                    if reason:
                        bad.append((m, reason))
                    else:
                        rows[table.name].append(Row(m.partition(), m.offset(), sample))
                continue
            rows[table.name].append(Row(m.partition(), m.offset(), record))
        index = {(m.topic(), m.partition(), m.offset()): m for m in messages}
        for name, table_rows in rows.items():
            table = by_name[name]
            rejected = self.writer.insert(table, table_rows)
            for r in rejected:
                m = index[(self.prefix + table.topic.name, r.row.partition, r.row.offset)]
                bad.append((m, f"ClickHouse refused the row (code {r.code}): {r.reason}"))
            self.stats.rows[name] += len(table_rows) - len(rejected)
        for m, reason in bad:
            log.warning("dead-letter %s[%d]@%d: %s", m.topic(), m.partition(), m.offset(), reason)
            record = dead_letter(STAGE, reason, m.topic(), m.partition(), m.offset(), m.key(), m.value())
            self.producer.produce(self.dead_letter_topic, value=self.codec.encode(DEAD_LETTERS.schema, record))
        if bad:
            # The dead letters must be durable before the offsets of their sources are committed.
            if self.producer.flush(30):
                raise RuntimeError("dead letters could not be delivered; not committing offsets")
            self.stats.dead_letters += len(bad)
        self._commit()
        self.stats.batches += 1

    def _commit(self) -> None:
        """Commit the consumed positions; only ever called after the batch's inserts succeeded."""
        self.consumer.commit(asynchronous=False)
