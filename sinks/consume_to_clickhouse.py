"""Consumes gpufleet's topics and writes them to ClickHouse: batch, insert, then commit.

Exactly-once into ClickHouse under at-least-once Kafka delivery: every row stores its Kafka
topic (name and Kafka's id of it), partition and offset, and on each partition assignment
the sink starts after the highest offset already stored for that topic and partition, so a
batch inserted just before a crash (and not yet committed) is skipped rather than inserted
again. Several sinks in one group share the partitions; each resumes only its own.

Where Kafka and ClickHouse disagree, the sink says so and never skips data:
* rows of the same topic name with another topic id (the topic was deleted and created
  again, or this is another cluster) are not this topic's: the partition is read from
  Kafka's committed offset (or its start), with a warning naming both ids;
* rows of this very topic beyond the partition's end (the log was truncated: data lost in
  Kafka after it reached ClickHouse) stop the sink with ``OffsetsDisagree``: no offset can be
  trusted there without an operator.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from confluent_kafka import (
    OFFSET_INVALID,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from kafka_client.config import Connection, client_config
from kafka_client.consume_loop import ConsumeLoop
from kafka_client.metrics import ComponentMetrics
from schemas.codec import Codec
from schemas.sample_columns import blocks_of
from schemas.topics import (
    GPU_SAMPLES,
    HOST_SAMPLES,
    PROFILE_STATUSES,
    WORKFLOW_EVENTS,
)
from schemas.validate_ids import ids_error
from sinks.clickhouse_ddl import TABLES, Table
from sinks.ddl_samples import GPU_SAMPLES_TABLE
from sinks.insert_sample_columns import Message, SampleColumnsInsert
from sinks.resume_offsets import resume_plan, retried, topic_ids
from sinks.write_clickhouse import (
    Block,
    ClickHouseWriter,
    Position,
    Row,
    deduplication_token,
    placed,
    table_for_topic,
)

log = logging.getLogger(__name__)

STAGE = "clickhouse-sink"
# Topics the host agents write and the sink stores as they come (the GPU samples are checked
# whole, ids included, by blocks_of): their ids are checked here.
FROM_HOSTS = (HOST_SAMPLES, WORKFLOW_EVENTS, PROFILE_STATUSES)



def received_ms(message) -> int | None:
    """When Kafka received a confluent-kafka message (its record's timestamp), or None."""
    kind, ms = message.timestamp()
    return ms if kind != TIMESTAMP_NOT_AVAILABLE and ms > 0 else None

METRICS = ComponentMetrics("sink")
ROWS = METRICS.counter("gpufleet_sink_rows", "Rows inserted into ClickHouse, by table", ["table"])
INSERT_SECONDS = METRICS.histogram("gpufleet_sink_insert_seconds", "Time of one insert into ClickHouse, by table",
                                   ["table"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
SAMPLE_BATCHES = METRICS.counter(
    "gpufleet_sink_sample_batches", "Batches of GPU samples, by who decoded and checked them: clickhouse "
    "(its own Avro parser) or python (older formats, or a batch with a message that fails a check)", ["path"])


@dataclass
class SinkStats:
    rows: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    dead_letters: int = 0
    batches: int = 0
    # Batches of GPU samples that ClickHouse decoded and checked itself, and those it left to
    # the Python path (a message of an older format, or one that fails a check).
    samples_in_sql: int = 0
    samples_in_python: int = 0


class ClickHouseSink:
    def __init__(
        self,
        kafka: str | Connection,
        writer: ClickHouseWriter,
        group_id: str = "gpufleet-clickhouse-sink",
        topic_prefix: str = "",
        tables: tuple[Table, ...] = TABLES,
        batch_rows: int = 20_000,
        batch_wait_s: float = 1.0,
        consumer_overrides: dict | None = None,
        sample_columns_in_sql: bool = True,
        fence_s: float = 1800.0,
    ) -> None:
        self.writer = writer
        self.prefix = topic_prefix
        self.tables = tables
        self.batch_rows = batch_rows
        self.batch_wait_s = batch_wait_s
        self.codec = Codec()
        self.stats = SinkStats()
        topics = list(dict.fromkeys(topic_prefix + t.topic.name for t in tables))  # two tables may share one
        self.loop = ConsumeLoop(kafka, group_id, topics, METRICS, STAGE, topic_prefix, consumer_overrides,
                                codec=self.codec)
        self.consumer = self.loop.consumer
        self.admin = AdminClient(client_config(kafka))
        self.topic_ids: dict[str, str] = {}  # topic -> Kafka's id of it, refreshed on each assignment
        # (topic, partition) -> until when (monotonic) what ClickHouse holds of it is read again
        # before each insert: see ``_not_stored``; ``fence_s``: how long a held insert of the
        # partition's previous reader may still land (its retries wait up to 6 x a server client's
        # 300 s read timeout; ``gpufleet sink --fence-s``, as long as the watchdog's 1800 s).
        self.fence_s = fence_s
        self._fenced: dict[tuple[str, int], float] = {}
        self.samples_topic = topic_prefix + GPU_SAMPLES.name
        self.columns = (
            SampleColumnsInsert(writer.client, writer.database, self.codec, writer.retries, writer.backoff_s)
            if any(t.topic is GPU_SAMPLES for t in tables) and sample_columns_in_sql
            else None
        )

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assigned = [(tp.topic, tp.partition) for tp in partitions]
        until = time.monotonic() + self.fence_s
        self._fenced.update((tp, until) for tp in assigned)
        self.topic_ids.update(topic_ids(self.admin, sorted({t for t, _ in assigned})))
        committed = {(tp.topic, tp.partition): tp.offset
                     for tp in retried(lambda: consumer.committed(partitions, timeout=30), "committed offsets")}
        stored = self._stored({t for t, _ in assigned})
        ends = {(p.topic, p.partition): retried(
                    lambda p=p: consumer.get_watermark_offsets(TopicPartition(p.topic, p.partition), timeout=30)[1],
                    f"the end of {p.topic}[{p.partition}]")
                for p in stored if (p.topic, p.partition) in set(assigned)}
        seek, warnings = resume_plan(assigned, self.topic_ids, stored, committed, ends)
        for warning in warnings:
            log.warning("%s", warning)
        ahead = []
        for tp in partitions:
            resume = seek.get((tp.topic, tp.partition))
            if resume is not None:
                log.info("%s[%d]: resuming at %d after rows already in ClickHouse (committed %d)",
                         tp.topic, tp.partition, resume, committed.get((tp.topic, tp.partition), OFFSET_INVALID))
                tp.offset = resume
                ahead.append(TopicPartition(tp.topic, tp.partition, resume))
        consumer.assign(partitions)
        if ahead:
            # Commit what ClickHouse already holds: a partition with nothing new to read would
            # otherwise keep the crashed run's lag (and its replay) forever. Refused (the group
            # is rebalancing again), it is committed on the next assignment.
            try:
                retried(lambda: consumer.commit(offsets=ahead, asynchronous=False), "offsets already stored")
            except KafkaException as exc:
                log.warning("the offsets already in ClickHouse could not be committed now (%s)", exc)

    def run(self, stop: threading.Event) -> SinkStats:
        """Consume until ``stop`` is set; everything consumed by then is inserted and committed."""
        self.writer.ensure_tables()
        self.loop.run(stop, self._step, self.batch_rows, self.batch_wait_s, on_assign=self._on_assign)
        return self.stats

    def _step(self, messages: list) -> None:
        if messages:
            self._write(messages)

    def run_batch(self, stop: threading.Event) -> int:
        """Collect up to ``batch_rows`` messages or ``batch_wait_s``, insert, commit. Returns messages."""
        messages = self.loop.batch(stop, self.batch_rows, self.batch_wait_s)
        self._step(messages)
        return len(messages)

    def _stored(self, topics: set[str]) -> dict[Position, int]:
        """The next offset after the rows ClickHouse holds of ``topics``, per topic incarnation and
        partition, read from the offsets projection of each one's table."""
        stored: dict[Position, int] = {}
        by_table: dict[str, tuple[Table, set[str]]] = {}
        for topic in topics:
            table = table_for_topic(topic, self.prefix)
            by_table.setdefault(table.name, (table, set()))[1].add(topic)
        for table, of_table in by_table.values():
            stored.update(self.writer.resume_offsets(table, sorted(of_table)))
        return stored

    def _not_stored(self, messages: list) -> list:
        """``messages`` less those that ClickHouse holds already, on partitions given to this sink
        within ``fence_s``. Their previous reader may have lost them while its insert was held up
        (past the poll interval), and that insert can land after this sink read, at its
        assignment, where to resume: found by the soak, a batch stored twice (the next reader's
        batches had other bounds, so another deduplication token). Such a batch is stored before
        this sink's insert of it, or with it: the insert that comes between this read and this
        sink's own is not caught (ClickHouse has no transaction to make the two one)."""
        now = time.monotonic()
        self._fenced = {tp: until for tp, until in self._fenced.items() if until > now}
        if not self._fenced:
            return messages  # (once the fences are over: nothing per message)
        fenced = {(m.topic(), m.partition()) for m in messages} & self._fenced.keys()
        if not fenced:
            return messages
        stored = self._stored({t for t, _ in fenced})
        resume = {(p.topic, p.partition): offset for p, offset in stored.items()
                  if p.topic_id == self.topic_ids.get(p.topic, "") and (p.topic, p.partition) in fenced}
        keep = [m for m in messages if m.offset() >= resume.get((m.topic(), m.partition()), -1)]
        if len(keep) < len(messages):
            log.warning("%d messages of %s were stored by their partitions' previous reader after this sink was "
                        "given them: not stored again", len(messages) - len(keep), ", ".join(
                            f"{t}[{p}] up to offset {o - 1}" for (t, p), o in sorted(resume.items())))
        return keep

    def _write(self, messages: list) -> None:
        decode = self._insert_sample_columns(self._not_stored(messages))
        ok, errors = self.codec.decode_many([m.value() for m in decode])
        bad = [(decode[i], reason) for i, reason in errors]
        rows: dict[str, list[Row | Block]] = defaultdict(list)
        by_name = {}
        tables: dict[str, Table] = {}  # topic -> table, looked up once per batch
        for i, name, record in ok:
            m = decode[i]
            table = tables.get(m.topic())
            if table is None:
                table = tables[m.topic()] = table_for_topic(m.topic(), self.prefix)
            if not table.topic.carries(name):
                bad.append((m, f"expected {table.topic.schema} on {m.topic()}, got {name}"))
                continue
            by_name[table.name] = table
            topic_id = self.topic_ids.get(m.topic(), "")
            if table.topic is GPU_SAMPLES:  # blocks of samples, stored column by column
                blocks, reasons = blocks_of(name, record, received_ms(m))
                bad += [(m, reason) for reason in reasons]
                rows[table.name] += [Block(m.partition(), m.offset(), b, m.topic(), topic_id) for b in blocks]
                continue
            if table.topic in FROM_HOSTS and (reason := ids_error(record)):  # what the worker did not check
                bad.append((m, reason))
                continue
            rows[table.name].append(Row(m.partition(), m.offset(), record, m.topic(), topic_id))
        # What cannot be stored is dead-lettered, durably, before any row after it is: a sink
        # restarted after a kill between its insert and its commit resumes after the highest offset
        # stored, and would never read these records again (tests/integration/test_sink_crash_dead_letters.py).
        self._dead_letter(bad)
        index = {(m.topic(), m.partition(), m.offset()): m for m in messages}
        refused = []
        # Each table's rows where they go (``placed``: capacity no job held to its own table first).
        for table, table_rows in [part for name, batch in rows.items() for part in placed(by_name[name], batch)]:
            with INSERT_SECONDS.labels(table.name).time():
                rejected = self.writer.insert(table, table_rows)
            for r in rejected:
                m = index[(r.row.topic, r.row.partition, r.row.offset)]
                refused.append((m, f"ClickHouse refused the row (code {r.code}): {r.reason}"))
            stored = sum(r.size for r in table_rows) - sum(r.row.size for r in rejected)
            self.stats.rows[table.name] += stored
            ROWS.labels(table.name).inc(stored)
        self._dead_letter(refused)
        self._commit(messages)  # once the dead letters are durable (kafka_client.consume_loop)
        self.stats.batches += 1

    def _dead_letter(self, bad: list) -> None:
        """A dead letter for each record and its reason, on the broker before this returns
        (``NotDurable`` otherwise: nothing is stored or committed, and the batch is read again)."""
        for m, reason in bad:
            self.loop.dead_letter(reason, m)
        self.stats.dead_letters += len(bad)
        if bad:
            self.loop.durable()

    def _insert_sample_columns(self, messages: list) -> list:
        """The batch's samples through ClickHouse's own Avro parser (``sinks.insert_sample_columns``)
        where every message of the samples topic is the newest ``GpuSampleColumns`` or carries
        no samples (a ``PartitionClock`` or a job's end, decoded as before); the messages left to decode in
        Python. Where ClickHouse does not take them, the samples all go that way, so that a
        batch's samples land in one insert either way."""
        if self.columns is None:
            return messages
        samples = [m for m in messages if m.topic() == self.samples_topic]
        columns = [m for m in samples if self.columns.accepts(m.value())]
        clocks = sum(self.columns.carries_no_samples(m.value()) for m in samples)
        if len(samples) == clocks:
            return messages  # no samples in this batch
        stored = None
        if len(columns) + clocks == len(samples):
            topic_id = self.topic_ids.get(self.samples_topic, "")
            batch = [Message(m.partition(), m.offset(), m.value(), m.topic(), topic_id, received_ms(m) or 0)
                     for m in columns]
            with INSERT_SECONDS.labels(GPU_SAMPLES_TABLE.name).time():
                stored = self.columns.insert(batch, deduplication_token(GPU_SAMPLES_TABLE, batch))
        if stored is None:
            self.stats.samples_in_python += 1
            SAMPLE_BATCHES.labels("python").inc()
            return messages
        self.stats.samples_in_sql += 1
        SAMPLE_BATCHES.labels("clickhouse").inc()
        self.stats.rows[GPU_SAMPLES_TABLE.name] += stored
        ROWS.labels(GPU_SAMPLES_TABLE.name).inc(stored)
        taken = set(map(id, columns))
        return [m for m in messages if id(m) not in taken]

    def _commit(self, messages: list) -> None:
        """Commit the positions after ``messages``; only ever called after their inserts
        succeeded (``kafka_client.commit_offsets``: a rebalance or a coordinator that moved is not
        an error)."""
        self.loop.commit(messages)
