"""The worker's settings: every stage's own, as the types the stages are given (parsed once, at
the entry point, ``gpufleet worker``, and passed down)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kafka_client.config import WORKER_APP_ID, Security
from schemas.topics import GPU_SAMPLES, KERNEL_EVENTS, TRACE_ANALYSES
from streams.alerts.detectors import Thresholds
from streams.alerts.raising import AlertConfig
from streams.enforcement.ladder import Ladder
from streams.profiling.auto import AutoProfileConfig
from streams.profiling.diff import ComparisonConfig
from streams.profiling.schedule import ScheduleConfig
from streams.serving.traffic import Declared
from streams.traces.sessions import TraceSessionConfig
from streams.windows.batches import WindowConfig


@dataclass(frozen=True)
class StreamSettings:
    """Everything the worker needs; parsed once at the entry point and passed down.

    Environment variables (read by the CLI): GPUFLEET_BOOTSTRAP, GPUFLEET_TOPIC_PREFIX.
    """

    bootstrap: str
    security: Security = field(default_factory=Security)
    app_id: str = WORKER_APP_ID
    topic_prefix: str = ""
    data_dir: str = "data/worker"
    window: WindowConfig = field(default_factory=WindowConfig)
    # The site's thresholds, default and per team: the one route to every judge (the detectors,
    # the goodput buckets, the trace rules; the enforcement ladders climb on the detectors' alerts).
    thresholds: Thresholds = field(default_factory=Thresholds)
    alerts: AlertConfig = field(default_factory=AlertConfig)
    trace_sessions: TraceSessionConfig = field(default_factory=TraceSessionConfig)
    auto_profile: AutoProfileConfig = field(default_factory=AutoProfileConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)  # periodic profiling
    comparison: ComparisonConfig = field(default_factory=ComparisonConfig)  # profiles against each other
    enforcement: tuple[Ladder, ...] = ()  # the enforcement ladders (streams.enforcement.ladder); none: no steps
    serving: Declared = field(default_factory=Declared)  # the workflows the site declares serving replicas
    # A workflow with no sample for this long (event time) has ended: its WorkflowSummary goes out.
    workflow_ended_s: float = 600.0
    # A partition with no sample for this long (wall time) follows the busiest partition's clock.
    idle_partition_s: float = 60.0
    batch_size: int = 5000
    batch_within_s: float = 0.5
    commit_interval_s: float = 1.0
    # A killed worker's partitions move to a live one after this long without heartbeats.
    session_timeout_s: float = 10.0
    # The worker ends (exit status 1, its stacks on stderr) where its loop has stopped, or a
    # partition with messages waiting has not moved, for this long (``gpufleet worker
    # --stall-exit-s``); 0: never. One per process: the command's, never a test's in-process app.
    stall_exit_s: float = 0.0
    # Partitions of the co-partitioned sample topics and of the kernel events, as the cluster
    # has them (the CLI reads them; every worker of a group must agree), and the copies of
    # the changelog topics Faust creates.
    partitions: int = GPU_SAMPLES.partitions
    trace_partitions: int = KERNEL_EVENTS.partitions
    analysis_partitions: int = TRACE_ANALYSES.partitions
    replication: int = 1

    def topic(self, name: str) -> str:
        return self.topic_prefix + name
