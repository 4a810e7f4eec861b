"""The tables of profiles and traces: the requests and their statuses, each rank's
``trace_analyses`` and the antipattern ``findings``."""

from __future__ import annotations

from schemas.codec import nested_records
from schemas.records.trace_analysis import TRACE_ANALYSIS
from schemas.records.trace_end import PROFILE_SYSTEM_CONTEXT
from schemas.topics import FINDINGS, PROFILE_REQUESTS, PROFILE_STATUSES, TRACE_ANALYSES
from sinks.record_columns import added, columns, create_columns
from sinks.table import Table

# The trace_analyses table is the TraceAnalysis record's field list (schemas/records/trace_analysis.py),
# column by column (sinks.record_columns): its nested lists as arrays of tuples of their fields in the
# schema's order, what the host saw during the capture (``system``) flat. What is written here is only
# how ClickHouse stores some of them: counts unsigned, names of few values as LowCardinality.
STORAGE = {
    **dict.fromkeys(("events", "gpu_events", "gpu_events_without_launch", "launches", "short_kernels",
                     "runtime_outliers", "launch_delay_outliers", "copies", "bytes", "bw_samples", "calls", "flops",
                     "samples", "span_ms"), "UInt64"),
    **dict.fromkeys(("rank", "profiler_steps", "kernels", "ticks"), "UInt32"),
    "gpus": "UInt16",
    **dict.fromkeys(("workflow_id", "kernel_type", "kind", "precision", "bound", "gpu_name", "model_flops_precision"),
                    "LowCardinality(String)"),
}
TRACE_ANALYSIS_COLUMNS = columns(TRACE_ANALYSIS, STORAGE, flat=("system",))
# Each nested list's fields in the schema's order: the elements of its tuples.
NESTED = nested_records(TRACE_ANALYSIS.schema())
SYSTEM_FIELDS = tuple(f.name for f in PROFILE_SYSTEM_CONTEXT.fields)


def _trace_analysis_row(record: dict) -> dict:
    system = record.get("system") or {}
    return {**record, **{f"system_{name}": system.get(name) for name in SYSTEM_FIELDS},
            **{name: [tuple(item.get(f) for f in fields) for item in record.get(name) or []]
               for name, fields in NESTED.items()}}


TRACE_ANALYSES_TABLE = Table(
    "trace_analyses", TRACE_ANALYSES,
    tuple(c.name for c in TRACE_ANALYSIS_COLUMNS),
    """
    CREATE TABLE IF NOT EXISTS {db}.{name} (
""" + create_columns(TRACE_ANALYSIS_COLUMNS) + """,
        kafka_partition UInt32,
        kafka_offset UInt64
    )
    -- A trace analysed again (re-published file, replay) replaces its row.
    ENGINE = ReplacingMergeTree(analyzed_at)
    ORDER BY trace_id
    """,
    prepare=_trace_analysis_row,
    added_columns=added(TRACE_ANALYSIS_COLUMNS),
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
