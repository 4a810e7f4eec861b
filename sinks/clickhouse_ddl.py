"""ClickHouse tables of gpufleet: one per topic the sink writes, with the columns it fills.

The same DDL runs on the embedded engine (``chdb://``) and on a server (``http(s)://``).
Every table keeps the Kafka topic (its name and Kafka's id of it), partition and offset of
each row, and a projection of the highest offset per topic and partition, kept in each part
with its rows: the sink resumes after them on a restart without reading the table, so a
replayed batch is never inserted twice, and rows of another topic (another prefix, a topic
deleted and created again, another cluster) are never mistaken for its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from schemas.topics import (
    ALERTS,
    DEAD_LETTERS,
    FINDINGS,
    GPU_SAMPLES,
    HOST_SAMPLES,
    PROFILE_REQUESTS,
    PROFILE_STATUSES,
    TRACE_ANALYSES,
    WORKFLOW_EVENTS,
    WORKFLOW_SUMMARIES,
    WORKFLOW_WINDOWS,
    TopicSpec,
)


@dataclass(frozen=True)
class Table:
    name: str
    topic: TopicSpec
    columns: tuple[str, ...]  # filled from the record's fields of the same name, in this order
    ddl: str  # {db} and {name} are filled in
    prepare: Callable[[dict], dict] | None = None  # record -> row, where a field needs reshaping
    # Columns added after the table was first created: (name, type), applied idempotently.
    added_columns: tuple[tuple[str, str], ...] = ()


KAFKA_COLUMNS = ("kafka_partition", "kafka_offset", "kafka_topic", "kafka_topic_id")
# Added to every table after its first release; rows written before have '' in both.
KAFKA_TOPIC_COLUMNS = (("kafka_topic", "LowCardinality(String) DEFAULT ''"),
                       ("kafka_topic_id", "LowCardinality(String) DEFAULT ''"))
OFFSETS_PROJECTION = "kafka_offsets"

# Columns added after the first release (GpuSample v2: the NVML fields; v3: host CPU and I/O wait).
GPU_SAMPLE_ADDED_COLUMNS = (
    ("share", "Nullable(Float32)"),
    ("process_count", "Nullable(UInt16)"),
    ("process_memory_bytes", "Nullable(UInt64) CODEC(ZSTD)"),
    ("process_sm_util_pct", "Nullable(Float32) CODEC(ZSTD)"),
    ("power_limit_watts", "Nullable(Float32) CODEC(ZSTD)"),
    ("energy_joules_total", "Nullable(Float64) CODEC(Gorilla, ZSTD)"),
    ("sm_clock_max_mhz", "Nullable(UInt32) CODEC(ZSTD)"),
    ("mem_clock_mhz", "Nullable(UInt32) CODEC(ZSTD)"),
    ("mem_clock_max_mhz", "Nullable(UInt32) CODEC(ZSTD)"),
    ("clock_event_reasons", "Nullable(UInt64) CODEC(ZSTD)"),
    ("pcie_tx_bytes_per_s", "Nullable(UInt64) CODEC(ZSTD)"),
    ("pcie_rx_bytes_per_s", "Nullable(UInt64) CODEC(ZSTD)"),
    ("ecc_uncorrected_volatile", "Nullable(UInt64) CODEC(ZSTD)"),
    ("remapped_rows_uncorrectable", "Nullable(UInt32) CODEC(ZSTD)"),
    ("remapped_rows_pending", "Nullable(Bool)"),
    ("sm_active_pct", "Nullable(Float32) CODEC(ZSTD)"),
    ("sm_occupancy_pct", "Nullable(Float32) CODEC(ZSTD)"),
    ("tensor_active_pct", "Nullable(Float32) CODEC(ZSTD)"),
    ("dram_bw_pct", "Nullable(Float32) CODEC(ZSTD)"),
    ("parent_gpu_uuid", "LowCardinality(Nullable(String))"),
    ("mig_gi_id", "Nullable(UInt16)"),
    ("mig_ci_id", "Nullable(UInt16)"),
    ("xids", "Array(UInt32)"),
    # v3
    ("workflow_cpu_pct", "Nullable(Float32) CODEC(ZSTD)"),
    ("host_iowait_pct", "Nullable(Float32) CODEC(ZSTD)"),
    # v4
    ("rank", "Nullable(Int32) CODEC(ZSTD)"),
)

GPU_SAMPLES_TABLE = Table(
    "gpu_samples", GPU_SAMPLES,
    ("event_time", "interval_ms", "host", "gpu_index", "gpu_uuid", "gpu_model", "workflow_id",
     "owner", "team", "utilization_pct", "memory_utilization_pct", "memory_used_bytes",
     "memory_total_bytes", "power_watts", "temperature_c", "sm_clock_mhz",
     *(name for name, _ in GPU_SAMPLE_ADDED_COLUMNS)),
    """
    CREATE TABLE IF NOT EXISTS {db}.{name} (
        event_time DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD),
        interval_ms UInt32 CODEC(T64, ZSTD),
        host LowCardinality(String),
        gpu_index UInt16,
        gpu_uuid LowCardinality(String),
        gpu_model LowCardinality(String),
        workflow_id LowCardinality(String),
        owner LowCardinality(Nullable(String)),
        team LowCardinality(Nullable(String)),
        utilization_pct Float32 CODEC(ZSTD),
        memory_utilization_pct Nullable(Float32) CODEC(ZSTD),
        memory_used_bytes Nullable(UInt64) CODEC(ZSTD),
        memory_total_bytes Nullable(UInt64) CODEC(ZSTD),
        power_watts Nullable(Float32) CODEC(ZSTD),
        temperature_c Nullable(Float32) CODEC(ZSTD),
        sm_clock_mhz Nullable(UInt32) CODEC(ZSTD),
        kafka_partition UInt32,
        kafka_offset UInt64 CODEC(Delta, ZSTD),
        ingested_at DateTime DEFAULT now()
    )
    ENGINE = MergeTree
    PARTITION BY toDate(event_time)
    ORDER BY (workflow_id, host, gpu_index, event_time)
    -- TTL on ingest time, not event time: an event-time TTL silently drops backfilled rows.
    TTL ingested_at + INTERVAL 90 DAY
    """,
    prepare=lambda r: r if r.get("xids") is not None else {**r, "xids": []},
    added_columns=GPU_SAMPLE_ADDED_COLUMNS,
)

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
    ("version", "UInt32 DEFAULT 1"),  # WorkflowWindow v4; the engine's version since migration 2
)

WORKFLOW_WINDOWS_ENGINE = """ReplacingMergeTree(version)
    PARTITION BY toYYYYMM(window_start)
    ORDER BY (workflow_id, window_start)"""

WORKFLOW_WINDOWS_TABLE = Table(
    "workflow_windows", WORKFLOW_WINDOWS,
    ("workflow_id", "owner", "team", "window_start", "window_end", "sample_count", "gpu_count",
     "gpu_seconds", "utilization_mean_pct", "utilization_min_pct", "utilization_max_pct",
     "memory_used_mean_bytes", "energy_joules", *(name for name, _ in WORKFLOW_WINDOW_ADDED_COLUMNS),
     "closed_at"),
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
    added_columns=WORKFLOW_WINDOW_ADDED_COLUMNS,
)

# Alert v3: the automatic profile an episode caused and, once analysed, its root cause. Its
# traces are profile/<profile_request_id>/<host>/rank<r> in trace_analyses and findings.
ALERT_FINDING_FIELDS = ("rule", "severity", "title", "evidence", "recommendation", "gpu_seconds_at_stake", "ranks")
ALERT_ADDED_COLUMNS = (
    ("profile_request_id", "Nullable(String)"),
    ("root_cause", "Nullable(String)"),
    ("findings", ("Array(Tuple(rule String, severity String, title String, evidence String, "
                 "recommendation String, gpu_seconds_at_stake Float64, ranks Int32))")),
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

# TraceAnalysis v2: what the host agent saw while a requested profile was captured, flat.
SYSTEM_CONTEXT_FIELDS = (
    ("ticks", "Nullable(UInt32)"), ("span_ms", "Nullable(UInt64)"), ("interval_ms_mean", "Nullable(Float64)"),
    ("gpus", "Nullable(UInt16)"), ("gpu_utilization_mean_pct", "Nullable(Float64)"),
    ("gpu_zero_utilization_share", "Nullable(Float64)"), ("sm_active_mean_pct", "Nullable(Float64)"),
    ("power_mean_watts", "Nullable(Float64)"), ("memory_peak_fraction", "Nullable(Float64)"),
    ("workflow_cpu_mean_pct", "Nullable(Float64)"), ("host_cpu_mean_pct", "Nullable(Float64)"),
    ("host_iowait_mean_pct", "Nullable(Float64)"),
)
TRACE_ANALYSIS_ADDED_COLUMNS = tuple((f"system_{name}", typ) for name, typ in SYSTEM_CONTEXT_FIELDS)


def _trace_analysis_row(record: dict) -> dict:
    system = record.get("system") or {}
    return {**record, **{f"system_{name}": system.get(name) for name, _ in SYSTEM_CONTEXT_FIELDS},
            "idle_by_stream": [(s["stream"], s["host_wait_us"], s["kernel_wait_us"], s["other_us"])
                               for s in record["idle_by_stream"]]}


TRACE_ANALYSES_TABLE = Table(
    "trace_analyses", TRACE_ANALYSES,
    ("trace_id", "workflow_id", "rank", "source", "partial", "error", "events", "gpu_events",
     "gpu_events_without_launch", "kernel_time_us", "idle_time_us", "compute_time_us",
     "non_compute_time_us", "idle_pct", "compute_pct", "non_compute_pct", "communication_time_us",
     "comp_comm_overlap_us", "comp_comm_overlap_pct", "idle_by_stream", "launches",
     "launch_delay_mean_us", "launch_delay_max_us", "launch_delay_total_us", "cpu_duration_mean_us",
     "gpu_duration_mean_us", "short_kernels", "short_kernel_gpu_us", "runtime_outliers",
     "launch_delay_outliers", "analyzed_at", *(name for name, _ in TRACE_ANALYSIS_ADDED_COLUMNS)),
    """
    CREATE TABLE IF NOT EXISTS {db}.{name} (
        trace_id String,
        workflow_id LowCardinality(String),
        rank UInt32,
        source Nullable(String),
        partial Bool,
        error Nullable(String),
        events UInt64,
        gpu_events UInt64,
        gpu_events_without_launch UInt64,
        kernel_time_us Float64,
        idle_time_us Float64,
        compute_time_us Float64,
        non_compute_time_us Float64,
        idle_pct Nullable(Float64),
        compute_pct Nullable(Float64),
        non_compute_pct Nullable(Float64),
        communication_time_us Float64,
        comp_comm_overlap_us Float64,
        comp_comm_overlap_pct Nullable(Float64),
        idle_by_stream Array(Tuple(stream Int32, host_wait_us Float64, kernel_wait_us Float64, other_us Float64)),
        launches UInt64,
        launch_delay_mean_us Nullable(Float64),
        launch_delay_max_us Nullable(Float64),
        launch_delay_total_us Float64,
        cpu_duration_mean_us Nullable(Float64),
        gpu_duration_mean_us Nullable(Float64),
        short_kernels UInt64,
        short_kernel_gpu_us Float64,
        runtime_outliers UInt64,
        launch_delay_outliers UInt64,
        analyzed_at DateTime64(3, 'UTC'),
        kafka_partition UInt32,
        kafka_offset UInt64
    )
    -- A trace analysed again (re-published file, replay) replaces its row.
    ENGINE = ReplacingMergeTree(analyzed_at)
    ORDER BY trace_id
    """,
    prepare=_trace_analysis_row,
    added_columns=TRACE_ANALYSIS_ADDED_COLUMNS,
)

FINDINGS_TABLE = Table(
    "findings", FINDINGS,
    ("finding_id", "trace_id", "workflow_id", "rank", "rule", "severity", "title", "evidence",
     "gpu_seconds_at_stake", "recommendation", "detected_at"),
    """
    CREATE TABLE IF NOT EXISTS {db}.{name} (
        finding_id String,
        trace_id String,
        workflow_id LowCardinality(String),
        rank UInt32,
        rule LowCardinality(String),
        severity LowCardinality(String),
        title String,
        evidence String,
        gpu_seconds_at_stake Float64,
        recommendation String,
        detected_at DateTime64(3, 'UTC'),
        kafka_partition UInt32,
        kafka_offset UInt64
    )
    ENGINE = ReplacingMergeTree(detected_at)
    ORDER BY finding_id
    """,
)

HOST_SAMPLES_TABLE = Table(
    "host_samples", HOST_SAMPLES,
    ("event_time", "interval_ms", "host", "cpu_count", "cpu_pct", "iowait_pct", "memory_used_bytes",
     "memory_total_bytes", "disk_read_bytes_per_s", "disk_write_bytes_per_s", "net_rx_bytes_per_s",
     "net_tx_bytes_per_s", "workflows", "spool_dropped_total"),
    """
    CREATE TABLE IF NOT EXISTS {db}.{name} (
        event_time DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD),
        interval_ms UInt32 CODEC(T64, ZSTD),
        host LowCardinality(String),
        cpu_count UInt16,
        cpu_pct Float32 CODEC(ZSTD),
        iowait_pct Nullable(Float32) CODEC(ZSTD),
        memory_used_bytes UInt64 CODEC(ZSTD),
        memory_total_bytes UInt64 CODEC(ZSTD),
        disk_read_bytes_per_s Nullable(Float64) CODEC(ZSTD),
        disk_write_bytes_per_s Nullable(Float64) CODEC(ZSTD),
        net_rx_bytes_per_s Nullable(Float64) CODEC(ZSTD),
        net_tx_bytes_per_s Nullable(Float64) CODEC(ZSTD),
        workflows Array(Tuple(workflow_id String, processes UInt32, cpu_pct Float32, rss_bytes UInt64)),
        spool_dropped_total UInt64,
        kafka_partition UInt32,
        kafka_offset UInt64 CODEC(Delta, ZSTD),
        ingested_at DateTime DEFAULT now()
    )
    ENGINE = MergeTree
    PARTITION BY toDate(event_time)
    ORDER BY (host, event_time)
    TTL ingested_at + INTERVAL 90 DAY
    """,
    prepare=lambda r: {**r, "workflows": [
        (w["workflow_id"], w["processes"], w["cpu_pct"], w["rss_bytes"]) for w in r["workflows"]]},
)

WORKFLOW_EVENTS_TABLE = Table(
    "workflow_events", WORKFLOW_EVENTS,
    ("workflow_id", "event", "event_time", "host", "owner", "team", "gpu_uuids", "pids", "cmdline",
     "framework", "framework_version", "scheduler_job_id", "attribution", "model", "cluster"),
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
    added_columns=(("model", "LowCardinality(Nullable(String))"), ("cluster", "LowCardinality(Nullable(String))")),
)

WORKFLOW_SUMMARIES_TABLE = Table(
    "workflow_summaries", WORKFLOW_SUMMARIES,
    ("workflow_id", "owner", "team", "first_window_start", "last_window_end", "end_reason", "windows",
     "max_gpus", "gpu_seconds", "active_gpu_seconds", "wasted_gpu_seconds", "zero_util_gpu_seconds",
     "throttled_gpu_seconds", "utilization_mean_pct", "memory_peak_fraction", "energy_joules", "xid_count",
     "alerts_fired", "summarized_at"),
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
)

PROFILE_REQUESTS_TABLE = Table(
    "profile_requests", PROFILE_REQUESTS,
    ("request_id", "workflow_id", "hosts", "ranks", "duration_ms", "steps", "reason", "requester", "requested_at",
     "deadline_ms"),
    """
    CREATE TABLE IF NOT EXISTS {db}.{name} (
        request_id String,
        workflow_id LowCardinality(String),
        hosts Array(String),
        ranks Array(Int32),
        duration_ms Nullable(Int64),
        steps Nullable(Int32),
        reason LowCardinality(String),
        requester String,
        requested_at DateTime64(3, 'UTC'),
        deadline_ms Int64,
        kafka_partition UInt32,
        kafka_offset UInt64
    )
    ENGINE = ReplacingMergeTree
    ORDER BY request_id
    """,
)

PROFILE_STATUSES_TABLE = Table(
    "profile_statuses", PROFILE_STATUSES,
    ("request_id", "workflow_id", "host", "rank", "pid", "state", "reason", "trace_id", "at"),
    """
    CREATE TABLE IF NOT EXISTS {db}.{name} (
        request_id String,
        workflow_id LowCardinality(String),
        host LowCardinality(Nullable(String)),
        rank Nullable(Int32),
        pid Nullable(Int32),
        state LowCardinality(String),
        reason Nullable(String),
        trace_id Nullable(String),
        at DateTime64(3, 'UTC'),
        kafka_partition UInt32,
        kafka_offset UInt64
    )
    -- Every transition is kept (the history of a request); a replayed one collapses.
    ENGINE = ReplacingMergeTree
    ORDER BY (request_id, kafka_partition, kafka_offset)
    """,
)

TABLES: tuple[Table, ...] = (
    GPU_SAMPLES_TABLE, HOST_SAMPLES_TABLE, WORKFLOW_EVENTS_TABLE, WORKFLOW_WINDOWS_TABLE, WORKFLOW_SUMMARIES_TABLE,
    ALERTS_TABLE, DEAD_LETTERS_TABLE, TRACE_ANALYSES_TABLE, FINDINGS_TABLE, PROFILE_REQUESTS_TABLE,
    PROFILE_STATUSES_TABLE,
)


WORKFLOWS_MV = """
    CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.workflows_mv TO {db}.workflows AS
    SELECT workflow_id, event, event_time, host, owner, team, cmdline, framework, framework_version,
           scheduler_job_id, model, cluster
    FROM {db}.workflow_events
    """

# Objects derived from the tables above: created after them, in this order, idempotently.
# Rollups are fed by materialized views from the raw samples, which land exactly once (the
# sink resumes after the stored offsets and tokens its inserts), so their sums are exact.
DERIVED = (
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
    # GPU-hours per hour, workflow, team, owner and GPU model (framework joins from workflows).
    """
    CREATE TABLE IF NOT EXISTS {db}.gpu_hours_hourly (
        hour DateTime('UTC'),
        workflow_id LowCardinality(String),
        team LowCardinality(String),
        owner LowCardinality(String),
        gpu_model LowCardinality(String),
        samples SimpleAggregateFunction(sum, UInt64),
        gpu_seconds SimpleAggregateFunction(sum, Float64),
        busy_gpu_seconds SimpleAggregateFunction(sum, Float64),
        zero_util_gpu_seconds SimpleAggregateFunction(sum, Float64),
        energy_joules SimpleAggregateFunction(sum, Float64),
        memory_peak_fraction SimpleAggregateFunction(max, Float64)
    )
    ENGINE = AggregatingMergeTree
    PARTITION BY toYYYYMM(hour)
    ORDER BY (hour, team, owner, gpu_model, workflow_id)
    """,
    """
    CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.gpu_hours_hourly_mv TO {db}.gpu_hours_hourly AS
    SELECT toStartOfHour(event_time) AS hour, workflow_id, ifNull(team, '') AS team,
           ifNull(owner, '') AS owner, gpu_model,
           count() AS samples,
           sum(interval_ms / 1000 * ifNull(share, 1)) AS gpu_seconds,
           sum(interval_ms / 1000 * ifNull(share, 1) * utilization_pct / 100) AS busy_gpu_seconds,
           sum(if(utilization_pct = 0, interval_ms / 1000 * ifNull(share, 1), 0)) AS zero_util_gpu_seconds,
           sum(interval_ms / 1000 * ifNull(share, 1) * ifNull(power_watts, 0)) AS energy_joules,
           max(if(memory_total_bytes > 0, memory_used_bytes / memory_total_bytes, 0)) AS memory_peak_fraction
    FROM {db}.gpu_samples
    GROUP BY hour, workflow_id, team, owner, gpu_model
    """,
    # The same per day and team, owner and GPU model, with the number of workflows.
    """
    CREATE TABLE IF NOT EXISTS {db}.gpu_hours_daily (
        day Date,
        team LowCardinality(String),
        owner LowCardinality(String),
        gpu_model LowCardinality(String),
        gpu_seconds SimpleAggregateFunction(sum, Float64),
        busy_gpu_seconds SimpleAggregateFunction(sum, Float64),
        zero_util_gpu_seconds SimpleAggregateFunction(sum, Float64),
        workflows AggregateFunction(uniq, String)
    )
    ENGINE = AggregatingMergeTree
    PARTITION BY toYYYYMM(day)
    ORDER BY (day, team, owner, gpu_model)
    """,
    """
    CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.gpu_hours_daily_mv TO {db}.gpu_hours_daily AS
    SELECT toDate(event_time) AS day, ifNull(team, '') AS team, ifNull(owner, '') AS owner, gpu_model,
           sum(interval_ms / 1000 * ifNull(share, 1)) AS gpu_seconds,
           sum(interval_ms / 1000 * ifNull(share, 1) * utilization_pct / 100) AS busy_gpu_seconds,
           sum(if(utilization_pct = 0, interval_ms / 1000 * ifNull(share, 1), 0)) AS zero_util_gpu_seconds,
           uniqState(toString(workflow_id)) AS workflows
    FROM {db}.gpu_samples
    GROUP BY day, team, owner, gpu_model
    """,
    # Where GPU-seconds are lost, one row per (workflow, window or finding, cause): what
    # `gpufleet opportunities` ranks. Idle = allocated at 0 %; low utilisation = the rest of
    # the wasted GPU-seconds; each antipattern finding with the GPU-seconds it puts at stake
    # (these explain part of the same waste, so causes are ranked, never summed together).
    """
    CREATE OR REPLACE VIEW {db}.waste AS
    SELECT workflow_id, ifNull(team, '') AS team, ifNull(owner, '') AS owner, window_end AS at,
           'idle_allocated' AS cause, zero_util_gpu_seconds AS gpu_seconds
    FROM {db}.workflow_windows FINAL
    UNION ALL
    SELECT workflow_id, ifNull(team, ''), ifNull(owner, ''), window_end, 'low_utilization',
           greatest(wasted_gpu_seconds - zero_util_gpu_seconds, 0)
    FROM {db}.workflow_windows FINAL
    UNION ALL
    SELECT f.workflow_id, ifNull(w.team, ''), ifNull(w.owner, ''), f.detected_at, concat('antipattern:', f.rule),
           f.gpu_seconds_at_stake
    FROM {db}.findings AS f FINAL
    LEFT JOIN (SELECT workflow_id, argMax(team, event_time) AS team, argMax(owner, event_time) AS owner
               FROM {db}.workflows GROUP BY workflow_id) AS w ON w.workflow_id = f.workflow_id
    """,
)

# Inserts carry a deduplication token (sinks/write_clickhouse.py); a table without
# replication only remembers the last this many of them.
DEDUPLICATION_WINDOW = 10_000


def offsets_projection(table: str) -> str:
    """The highest offset per topic and partition, in each part beside its rows (cheap to read)."""
    return (f"ALTER TABLE {table} ADD PROJECTION IF NOT EXISTS {OFFSETS_PROJECTION} (SELECT kafka_topic, "
            "kafka_topic_id, kafka_partition, max(kafka_offset) GROUP BY kafka_topic, kafka_topic_id, kafka_partition)")


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
