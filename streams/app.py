"""Creates the Faust app of the gpufleet worker from explicit settings (no module-level app)."""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

import faust

from kafka_client.config import Security
from schemas.topics import GPU_SAMPLES, KERNEL_EVENTS, PROFILE_SCHEDULE, TRACE_ANALYSES
from streams import faust_fixes
from streams.alerts.raising import AlertConfig
from streams.enforcement.ladder import Ladder
from streams.profiling.auto import AutoProfileConfig
from streams.profiling.comparison import ComparisonConfig
from streams.profiling.schedule import ScheduleConfig
from streams.traces.sessions import TraceSessionConfig
from streams.windows.batches import WindowConfig


@dataclass(frozen=True)
class StreamSettings:
    """Everything the worker needs; parsed once at the entry point and passed down.

    Environment variables (read by the CLI): GPUFLEET_BOOTSTRAP, GPUFLEET_TOPIC_PREFIX.
    """

    bootstrap: str
    security: Security = field(default_factory=Security)
    app_id: str = "gpufleet-worker"
    topic_prefix: str = ""
    data_dir: str = "data/worker"
    window: WindowConfig = field(default_factory=WindowConfig)
    alerts: AlertConfig = field(default_factory=AlertConfig)
    trace_sessions: TraceSessionConfig = field(default_factory=TraceSessionConfig)
    auto_profile: AutoProfileConfig = field(default_factory=AutoProfileConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)  # periodic profiling
    comparison: ComparisonConfig = field(default_factory=ComparisonConfig)  # profiles against each other
    enforcement: tuple[Ladder, ...] = ()  # the enforcement ladders (streams.enforcement.ladder); none: no steps
    # A workflow with no sample for this long (event time) has ended: its WorkflowSummary goes out.
    workflow_ended_s: float = 600.0
    # A partition with no sample for this long (wall time) follows the busiest partition's clock.
    idle_partition_s: float = 60.0
    batch_size: int = 5000
    batch_within_s: float = 0.5
    commit_interval_s: float = 1.0
    # A killed worker's partitions move to a live one after this long without heartbeats.
    session_timeout_s: float = 10.0
    # Partitions of the co-partitioned sample topics and of the kernel events, as the cluster
    # has them (the CLI reads them; every worker of a group must agree), and the copies of
    # the changelog topics Faust creates.
    partitions: int = GPU_SAMPLES.partitions
    trace_partitions: int = KERNEL_EVENTS.partitions
    analysis_partitions: int = TRACE_ANALYSES.partitions
    replication: int = 1

    def topic(self, name: str) -> str:
        return self.topic_prefix + name


def tables(settings: StreamSettings) -> dict[str, int]:
    """The worker's tables: name -> partitions (each co-partitioned with the topics it is built
    from: the window state and history serve samples, life-cycle events and profile results)."""
    return {"window-state": settings.partitions, "window-history": settings.partitions,
            "trace-state": settings.trace_partitions, "profile-schedule": PROFILE_SCHEDULE.partitions,
            "profile-comparison": settings.analysis_partitions}


def changelog_topics(settings: StreamSettings) -> list[tuple[str, int, bool]]:
    """The tables' changelog topics, as Faust names them. Created before the worker starts:
    a changelog topic Faust creates itself at start-up can be missing from the metadata it
    reads next, and the table's partitions then never resume."""
    return [(f"{settings.app_id}-{name}-changelog", partitions, True) for name, partitions in tables(settings).items()]


def tune_gc() -> None:
    """Fewer cyclic garbage collections for a process that allocates a dict per field of every
    decoded sample: the records are freed by reference counting, but each of the default
    700-allocation rounds (and every tenth of those over the whole heap, window state
    included) costs time. Measured on the worker's decode-validate-aggregate path: 55 -> 41 us
    per sample. What was allocated at start-up is frozen out of collection altogether."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def create_app(settings: StreamSettings) -> faust.App:
    """A Faust app with at-least-once processing, in-memory table store (restored from
    its changelog topic on start), and no web server."""
    faust_fixes.apply()
    app = faust.App(
        settings.app_id,
        broker=f"kafka://{settings.bootstrap}",
        broker_credentials=settings.security.faust_credentials(),
        store="memory://",
        datadir=settings.data_dir,
        processing_guarantee="at_least_once",
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication,
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=settings.commit_interval_s,
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=max(1.0, settings.session_timeout_s / 4),
        web_enabled=False,
        key_serializer="raw",
        value_serializer="raw",
        autodiscover=False,
    )
    from streams.topology import register  # the topology needs the app; import here avoids a cycle

    register(app, settings)
    return app
