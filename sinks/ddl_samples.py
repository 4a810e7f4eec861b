"""The tables of what the host agents measure: ``gpu_samples`` (one row per GPU and tick) and
``host_samples``, the GPU-hour rollups the samples feed through materialized views, and each
GPU per minute (``gpu_minutes``: what a job's page draws)."""

from __future__ import annotations

from schemas.topics import GPU_SAMPLES, HOST_SAMPLES
from sinks.table import Table

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
    ("model_tflops", "Nullable(Float32) CODEC(ZSTD)"),  # GpuSample v5
    ("allocator_peak_bytes", "Nullable(Int64) CODEC(ZSTD)"),  # GpuSample v6
    ("allocator_reserved_bytes", "Nullable(Int64) CODEC(ZSTD)"),
    ("workflow_memory_bytes", "Nullable(Int64) CODEC(ZSTD)"),
    ("foreign_workflow_id", "LowCardinality(Nullable(String))"),  # GpuSampleColumns v4
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


# Rollups fed by materialized views from the raw samples, which land exactly once (the sink
# resumes after the stored offsets and tokens its inserts), so their sums are exact.
ROLLUPS = (
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
    # Each GPU of each workflow per minute: what a job's page draws (utilisation, memory, power,
    # tensor cores over its life) without reading its raw samples. A mean is its sum over the
    # seconds that measured it: power and tensor activity are not measured by every GPU.
    """
    CREATE TABLE IF NOT EXISTS {db}.gpu_minutes (
        minute DateTime('UTC'),
        workflow_id LowCardinality(String),
        host LowCardinality(String),
        gpu_index UInt16,
        seconds SimpleAggregateFunction(sum, Float64),
        utilization_seconds SimpleAggregateFunction(sum, Float64),
        memory_used_max SimpleAggregateFunction(max, UInt64),
        memory_total_max SimpleAggregateFunction(max, UInt64),
        power_seconds SimpleAggregateFunction(sum, Float64),
        power_watt_seconds SimpleAggregateFunction(sum, Float64),
        tensor_seconds SimpleAggregateFunction(sum, Float64),
        tensor_active_seconds SimpleAggregateFunction(sum, Float64),
        processes_max SimpleAggregateFunction(max, Int32)
    )
    ENGINE = AggregatingMergeTree
    PARTITION BY toYYYYMM(minute)
    ORDER BY (workflow_id, host, gpu_index, minute)
    """,
    """
    CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.gpu_minutes_mv TO {db}.gpu_minutes AS
    SELECT toStartOfMinute(event_time) AS minute, workflow_id, host, gpu_index,
           sum(interval_ms / 1000) AS seconds,
           sum(interval_ms / 1000 * utilization_pct) AS utilization_seconds,
           max(ifNull(memory_used_bytes, 0)) AS memory_used_max,
           max(ifNull(memory_total_bytes, 0)) AS memory_total_max,
           sum(if(power_watts IS NULL, 0, interval_ms / 1000)) AS power_seconds,
           sum(interval_ms / 1000 * ifNull(power_watts, 0)) AS power_watt_seconds,
           sum(if(tensor_active_pct IS NULL, 0, interval_ms / 1000)) AS tensor_seconds,
           sum(interval_ms / 1000 * ifNull(tensor_active_pct, 0)) AS tensor_active_seconds,
           -- the most processes of the job on the GPU in the minute: 0, none opened it; -1, not counted
           max(toInt32(ifNull(process_count, -1))) AS processes_max
    FROM {db}.gpu_samples
    GROUP BY minute, workflow_id, host, gpu_index
    """,
)
