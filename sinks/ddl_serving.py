"""The serving replicas' judged windows (``ServingWindow``): what ``gpufleet serving`` reports
per service (its peak, the replicas it needed, the GPU-hours held beyond them) and an analyst's
SQL reads beside ``workflow_windows``."""

from __future__ import annotations

from schemas.topics import SERVING_WINDOWS
from sinks.table import Table

SERVING_WINDOWS_TABLE = Table(
    "serving_windows", SERVING_WINDOWS,
    ("workflow_id", "owner", "team", "service", "engine", "window_start", "window_end", "gpu_count", "gpu_seconds",
     "utilization_mean_pct", "requests", "requests_per_s", "tokens_per_s", "queue_time_ms", "ttft_ms",
     "waiting_max", "capacity_per_s", "capacity_window_start", "capacity_windows", "state", "idle_since",
     "closed_at"),
    """
    CREATE TABLE IF NOT EXISTS {db}.{name} (
        workflow_id LowCardinality(String),
        owner LowCardinality(Nullable(String)),
        team LowCardinality(Nullable(String)),
        service LowCardinality(String),
        engine LowCardinality(String),
        window_start DateTime64(3, 'UTC'),
        window_end DateTime64(3, 'UTC'),
        gpu_count UInt32,
        gpu_seconds Float64,
        utilization_mean_pct Float64,
        requests Float64,
        requests_per_s Float64,
        tokens_per_s Nullable(Float64),
        queue_time_ms Nullable(Float64),
        ttft_ms Nullable(Float64),
        waiting_max Nullable(Float64),
        capacity_per_s Nullable(Float64),
        capacity_window_start Nullable(DateTime64(3, 'UTC')),
        capacity_windows UInt32,
        state LowCardinality(String),
        idle_since Nullable(DateTime64(3, 'UTC')),
        closed_at DateTime64(3, 'UTC'),
        kafka_partition UInt32,
        kafka_offset UInt64
    )
    -- A window the worker emits twice (at-least-once, after a crash) collapses to one row.
    ENGINE = ReplacingMergeTree(closed_at)
    PARTITION BY toYYYYMM(window_start)
    ORDER BY (service, workflow_id, window_start)
    """,
)
