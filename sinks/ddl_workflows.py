"""The tables of workflows: their closed windows, life-cycle events and summaries, the latest
metadata of each (``workflows``, fed by a view from the events) and the ``waste`` view; and the
windows of capacity no job held (``capacity_windows``), kept apart from the jobs'."""

from __future__ import annotations

from dataclasses import replace

from schemas.goodput_buckets import BUCKETS, OBSERVED_BUCKETS, REJUDGED
from schemas.topics import WORKFLOW_EVENTS, WORKFLOW_SUMMARIES, WORKFLOW_WINDOWS
from schemas.validate_sample import FREE_CAPACITY
from schemas.vocabulary import JOBS, WASTE_BUCKETS
from sinks.table import Table

# The goodput waterfall (WorkflowWindow v5, WorkflowSummary v2): GPU-seconds, then joules, per bucket.
GOODPUT_COLUMNS = (
    ("gpu_model", "LowCardinality(Nullable(String))"),
    *((f"{b}_gpu_seconds", "Float64 DEFAULT 0") for b in OBSERVED_BUCKETS),
    *((f"{b}_joules", "Float64 DEFAULT 0") for b in OBSERVED_BUCKETS),
)
# Its last bucket, unobserved (WorkflowWindow v6, WorkflowSummary v4).
UNOBSERVED_COLUMNS = (("unobserved_gpu_seconds", "Float64 DEFAULT 0"), ("unobserved_joules", "Float64 DEFAULT 0"))

WORKFLOW_WINDOW_ADDED_COLUMNS = (
    ("active_gpu_seconds", "Float64"),
    ("wasted_gpu_seconds", "Float64"),
    ("zero_util_gpu_seconds", "Float64"),
    ("utilization_p50_pct", "Nullable(Float64)"),
    ("utilization_p95_pct", "Nullable(Float64)"),
    ("sm_active_mean_pct", "Nullable(Float64)"),
    ("tensor_active_mean_pct", "Nullable(Float64)"),
    ("memory_peak_fraction", "Nullable(Float64)"),
    ("memory_mean_fraction", "Nullable(Float64)"),
    ("power_mean_watts", "Nullable(Float64)"),
    ("gpu_imbalance_pct", "Nullable(Float64)"),
    ("idle_gpus", "UInt32"),
    ("throttled_gpu_seconds", "Float64"),
    ("xid_count", "UInt32"),
    ("ecc_uncorrected_max", "Nullable(UInt64)"),
    ("workflow_cpu_mean_pct", "Nullable(Float64)"),
    ("host_iowait_mean_pct", "Nullable(Float64)"),
    *GOODPUT_COLUMNS,
    ("model_mfu_pct", "Nullable(Float64)"),  # WorkflowWindow v5
    ("version", "UInt32 DEFAULT 1"),  # WorkflowWindow v4; the engine's version since migration 2
)

WORKFLOW_WINDOWS_ENGINE = """ReplacingMergeTree(version)
    PARTITION BY toYYYYMM(window_start)
    ORDER BY (workflow_id, window_start)"""

_WINDOWS = Table(
    "workflow_windows", WORKFLOW_WINDOWS,
    ("workflow_id", "owner", "team", "window_start", "window_end", "sample_count", "gpu_count",
     "gpu_seconds", "utilization_mean_pct", "utilization_min_pct", "utilization_max_pct",
     "memory_used_mean_bytes", "energy_joules", *(name for name, _ in WORKFLOW_WINDOW_ADDED_COLUMNS),
     "closed_at", *(name for name, _ in UNOBSERVED_COLUMNS)),
    """
    CREATE TABLE IF NOT EXISTS {db}.{name} (
        workflow_id LowCardinality(String),
        owner LowCardinality(Nullable(String)),
        team LowCardinality(Nullable(String)),
        window_start DateTime64(3, 'UTC'),
        window_end DateTime64(3, 'UTC'),
        sample_count UInt64,
        gpu_count UInt32,
        gpu_seconds Float64,
        utilization_mean_pct Float64,
        utilization_min_pct Float64,
        utilization_max_pct Float64,
        memory_used_mean_bytes Nullable(Float64),
        energy_joules Nullable(Float64),
        closed_at DateTime64(3, 'UTC'),
        kafka_partition UInt32,
        kafka_offset UInt64,
        version UInt32 DEFAULT 1
    )
    -- A window the worker emits twice (at-least-once, after a crash) collapses to one row; a
    -- window completed by late samples comes again with a higher version, which wins.
    ENGINE = """ + WORKFLOW_WINDOWS_ENGINE + """
    """,
    added_columns=(*WORKFLOW_WINDOW_ADDED_COLUMNS, *UNOBSERVED_COLUMNS),
)


