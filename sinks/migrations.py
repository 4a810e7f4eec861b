"""Changes to databases made by earlier releases, in one ordered list, each applied once and
recorded in ``schema_migrations`` (``sinks.write_clickhouse.ClickHouseWriter.ensure_tables``)."""

from __future__ import annotations

from schemas.vocabulary import FREE
from sinks.ddl_workflows import WORKFLOW_WINDOWS_ENGINE, WORKFLOW_WINDOWS_TABLE, WORKFLOWS_MV
from sinks.table import DEDUPLICATION_WINDOW, KAFKA_COLUMNS, offsets_projection

_WINDOW_COLUMNS = ", ".join((*WORKFLOW_WINDOWS_TABLE.columns, *KAFKA_COLUMNS))

# Changes that CREATE ... IF NOT EXISTS cannot make to an existing database, applied once each,
# in order, and recorded in schema_migrations. A fresh database gets the current definitions
# from create_statements() and then runs these too, so each must be harmless there.
MIGRATIONS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (1, "workflows_mv fills model and cluster (WorkflowEvent v2)", (
        "DROP VIEW IF EXISTS {db}.workflows_mv",
        WORKFLOWS_MV,
    )),
    # A table's engine cannot be altered: the rows move to a copy with the new engine, which
    # then takes the table's name. Each step can be run again after a crash between any two.
    (2, "workflow_windows keeps the highest version of a window (late samples re-emit it)", (
        "DROP TABLE IF EXISTS {db}.workflow_windows__versioned",
        "CREATE TABLE {db}.workflow_windows__versioned AS {db}.workflow_windows ENGINE = " + WORKFLOW_WINDOWS_ENGINE
        + f" SETTINGS non_replicated_deduplication_window = {DEDUPLICATION_WINDOW}, "
          "deduplicate_merge_projection_mode = 'rebuild'",
        offsets_projection("{db}.workflow_windows__versioned"),
        "INSERT INTO {db}.workflow_windows__versioned SELECT * FROM {db}.workflow_windows",
        "EXCHANGE TABLES {db}.workflow_windows AND {db}.workflow_windows__versioned",
        "DROP TABLE {db}.workflow_windows__versioned",
    )),
    (3, "alert_transitions holds every transition; the alerts stored before it, each its latest", (
        ("INSERT INTO {db}.alert_transitions SELECT alert_id, detector, severity, status, notify, workflow_id, owner, "
         "team, window_start, window_end, since, message, fired_at, root_cause FROM {db}.alerts FINAL"),
    )),
    # Copied, then deleted: run again after a crash between the two, the copies collapse.
    (4, "capacity no job held moves from workflow_windows to capacity_windows", (
        (f"INSERT INTO {{db}}.capacity_windows ({_WINDOW_COLUMNS})\n"
         f"SELECT {_WINDOW_COLUMNS} FROM {{db}}.workflow_windows WHERE {FREE}"),
        f"ALTER TABLE {{db}}.workflow_windows DELETE WHERE {FREE} SETTINGS mutations_sync = 2",
    )),
)

MIGRATIONS_TABLE = """
    CREATE TABLE IF NOT EXISTS {db}.schema_migrations (
        version UInt32,
        description String,
        applied_at DateTime DEFAULT now()
    )
    ENGINE = ReplacingMergeTree
    ORDER BY version
    """
