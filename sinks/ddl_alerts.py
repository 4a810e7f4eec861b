"""The tables of what went wrong: ``alerts`` (each transition, with its root cause once a
profile found it), ``enforcement`` (each step of the enforcement ladders: who, what, why,
which ladder) and ``dead_letters`` (what a stage could not use, and why)."""

from __future__ import annotations

from schemas.topics import ALERTS, DEAD_LETTERS, ENFORCEMENT, OWNER_ACTIONS
from sinks.table import Table

# Alert v3: the automatic profile an episode caused and, once analysed, its root cause. Its
# traces are profile/<profile_request_id>/<host>/rank<r> in trace_analyses and findings. v4: the
# service of a serving replica's alert.
ALERT_FINDING_FIELDS = ("rule", "severity", "title", "evidence", "recommendation", "gpu_seconds_at_stake", "ranks")
ALERT_ADDED_COLUMNS = (
    ("profile_request_id", "Nullable(String)"),
    ("root_cause", "Nullable(String)"),
    ("findings", ("Array(Tuple(rule String, severity String, title String, evidence String, "
                 "recommendation String, gpu_seconds_at_stake Float64, ranks Int32))")),
    ("service", "LowCardinality(Nullable(String))"),  # Alert v4: a serving replica's service
)

ALERTS_TABLE = Table(
    "alerts", ALERTS,
    ("alert_id", "detector", "severity", "status", "notify", "workflow_id", "owner", "team", "window_start",
     "window_end", "since", "observed", "threshold", "wasted_gpu_hours_so_far", "message", "advice", "fired_at",
     *(name for name, _ in ALERT_ADDED_COLUMNS)),
    """
    CREATE TABLE IF NOT EXISTS {db}.{name} (
        alert_id String,
        detector LowCardinality(String),
        severity LowCardinality(String),
        status LowCardinality(String),
        notify Bool,
        workflow_id LowCardinality(String),
        owner LowCardinality(Nullable(String)),
        team LowCardinality(Nullable(String)),
        window_start DateTime64(3, 'UTC'),
        window_end DateTime64(3, 'UTC'),
        since DateTime64(3, 'UTC'),
        observed Float64,
        threshold Float64,
        wasted_gpu_hours_so_far Nullable(Float64),
        message String,
        advice String,
        fired_at DateTime64(3, 'UTC'),
        kafka_partition UInt32,
        kafka_offset UInt64
    )
    -- One row per episode: its latest transition (RESOLVED comes in a later window than FIRING;
    -- a root-cause update repeats its transition's window_end and, inserted later, replaces it).
    ENGINE = ReplacingMergeTree(window_end)
    ORDER BY alert_id
    """,
    prepare=lambda r: {**r, "findings": [tuple(f[k] for k in ALERT_FINDING_FIELDS) for f in r.get("findings") or []]},
    added_columns=ALERT_ADDED_COLUMNS,
)

DEAD_LETTERS_TABLE = Table(
    "dead_letters", DEAD_LETTERS,
    ("stage", "reason", "source_topic", "source_partition", "source_offset", "key", "value",
     "failed_at"),
    """
    CREATE TABLE IF NOT EXISTS {db}.{name} (
        stage LowCardinality(String),
        reason String,
        source_topic LowCardinality(String),
        source_partition Int32,
        source_offset Int64,
        key Nullable(String),
        value Nullable(String),
        failed_at DateTime64(3, 'UTC'),
        kafka_partition UInt32,
        kafka_offset UInt64
    )
    ENGINE = ReplacingMergeTree
    ORDER BY (kafka_partition, kafka_offset)
    """,
)

ENFORCEMENT_TABLE = Table(
    "enforcement", ENFORCEMENT,
    ("event_id", "alert_id", "step", "policy", "detector", "workflow_id", "owner", "team", "cluster",
     "scheduler_job_id", "since", "due_at", "action_at", "dry_run", "gpus", "reason", "command", "exit_code",
     "attempt", "at"),
    """
    CREATE TABLE IF NOT EXISTS {db}.{name} (
        event_id String,
        alert_id String,
        step LowCardinality(String),
        policy LowCardinality(String),
        detector LowCardinality(String),
        workflow_id LowCardinality(String),
        owner LowCardinality(Nullable(String)),
        team LowCardinality(Nullable(String)),
        cluster LowCardinality(Nullable(String)),
        scheduler_job_id Nullable(String),
        since DateTime64(3, 'UTC'),
        due_at DateTime64(3, 'UTC'),
        action_at Nullable(DateTime64(3, 'UTC')),
        dry_run Bool,
        gpus Int32,
        reason String,
        command Array(String),
        exit_code Nullable(Int32),
        attempt Int32,
        at DateTime64(3, 'UTC'),
        kafka_partition UInt32,
        kafka_offset UInt64
    )
    -- One row per step of an episode (its id says which): a replay writes the same row again.
    ENGINE = ReplacingMergeTree(at)
    ORDER BY (workflow_id, alert_id, event_id)
    """,
)


OWNER_ACTIONS_TABLE = Table(
    "owner_actions", OWNER_ACTIONS,
    ("action_id", "workflow_id", "kind", "alert_id", "actor", "role", "reason", "until", "request_id", "at"),
    """
    CREATE TABLE IF NOT EXISTS {db}.{name} (
        action_id String,
        workflow_id LowCardinality(String),
        kind LowCardinality(String),
        alert_id Nullable(String),
        actor LowCardinality(String),
        role LowCardinality(String),
        reason Nullable(String),
        until Nullable(DateTime64(3, 'UTC')),
        request_id Nullable(String),
        at DateTime64(3, 'UTC'),
        kafka_partition UInt32,
        kafka_offset UInt64
    )
    -- Who did what about a job, every action kept (a replay writes the same row again).
    ENGINE = ReplacingMergeTree(at)
    ORDER BY (workflow_id, action_id)
    """,
)


# Every transition of every alert (``alerts`` keeps an episode's latest): what the job's timeline
# shows, fed by a view from each insert into ``alerts``. A replayed or root-cause-updated
# transition (the same alert, status and window) replaces its row.
ALERT_TRANSITIONS_MV = """
    CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.alert_transitions_mv TO {db}.alert_transitions AS
    SELECT alert_id, detector, severity, status, notify, workflow_id, owner, team, window_start, window_end, since,
           message, fired_at, root_cause
    FROM {db}.alerts
    """
ALERT_TRANSITIONS = (
    """
    CREATE TABLE IF NOT EXISTS {db}.alert_transitions (
        alert_id String,
        detector LowCardinality(String),
        severity LowCardinality(String),
        status LowCardinality(String),
        notify Bool,
        workflow_id LowCardinality(String),
        owner LowCardinality(Nullable(String)),
        team LowCardinality(Nullable(String)),
        window_start DateTime64(3, 'UTC'),
        window_end DateTime64(3, 'UTC'),
        since DateTime64(3, 'UTC'),
        message String,
        fired_at DateTime64(3, 'UTC'),
        root_cause Nullable(String)
    )
    ENGINE = ReplacingMergeTree
    ORDER BY (workflow_id, alert_id, window_end, status)
    """,
    ALERT_TRANSITIONS_MV,
)