def no_job(window: dict) -> bool:
    """A window of the agents' pseudo-workflows for capacity no job held (``unallocated``, or
    ``idle`` where an agent sees processes only)."""
    return window["workflow_id"] in FREE_CAPACITY


# Capacity no job held, in windows of its own: beside the jobs' windows, never among them, so
# that no sum over workflow_windows (an analyst's own included) counts it as allocated.
CAPACITY_WINDOWS_TABLE = replace(_WINDOWS, name="capacity_windows")
WORKFLOW_WINDOWS_TABLE = replace(_WINDOWS, aside=(CAPACITY_WINDOWS_TABLE, no_job))


WORKFLOW_EVENTS_TABLE = Table(
    "workflow_events", WORKFLOW_EVENTS,
    ("workflow_id", "event", "event_time", "host", "owner", "team", "gpu_uuids", "pids", "cmdline",
     "framework", "framework_version", "scheduler_job_id", "attribution", "model", "cluster", "scheduler_qos",
     "scheduler_partition", "scheduler", "job_name", "time_limit_s", "nodes", "allocated_at", "scheduler_unknown",
     "scheduler_problem", "end_state", "exit_code", "exit_signal", "cancelled_by", "service"),
    """
    CREATE TABLE IF NOT EXISTS {db}.{name} (
        workflow_id String,
        event LowCardinality(String),
        event_time DateTime64(3, 'UTC'),
        host LowCardinality(String),
        owner LowCardinality(Nullable(String)),
        team LowCardinality(Nullable(String)),
        gpu_uuids Array(String),
        pids Array(UInt32),
        cmdline Nullable(String),
        framework LowCardinality(Nullable(String)),
        framework_version LowCardinality(Nullable(String)),
        scheduler_job_id Nullable(String),
        attribution LowCardinality(String),
        kafka_partition UInt32,
        kafka_offset UInt64
    )
    -- The same event seen twice (a replay) is one row.
    ENGINE = ReplacingMergeTree
    ORDER BY (workflow_id, host, event_time, event)
    """,
    added_columns=(("model", "LowCardinality(Nullable(String))"), ("cluster", "LowCardinality(Nullable(String))"),
                   ("scheduler_qos", "LowCardinality(Nullable(String))"),
                   ("scheduler_partition", "LowCardinality(Nullable(String))"),
                   # WorkflowEvent v4: what the scheduler allocated
                   ("scheduler", "LowCardinality(Nullable(String))"), ("job_name", "Nullable(String)"),
                   ("time_limit_s", "Nullable(Int64)"), ("nodes", "Nullable(String)"),
                   ("allocated_at", "Nullable(DateTime64(3, 'UTC'))"),
                   # WorkflowEvent v5: what the scheduler could not say, and how the job ended
                   ("scheduler_unknown", "Array(LowCardinality(String))"), ("scheduler_problem", "Nullable(String)"),
                   ("end_state", "LowCardinality(Nullable(String))"), ("exit_code", "Nullable(Int32)"),
                   ("exit_signal", "Nullable(Int32)"), ("cancelled_by", "LowCardinality(Nullable(String))"),
                   # WorkflowEvent v6: the service its labels or environment declare it a replica of
                   ("service", "LowCardinality(Nullable(String))")),
    prepare=lambda r: {**r, "scheduler_unknown": r.get("scheduler_unknown") or []},  # (older releases: none)
)


# WorkflowSummary v3: the job's tensor activity and model MFU, and what it should ask for next time.
RIGHT_SIZE_FIELDS = ("kind", "current", "recommended", "reason", "source", "gpu_hours_freed")
SUMMARY_V3_COLUMNS = (
    ("tensor_active_mean_pct", "Nullable(Float64)"),
    ("model_mfu_pct", "Nullable(Float64)"),
    ("right_size", ("Array(Tuple(kind String, current Nullable(String), recommended String, reason String, "
                   "source String, gpu_hours_freed Float64))")),
)

# WorkflowSummary v4: what the scheduler says of the job (the unobserved bucket is in GOODPUT_COLUMNS).
SUMMARY_V4_COLUMNS = (
    *UNOBSERVED_COLUMNS,
    ("scheduler", "LowCardinality(Nullable(String))"),
    ("scheduler_job_id", "Nullable(String)"),
    ("allocated_at", "Nullable(DateTime64(3, 'UTC'))"),
    ("ended_at", "Nullable(DateTime64(3, 'UTC'))"),
    ("end_state", "LowCardinality(Nullable(String))"),
    ("exit_code", "Nullable(Int32)"),
    ("exit_signal", "Nullable(Int32)"),
    ("cancelled_by", "LowCardinality(Nullable(String))"),
)
SUMMARY_V5_COLUMNS = (("untouched_gpus", "Nullable(UInt32)"),)

