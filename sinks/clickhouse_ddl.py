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
    Table,
    offsets_projection,
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
    "Table",
    "create_statements",
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


def create_statements(database: str) -> list[str]:
    """Everything to run, in order, to bring ``database`` to the current tables (idempotent)."""
    statements = [f"CREATE DATABASE IF NOT EXISTS {database}"]
    for t in TABLES:
        table = f"{database}.{t.name}"
        statements.append(t.ddl.format(db=database, name=t.name).strip())
        statements += [f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {c} {typ}"
                       for c, typ in (*t.added_columns, *KAFKA_TOPIC_COLUMNS)]
        # After a merge that drops replaced rows, the offsets projection is computed again.
        statements.append(f"ALTER TABLE {table} MODIFY SETTING non_replicated_deduplication_window = "
                          f"{DEDUPLICATION_WINDOW}, deduplicate_merge_projection_mode = 'rebuild'")
        statements.append(offsets_projection(table))
    statements += [d.format(db=database).strip() for d in DERIVED]
    return statements
