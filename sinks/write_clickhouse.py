"""Writes batches of decoded records into ClickHouse (embedded ``chdb://`` or a server).

Column-oriented inserts, one per table and batch; transient server errors are retried with
bounded backoff; rows that ClickHouse rejects as bad data are isolated by bisection and
returned with the error code, so the rest of the batch still lands.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError, DatabaseError

from sinks.clickhouse_client import error_code, is_transient
from sinks.clickhouse_ddl import (
    KAFKA_COLUMNS,
    MIGRATIONS,
    MIGRATIONS_TABLE,
    TABLES,
    Table,
    alterations,
    created,
    derived,
    grouped,
)

log = logging.getLogger(__name__)

# The names gpufleet's queries give their tables (``FROM {db}.workflow_windows AS w ... JOIN (...)
# AS s``). ClickHouse's analyzer resolves ``s.workflow_windows`` to the alias ``s`` where one is in
# scope, quoted or not, so a database of such a name cannot hold the views or answer the reports:
# it is refused where it is named. A test reads every query's qualifiers and holds this complete.
QUERY_ALIASES = frozenset({"a", "e", "f", "hw", "j", "loss", "m", "meta", "r", "s", "w"})
CLICKHOUSE_OWN = frozenset({"system", "information_schema"})  # (any case: INFORMATION_SCHEMA too)


@dataclass(frozen=True)
class Row:
    """A record with the Kafka position it came from: partition, offset, and the topic's name
    and Kafka's id of it (a topic deleted and created again under its name has a new id)."""

    partition: int
    offset: int
    record: dict
    topic: str = ""
    topic_id: str = ""

    size = 1  # rows


@dataclass(frozen=True)
class Block:
    """The samples of a ``GpuSampleColumns`` block (``schemas.sample_columns``: the fields
    every sample shares once, a list per other field or None where no sample reports it)
    with the Kafka position of the message they came in: inserted column by column, without
    a dict per sample."""

    partition: int
    offset: int
    columns: dict
    topic: str = ""
    topic_id: str = ""

    @property
    def size(self) -> int:
        return len(self.columns["event_time"])


@dataclass(frozen=True)
class Position:
    """Where a table's rows came from in Kafka: the sink resumes after the highest offset."""

    topic: str
    topic_id: str
    partition: int


@dataclass(frozen=True)
class Rejected:
    row: Row | Block
    code: int | None
    reason: str