WORKFLOW_SUMMARIES_TABLE = Table(
    "workflow_summaries", WORKFLOW_SUMMARIES,
    ("workflow_id", "owner", "team", "first_window_start", "last_window_end", "end_reason", "windows",
     "max_gpus", "gpu_seconds", "active_gpu_seconds", "wasted_gpu_seconds", "zero_util_gpu_seconds",
     "throttled_gpu_seconds", "utilization_mean_pct", "memory_peak_fraction", "energy_joules", "xid_count",
     *(name for name, _ in GOODPUT_COLUMNS), "alerts_fired", "tensor_active_mean_pct", "model_mfu_pct", "right_size",
     "summarized_at", *(name for name, _ in (*SUMMARY_V4_COLUMNS, *SUMMARY_V5_COLUMNS))),
    """
    CREATE TABLE IF NOT EXISTS {db}.{name} (
        workflow_id String,
        owner LowCardinality(Nullable(String)),
        team LowCardinality(Nullable(String)),
        first_window_start DateTime64(3, 'UTC'),
        last_window_end DateTime64(3, 'UTC'),
        end_reason String,
        windows UInt32,
        max_gpus UInt32,
        gpu_seconds Float64,
        active_gpu_seconds Float64,
        wasted_gpu_seconds Float64,
        zero_util_gpu_seconds Float64,
        throttled_gpu_seconds Float64,
        utilization_mean_pct Float64,
        memory_peak_fraction Nullable(Float64),
        energy_joules Nullable(Float64),
        xid_count UInt32,
        alerts_fired Array(String),
        summarized_at DateTime64(3, 'UTC'),
        kafka_partition UInt32,
        kafka_offset UInt64
    )
    -- A workflow that runs again after it ended is summarised again: the latest summary wins.
    ENGINE = ReplacingMergeTree(last_window_end)
    ORDER BY workflow_id
    """,
    added_columns=(*GOODPUT_COLUMNS, *SUMMARY_V3_COLUMNS, *SUMMARY_V4_COLUMNS, *SUMMARY_V5_COLUMNS),
    prepare=lambda r: {**r, "right_size": [tuple(x[k] for k in RIGHT_SIZE_FIELDS) for x in r.get("right_size") or []]},
)


WORKFLOWS_MV = """
    CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.workflows_mv TO {db}.workflows AS
    SELECT workflow_id, event, event_time, host, owner, team, cmdline, framework, framework_version,
           scheduler_job_id, model, cluster
    FROM {db}.workflow_events
    """


# Latest metadata per workflow, made after the tables above, in this order.
WORKFLOWS = (
    # Latest metadata per workflow (owner, team, framework and version, job id) from the agents.
    """
    CREATE TABLE IF NOT EXISTS {db}.workflows (
        workflow_id LowCardinality(String),
        event LowCardinality(String),
        event_time DateTime64(3, 'UTC'),
        host LowCardinality(String),
        owner LowCardinality(Nullable(String)),
        team LowCardinality(Nullable(String)),
        cmdline Nullable(String),
        framework LowCardinality(Nullable(String)),
        framework_version LowCardinality(Nullable(String)),
        scheduler_job_id Nullable(String),
        model LowCardinality(Nullable(String)),
        cluster LowCardinality(Nullable(String))
    )
    ENGINE = ReplacingMergeTree(event_time)
    ORDER BY workflow_id
    """,
    # Added with WorkflowEvent v2; before the view that fills them (MIGRATIONS replaces an old view).
    "ALTER TABLE {db}.workflows ADD COLUMN IF NOT EXISTS model LowCardinality(Nullable(String))",
    "ALTER TABLE {db}.workflows ADD COLUMN IF NOT EXISTS cluster LowCardinality(Nullable(String))",
    WORKFLOWS_MV,
)


# A serving replica's window is judged by its traffic (serving_windows, ``streams.serving``),
# here once for every report, by the rule ``schemas.goodput_buckets.REJUDGED`` states (the
# worker's job totals follow it too). ``serving_state`` is '' for every other window.


def _judged(bucket: str, kind: str) -> str:
    pooled = " + ".join(f"w.{b}_{kind}" for b in REJUDGED)
    serving = {"idle": f"if(s.state = 'IDLE', {pooled}, 0)", "productive": f"if(s.state = 'IDLE', 0, {pooled})"}
    return f"if(s.state = '', w.{bucket}_{kind}, {serving.get(bucket, '0')}) AS {bucket}_{kind}"


