"""ClickHouse tables of gpufleet: one per topic the sink writes, with the columns it fills. Each
table's DDL is beside its kin (``ddl_samples``, ``ddl_workflows``, ``ddl_alerts``,
``ddl_traces``); this module lists them all, and what is made from them, in order.

The same DDL runs on the embedded engine (``chdb://``) and on a server (``http(s)://``).
Every table keeps the Kafka topic (its name and Kafka's id of it), partition and offset of
each row, and a projection of the highest offset per topic and partition, kept in each part
with its rows: the sink resumes after them on a restart without reading the table, so a
replayed batch is never inserted twice, and rows of another topic (another prefix, a topic
deleted and created again, another cluster) are never mistaken for its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sinks.ddl_alerts import (
    ALERT_TRANSITIONS,
    ALERTS_TABLE,
    DEAD_LETTERS_TABLE,
    ENFORCEMENT_TABLE,
    OWNER_ACTIONS_TABLE,
)
from sinks.ddl_samples import GPU_SAMPLES_TABLE, HOST_SAMPLES_TABLE, ROLLUPS
from sinks.ddl_serving import SERVING_WINDOWS_TABLE
from sinks.ddl_traces import (
    FINDINGS_TABLE,
    PROFILE_REQUESTS_TABLE,
    PROFILE_STATUSES_TABLE,
    TRACE_ANALYSES_TABLE,
)
from sinks.ddl_workflows import (
    CAPACITY_VIEWS,
    CAPACITY_WINDOWS_TABLE,
    GOODPUT_VIEWS,
    JUDGED_WINDOWS_VIEW,
    WASTE_VIEW,
    WORKFLOW_EVENTS_TABLE,
    WORKFLOW_SUMMARIES_TABLE,
    WORKFLOW_WINDOWS_TABLE,
    WORKFLOWS,
)
from sinks.migrations import MIGRATIONS, MIGRATIONS_TABLE
from sinks.table import (
    DEDUPLICATION_WINDOW,
    KAFKA_COLUMNS,
    KAFKA_TOPIC_COLUMNS,
    OFFSETS_PROJECTION,
    OFFSETS_PROJECTION_CLAUSE,
    Table,
)

__all__ = [
    "ALERTS_TABLE",
    "CAPACITY_WINDOWS_TABLE",
    "DEAD_LETTERS_TABLE",
    "DERIVED",
    "ENFORCEMENT_TABLE",
    "FINDINGS_TABLE",
    "GPU_SAMPLES_TABLE",
    "HOST_SAMPLES_TABLE",
    "KAFKA_COLUMNS",
    "MIGRATIONS",
    "MIGRATIONS_TABLE",
    "OWNER_ACTIONS_TABLE",
    "PROFILE_REQUESTS_TABLE",
    "PROFILE_STATUSES_TABLE",
    "SERVING_WINDOWS_TABLE",
    "TABLES",
    "TRACE_ANALYSES_TABLE",
    "WORKFLOW_EVENTS_TABLE",
    "WORKFLOW_SUMMARIES_TABLE",
    "WORKFLOW_WINDOWS_TABLE",
    "Alteration",
    "Table",
    "alterations",
    "create_statements",
    "created",
    "derived",
    "grouped",
]

TABLES: tuple[Table, ...] = (
    GPU_SAMPLES_TABLE, HOST_SAMPLES_TABLE, WORKFLOW_EVENTS_TABLE, WORKFLOW_WINDOWS_TABLE, CAPACITY_WINDOWS_TABLE,
    WORKFLOW_SUMMARIES_TABLE,
    ALERTS_TABLE, DEAD_LETTERS_TABLE, TRACE_ANALYSES_TABLE, FINDINGS_TABLE, PROFILE_REQUESTS_TABLE,
    PROFILE_STATUSES_TABLE, ENFORCEMENT_TABLE, OWNER_ACTIONS_TABLE, SERVING_WINDOWS_TABLE,
)


# Objects derived from the tables: created after them, in this order, idempotently.
DERIVED = (*WORKFLOWS, *ROLLUPS, *ALERT_TRANSITIONS, JUDGED_WINDOWS_VIEW, WASTE_VIEW, *GOODPUT_VIEWS,
           *CAPACITY_VIEWS)


@dataclass(frozen=True)
class Alteration:
    """An ``ALTER`` clause that brings a table of an earlier release to its current definition,
    and how to tell that the table has it already: the column it adds (as ``system.columns``
    lists the table's), or else what the table's definition shows once it is done (as
    ``system.tables``' ``create_table_query`` shows it)."""

    database: str
    table: str
    clause: str  # what follows ``ALTER TABLE database.table``
    column: str | None = None
    shows: tuple[re.Pattern[str], ...] = ()

    @property
    def statement(self) -> str:
        return f"ALTER TABLE {self.database}.{self.table} {self.clause}"

    def done(self, columns: set[tuple[str, str]], definitions: dict[str, str]) -> bool:
        """Whether the table, as ``columns`` ((table, column) of its database) and
        ``definitions`` (table -> its CREATE) show it, has what the clause would give it."""
        if self.column is not None:
            return (self.table, self.column) in columns
        definition = definitions.get(self.table, "")
        return bool(self.shows) and all(p.search(definition) for p in self.shows)


def alterations(database: str, t: Table) -> list[Alteration]:
    """What brings ``t`` of any earlier release to its current definition, in order (each
    idempotent): the columns added since, the deduplication settings, the offsets projection."""
    return [
        *(Alteration(database, t.name, f"ADD COLUMN IF NOT EXISTS {c} {typ}", column=c)
          for c, typ in (*t.added_columns, *KAFKA_TOPIC_COLUMNS)),
        # After a merge that drops replaced rows, the offsets projection is computed again
        # (and without it, a ReplacingMergeTree takes no projection).
        Alteration(database, t.name, f"MODIFY SETTING non_replicated_deduplication_window = {DEDUPLICATION_WINDOW}, "
                                     "deduplicate_merge_projection_mode = 'rebuild'",
                   shows=(re.compile(rf"\bnon_replicated_deduplication_window = {DEDUPLICATION_WINDOW}\b"),
                          re.compile(r"\bdeduplicate_merge_projection_mode = 'rebuild'"))),
        Alteration(database, t.name, OFFSETS_PROJECTION_CLAUSE,
                   shows=(re.compile(rf"\bPROJECTION `?{OFFSETS_PROJECTION}`?\s"),)),
    ]


def grouped(lacking: list[Alteration]) -> list[str]:
    """The statements that apply ``lacking``, in their order, as few as ClickHouse takes: one
    statement holds many clauses of one table, but a ``MODIFY SETTING`` ends its statement (the
    commas after it list more settings), and what needs its setting (the projection) comes
    after it."""
    statements: list[str] = []
    clauses: list[Alteration] = []
    for a in lacking:
        if clauses and (clauses[0].database, clauses[0].table) != (a.database, a.table):
            statements.append(_joined(clauses))
            clauses = []
        clauses.append(a)
        if a.clause.startswith("MODIFY SETTING"):
            statements.append(_joined(clauses))
            clauses = []
    if clauses:
        statements.append(_joined(clauses))
    return statements


def _joined(clauses: list[Alteration]) -> str:
    return f"ALTER TABLE {clauses[0].database}.{clauses[0].table} {', '.join(a.clause for a in clauses)}"


def created(database: str, t: Table) -> str:
    """``t``'s ``CREATE TABLE IF NOT EXISTS`` in ``database``."""
    return t.ddl.format(db=database, name=t.name).strip()


def derived(database: str) -> list[str]:
    """What is made from the tables of ``database`` (``DERIVED``), in order."""
    return [d.format(db=database).strip() for d in DERIVED]


def create_statements(database: str) -> list[str]:
    """Everything to run, in order, to bring ``database`` to the current tables (idempotent)."""
    statements = [f"CREATE DATABASE IF NOT EXISTS {database}"]
    for t in TABLES:
        statements.append(created(database, t))
        statements += [a.statement for a in alterations(database, t)]
    return statements + derived(database)