class ClickHouseWriter:
    def __init__(self, client: Client, database: str = "gpufleet",
                 retries: int = 5, backoff_s: float = 0.2, cluster: str | None = None) -> None:
        self.check_database(database)
        self.client = client
        self.database = database
        self.cluster = cluster  # a ClickHouse cluster's name: the tables are created on it
        self.retries = retries
        self.backoff_s = backoff_s

    @staticmethod
    def check_database(database: str) -> None:
        """Refuses a name that is not one identifier, and one that ClickHouse would read as
        something else in gpufleet's queries (``QUERY_ALIASES``, ``CLICKHOUSE_OWN``)."""
        if not database or not database.replace("_", "").isalnum() or not database.isascii():
            raise ValueError(f"database name {database!r} must be ASCII letters, digits and _")
        if database.isdigit():
            raise ValueError(f"database name {database!r} is a number to ClickHouse: give it a letter or _")
        if database in QUERY_ALIASES:
            raise ValueError(f"database name {database!r} is a name gpufleet's queries give a table: ClickHouse "
                             f"would take {database}.<table> for that table, not the database's; choose another name "
                             f"(not one of {', '.join(sorted(QUERY_ALIASES))})")
        if database.lower() in CLICKHOUSE_OWN:
            raise ValueError(f"database name {database!r} is ClickHouse's own; choose another name")

    def ensure_tables(self) -> None:
        """Create the database and tables if they do not exist, then apply the migrations this
        database has not had yet (idempotent). On a cluster, the tables are created at their
        current definitions and the migrations recorded as applied (``sinks.clickhouse_cluster``)."""
        if self.cluster:
            self._ensure_cluster_tables()
            return
        db = self.database
        self.client.command(f"CREATE DATABASE IF NOT EXISTS {db}")
        for t in TABLES:
            self.client.command(created(db, t))
        # Only what a table lacks is altered, in as few statements as ClickHouse takes: an ALTER
        # costs ~8-13 ms on the embedded engine whether it changes anything or not (and a round
        # trip to a server), and the tables took 218 of them at each start, new or not.
        columns = {(t, c) for t, c in self.client.query(
            "SELECT table, name FROM system.columns WHERE database = {db:String}", parameters={"db": db}).result_rows}
        definitions = dict(self.client.query("SELECT name, create_table_query FROM system.tables "
                                             "WHERE database = {db:String}", parameters={"db": db}).result_rows)
        lacking = [a for t in TABLES for a in alterations(db, t) if not a.done(columns, definitions)]
        for statement in [*grouped(lacking), *derived(db)]:
            self.client.command(statement)
        self.client.command(MIGRATIONS_TABLE.format(db=db))
        done = {r[0] for r in self.client.query(f"SELECT version FROM {db}.schema_migrations").result_rows}
        for version, description, statements in MIGRATIONS:
            if version in done:
                continue
            for statement in statements:
                self.client.command(statement.format(db=db).strip())
            self.client.insert("schema_migrations", [[version, description]], column_names=["version", "description"],
                               database=db)
            log.info("applied migration %d to %s: %s", version, db, description)

    def _ensure_cluster_tables(self) -> None:
        from sinks.clickhouse_cluster import cluster_statements

        for statement in cluster_statements(self.database, self.cluster):
            self.client.command(statement)
        done = {r[0] for r in self.client.query(f"SELECT version FROM {self.database}.schema_migrations").result_rows}
        rows = [[version, description] for version, description, _ in MIGRATIONS if version not in done]
        if rows:
            self.client.insert("schema_migrations", rows, column_names=["version", "description"],
                               database=self.database)

    def resume_offsets(self, table: Table, topics: Sequence[str]) -> dict[Position, int]:
        """The next Kafka offset after the rows of ``topics`` stored in ``table``, per topic
        incarnation and partition; read from the table's offsets projection, not its rows."""
        result = self.client.query(offsets_query(self.database, table), parameters={"topics": list(topics)})
        return {Position(t, i, int(p)): int(o) + 1 for t, i, p, o in result.result_rows}

    def insert(self, table: Table, rows: Sequence[Row] | Sequence[Block]) -> list[Rejected]:
        """Insert ``rows`` (records, or blocks of samples); return those ClickHouse refused
        as bad data (others raise). Rows that the table keeps aside (``Table.aside``) go to their
        own table first."""
        if not rows:
            return []
        if table.aside is not None:
            return [r for target, part in placed(table, rows) for r in self.insert(target, part)]
        try:
            self._insert_with_retry(table, rows)
            return []
        except (DatabaseError, ValueError, TypeError) as exc:
            # DataError (a DatabaseError) and ValueError/TypeError come from the client's
            # serialisation of a bad value; other DatabaseErrors carry the server's code.
            if is_transient(exc):
                raise
            if len(rows) == 1:
                return [Rejected(rows[0], error_code(exc), str(exc).splitlines()[0][:500])]
            log.warning("insert into %s refused (%s); isolating the bad rows", table.name, error_code(exc))
            mid = len(rows) // 2
            return self.insert(table, rows[:mid]) + self.insert(table, rows[mid:])

    def _insert_with_retry(self, table: Table, rows: Sequence[Row] | Sequence[Block]) -> None:
        # A retry after an ambiguous failure (the server stored the block, the answer was
        # lost) must not store it twice: the same rows always carry the same token.
        settings = {"insert_deduplication_token": deduplication_token(table, rows)}
        columns = block_columns(table, rows) if isinstance(rows[0], Block) else row_columns(table, rows)
        names = [*table.columns, *KAFKA_COLUMNS]
        for attempt in range(self.retries + 1):
            try:
                self.client.insert(table.name, columns, column_names=names, column_oriented=True,
                                   database=self.database, settings=settings)
                return
            except ClickHouseError as exc:
                if attempt == self.retries or not is_transient(exc):
                    raise
                delay = self.backoff_s * 2**attempt
                log.warning("insert into %s failed (%s), retry %d in %.1fs", table.name, exc, attempt + 1, delay)
                time.sleep(delay)


