"""The tables of profiles and traces: the requests and their statuses, each rank's
``trace_analyses`` and the antipattern ``findings``."""

from __future__ import annotations

from schemas.codec import nested_records, newest_schema
from schemas.topics import FINDINGS, PROFILE_REQUESTS, PROFILE_STATUSES, TRACE_ANALYSES
from sinks.table import Table

# TraceAnalysis v2: what the host agent saw while a requested profile was captured, flat.
SYSTEM_CONTEXT_FIELDS = (
    ("ticks", "Nullable(UInt32)"), ("span_ms", "Nullable(UInt64)"), ("interval_ms_mean", "Nullable(Float64)"),
    ("gpus", "Nullable(UInt16)"), ("gpu_utilization_mean_pct", "Nullable(Float64)"),
    ("gpu_zero_utilization_share", "Nullable(Float64)"), ("sm_active_mean_pct", "Nullable(Float64)"),
    ("power_mean_watts", "Nullable(Float64)"), ("memory_peak_fraction", "Nullable(Float64)"),
    ("workflow_cpu_mean_pct", "Nullable(Float64)"), ("host_cpu_mean_pct", "Nullable(Float64)"),
    ("host_iowait_mean_pct", "Nullable(Float64)"),
)
# Model FLOPs utilisation (TraceAnalysis v3).
MFU_COLUMNS = (("gpu_name", "LowCardinality(Nullable(String))"), ("model_flops", "Nullable(Int64)"),
               ("model_flops_precision", "LowCardinality(Nullable(String))"), ("peak_tflops", "Nullable(Float64)"),
               ("mfu_pct", "Nullable(Float64)"))
# Each nested list of a TraceAnalysis (idle per stream, kernel types, top kernels, memory copies,
# collectives, operators, annotations, queue lengths, steps) is stored as an Array(Tuple(...)) whose
# elements are its records' fields in the schema's order, read from the schema itself (the types
# below name them; tests/unit/sinks/test_write_clickhouse.py holds the two to the same order).
NESTED = nested_records(newest_schema(TRACE_ANALYSES.schema))
# TraceAnalysis v4: the steps it covers, HTA's kernel breakdown, the memory copies per kind, the collectives,
# the operators' roofline, the GPU time of the user's annotations, the launch queue per stream and per-step
# timelines.
V4_COLUMNS = (
    ("profiler_steps", "UInt32"),
    ("kernel_types", "Array(Tuple(kernel_type LowCardinality(String), time_us Float64, pct Float64))"),
    ("top_kernels", ("Array(Tuple(kernel_type LowCardinality(String), name String, kernels UInt32, launches UInt64, "
                     "time_us Float64, min_us Float64, max_us Float64, mean_us Float64, stddev_us Float64))")),
    ("memory_copies", ("Array(Tuple(kind LowCardinality(String), copies UInt64, bytes UInt64, time_us Float64, "
                       "achieved_gbps Nullable(Float64), bw_samples UInt64, "
                       + ", ".join(f"{f} Nullable(Float64)" for f in NESTED["memory_copies"][6:]) + "))")),
    ("collectives", "Array(Tuple(name String, durations_us Array(Float64)))"),
    ("operators", ("Array(Tuple(name String, calls UInt64, flops UInt64, bytes Nullable(UInt64), gpu_time_us Float64, "
                   "precision LowCardinality(String), achieved_tflops Float64, achieved_gbps Nullable(Float64), "
                   "intensity Nullable(Float64), peak_tflops Nullable(Float64), peak_gbps Nullable(Float64), "
                   "bound LowCardinality(Nullable(String)), roof_tflops Nullable(Float64), roof_pct Nullable(Float64), "
                   "at_stake_us Float64))")),
    ("gpu_annotations", ("Array(Tuple(name String, kernels UInt32, launches UInt64, time_us Float64, min_us Float64, "
                         "max_us Float64, mean_us Float64, stddev_us Float64))")),
    ("queue_lengths", ("Array(Tuple(stream Int32, samples UInt64, mean Nullable(Float64), std Nullable(Float64), "
                       "min Nullable(Float64), p25 Nullable(Float64), p50 Nullable(Float64), p75 Nullable(Float64), "
                       "max Nullable(Float64), blocked_us Float64))")),
    ("steps", ("Array(Tuple(step String, cpu_us Float64, gpu_events UInt64, gpu_span_us Float64, "
               "gpu_busy_us Float64, gpu_idle_us Float64, compute_us Float64))")),
)
TRACE_ANALYSIS_ADDED_COLUMNS = (*((f"system_{name}", typ) for name, typ in SYSTEM_CONTEXT_FIELDS), *MFU_COLUMNS,
                                *V4_COLUMNS)


def _trace_analysis_row(record: dict) -> dict:
    system = record.get("system") or {}
    return {**record, **{f"system_{name}": system.get(name) for name, _ in SYSTEM_CONTEXT_FIELDS},
            **{name: [tuple(item.get(f) for f in fields) for item in record.get(name) or []]
               for name, fields in NESTED.items()}}


TRACE_ANALYSES_TABLE = Table(
    "trace_analyses", TRACE_ANALYSES,
    ("trace_id", "workflow_id", "rank", "source", "partial", "error", "events", "gpu_events",
     "gpu_events_without_launch", "kernel_time_us", "idle_time_us", "compute_time_us",
     "non_compute_time_us", "idle_pct", "compute_pct", "non_compute_pct", "communication_time_us",
     "comp_comm_overlap_us", "comp_comm_overlap_pct", "idle_by_stream", "launches",
     "launch_delay_mean_us", "launch_delay_max_us", "launch_delay_total_us", "cpu_duration_mean_us",
     "gpu_duration_mean_us", "short_kernels", "short_kernel_gpu_us", "runtime_outliers",
     "launch_delay_outliers", *(name for name, _ in MFU_COLUMNS), *(name for name, _ in V4_COLUMNS),
     "analyzed_at",
     *(f"system_{name}" for name, _ in SYSTEM_CONTEXT_FIELDS)),
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