JUDGED_WINDOWS_VIEW = f"""
    CREATE OR REPLACE VIEW {{db}}.judged_windows AS
    SELECT w.* REPLACE ({", ".join(_judged(b, kind) for b in REJUDGED for kind in ("gpu_seconds", "joules"))}),
           s.state AS serving_state
    FROM {{db}}.workflow_windows AS w FINAL
    LEFT JOIN (SELECT workflow_id AS serving_workflow, window_start AS serving_start, state
               FROM {{db}}.serving_windows FINAL) AS s
           ON s.serving_workflow = w.workflow_id AND s.serving_start = w.window_start
    """

# Made last: it reads judged_windows, findings and workflows.
WASTE_VIEW = (
    # Where GPU-seconds are lost, one row per (workflow, window or finding, cause): what
    # `gpufleet opportunities` ranks. The causes of a window are its waste buckets
    # (schemas.vocabulary: unhealthy, startup, idle, input_bound, low_util), so a workflow's
    # window causes sum to its wasted GPU-seconds; each antipattern finding comes with the
    # GPU-seconds it puts at stake (these explain part of the same waste, so causes are
    # ranked, never summed together). A serving replica's idle time (judged_windows: its windows
    # without a request) is named for what it is, idle_replica; a window that served traffic
    # wastes nothing but its start-up and unhealthy time, whatever its GPUs' utilisation.
    """
    CREATE OR REPLACE VIEW {db}.waste AS
    SELECT workflow_id, ifNull(team, '') AS team, ifNull(owner, '') AS owner, window_end AS at,
           bucket.1 AS cause, bucket.2 AS gpu_seconds
    FROM {db}.judged_windows
    ARRAY JOIN [""" + ", ".join(
        f"(if(serving_state = '', 'idle', 'idle_replica'), {b}_gpu_seconds)" if b == "idle"
        else f"('{b}', {b}_gpu_seconds)" for b in WASTE_BUCKETS) + """] AS bucket
    WHERE """ + JOBS + """
    UNION ALL
    SELECT f.workflow_id, ifNull(w.team, ''), ifNull(w.owner, ''), f.detected_at, concat('antipattern:', f.rule),
           f.gpu_seconds_at_stake
    FROM {db}.findings AS f FINAL
    LEFT JOIN (SELECT workflow_id, argMax(team, event_time) AS team, argMax(owner, event_time) AS owner
               FROM {db}.workflows GROUP BY workflow_id) AS w ON w.workflow_id = f.workflow_id
    """
)


def _goodput_view(name: str, period: str, windows: str = "judged_windows AS w") -> str:
    sums = ",\n           ".join(f"sum({c}) AS {c}" for c, _ in (*GOODPUT_COLUMNS[1:], *UNOBSERVED_COLUMNS))
    return f"""
    CREATE OR REPLACE VIEW {{db}}.{name} AS
    SELECT {period}(w.window_start) AS period, ifNull(w.team, '') AS team, ifNull(w.owner, '') AS owner,
           ifNull(m.framework, '') AS framework, ifNull(w.gpu_model, '') AS gpu_model,
           ifNull(m.cluster, '') AS cluster, w.workflow_id AS workflow_id,
           sum(w.gpu_seconds) AS gpu_seconds,
           -- windows written before goodput (WorkflowWindow v4 and earlier) have no buckets
           sum(w.gpu_seconds - ({" + ".join(f"w.{b}_gpu_seconds" for b in BUCKETS)}))
               AS unclassified_gpu_seconds,
           sum(ifNull(w.energy_joules, 0)) AS energy_joules,
           {sums}
    FROM {{db}}.{windows}
    LEFT JOIN (SELECT workflow_id, argMax(framework, event_time) AS framework,
                      argMax(cluster, event_time) AS cluster
               FROM {{db}}.workflows GROUP BY workflow_id) AS m ON m.workflow_id = w.workflow_id
    GROUP BY period, team, owner, framework, gpu_model, cluster, workflow_id
    """


# The goodput waterfall rolled up by hour and by day, per team, owner, framework, GPU model,
# cluster and workflow: views over the windows as ClickHouse keeps them (FINAL: the highest
# version of each; a serving replica's judged by its traffic, judged_windows), since a
# materialised sum would count a window re-emitted by late samples twice. Made after the
# workflows table they join (its framework and cluster).
GOODPUT_VIEWS = (_goodput_view("goodput_hourly", "toStartOfHour"), _goodput_view("goodput_daily", "toStartOfDay"))
# The same for capacity no job held (capacity_windows; its windows are judged by nothing).
CAPACITY_VIEWS = (_goodput_view("capacity_hourly", "toStartOfHour", "capacity_windows AS w FINAL"),
                  _goodput_view("capacity_daily", "toStartOfDay", "capacity_windows AS w FINAL"))