def placed(table: Table, rows: Sequence[Row]) -> list[tuple[Table, list[Row]]]:
    """Where ``rows`` of ``table`` go, in the order to insert them: those it keeps aside
    (``Table.aside``) first, to their own table; the rest to ``table``. Empty parts left out."""
    if table.aside is None:
        return [(table, list(rows))]
    apart, belongs = table.aside
    parts = [(apart, [r for r in rows if belongs(r.record)]), (replace(table, aside=None), [r for r in rows
                                                                                          if not belongs(r.record)])]
    return [(t, part) for t, part in parts if part]


def row_columns(table: Table, rows: Sequence[Row]) -> list[list[Any]]:
    """The insert's columns (the table's, then the Kafka position) from one record per row."""
    records = [r.record for r in rows]
    if table.prepare is not None:
        records = [table.prepare(r) for r in records]
    columns: list[list[Any]] = [[r.get(c) for r in records] for c in table.columns]
    columns.append([r.partition for r in rows])
    columns.append([r.offset for r in rows])
    columns.append([r.topic for r in rows])
    columns.append([r.topic_id for r in rows])
    return columns


def block_columns(table: Table, blocks: Sequence[Block]) -> list[list[Any]]:
    """The insert's columns from blocks of samples: each block's column as it came, a shared
    field or a field no sample of the block reports repeated for each of its samples."""
    columns: list[list[Any]] = []
    for name in table.columns:
        column: list[Any] = []
        for b in blocks:
            value = b.columns[name]
            column += value if isinstance(value, list) else [value] * b.size
        columns.append(column)
    for position in ("partition", "offset", "topic", "topic_id"):
        columns.append([v for b in blocks for v in [getattr(b, position)] * b.size])
    return columns


def offsets_query(database: str, table: Table) -> str:
    """The highest offset per topic incarnation and partition of the topics given as the
    parameter ``topics``: answered from the table's offsets projection."""
    return (f"SELECT kafka_topic, kafka_topic_id, kafka_partition, max(kafka_offset) FROM {database}.{table.name} "
            "WHERE kafka_topic IN {topics:Array(String)} GROUP BY kafka_topic, kafka_topic_id, kafka_partition")


def deduplication_token(table: Table, rows: Sequence[Row] | Sequence[Block]) -> str:
    """The table, the topics and the Kafka offset ranges of ``rows``, per partition: the same
    batch read again after a crash or retried after a lost answer gets the same token, and the
    same offsets of another topic (another prefix, a topic created again) another one."""
    ranges: dict[tuple[str, str, int], list[int]] = {}
    for r in rows:
        span = ranges.setdefault((r.topic, r.topic_id, r.partition), [r.offset, r.offset, 0])
        span[0], span[1], span[2] = min(span[0], r.offset), max(span[1], r.offset), span[2] + 1
    parts = ",".join(f"{t}#{i}[{p}]:{lo}-{hi}x{n}" for (t, i, p), (lo, hi, n) in sorted(ranges.items()))
    return f"{table.name}/{parts}"


def table_for_topic(topic: str, prefix: str = "") -> Table:
    for table in TABLES:
        if prefix + table.topic.name == topic:
            return table
    raise KeyError(f"no table for topic {topic!r}")
