"""Every Kafka topic gpufleet reads or writes: its name, the schema of its values, and its key.

This is the one place topic names live; producers, streams and sinks take them from here.
Names carry a version: an incompatible change of a topic's contract gets a new topic.
"""

from __future__ import annotations

from pathlib import PurePath

import msgspec


class TopicSpec(msgspec.Struct, frozen=True):
    """A topic's contract. ``partitions``: 1 for a topic that has one partition by design (the
    fleet-wide scheduler, the dead letters, the owners' actions); for the others the count used
    where the deployment sets none (tests, the demo), since the deployment's ``--partitions`` decides."""

    name: str
    schema: str
    key_field: str | None
    partitions: int
    compacted: bool = False
    doc: str = ""
    other_schemas: tuple[str, ...] = ()  # further record types the topic carries
    configs: tuple[tuple[str, str], ...] = ()  # topic settings it is made with (and `gpufleet topics` keeps)

    def carries(self, schema: str) -> bool:
        return schema == self.schema or schema in self.other_schemas

    def partitions_in(self, deployment: int | None) -> int:
        """The partitions of this topic in a deployment that gives ``deployment`` to those that scale."""
        return 1 if self.partitions == 1 else (deployment or self.partitions)


GPU_SAMPLES = TopicSpec(
    "gpufleet.gpu-samples.v1", "GpuSample", "workflow_id", 8,
    other_schemas=("GpuSampleColumns", "GpuSampleBatch", "PartitionClock", "WorkflowEvent", "UnobservedTime",
                   "ServingSample"),
    # the broker's time on each record, not the host's: what a sample's event time is judged
    # against (schemas.validate_sample.MAX_AHEAD_OF_KAFKA_MS)
    configs=(("message.timestamp.type", "LogAppendTime"),),
    doc="Host agents' GPU samples: a workflow's samples on a host column by column per message "
        "(GpuSampleColumns, what the agents send); GpuSample and GpuSampleBatch messages of older "
        "agents are read too. Keyed by workflow so a workflow's samples stay in order. The workers "
        "add a PartitionClock (no key) to every partition now and then: the fleet's event time, "
        "which a partition whose samples stopped follows. A job's end from its scheduler (a "
        "WorkflowEvent ENDED, also on the workflow-events topic) follows the job's last samples "
        "from the host, so that the worker closes its windows when they are all in. UnobservedTime: "
        "GPU time a job held on the host that no sample stands for (its agent was not running). "
        "ServingSample: what a serving replica's engine did in the tick, beside its GPU samples.",
)
HOST_SAMPLES = TopicSpec(
    "gpufleet.host-samples.v1", "HostSample", "host", 8,
    doc="Host agents' whole-system metrics per tick, with each workflow's CPU and memory.",
)
WORKFLOW_EVENTS = TopicSpec(
    "gpufleet.workflow-events.v1", "WorkflowEvent", "workflow_id", 8, compacted=True,
    doc="Workflow life cycle seen by host agents; compacted, so it holds each workflow's latest state.",
)
WORKFLOW_WINDOWS = TopicSpec(
    "gpufleet.workflow-windows.v1", "WorkflowWindow", "workflow_id", 8,
    doc="One record per workflow and closed event-time window.",
)
WORKFLOW_SUMMARIES = TopicSpec(
    "gpufleet.workflow-summaries.v1", "WorkflowSummary", "workflow_id", 4,
    doc="One efficiency record per executed workflow, when it ends.",
)
ALERTS = TopicSpec(
    "gpufleet.alerts.v1", "Alert", "workflow_id", 4,
    doc="Alerts for job owners; alert_id is deterministic, so consumers can deduplicate.",
)
DEAD_LETTERS = TopicSpec(
    "gpufleet.dead-letters.v1", "DeadLetter", None, 1,
    doc="Records a stage could not process, with the reason and their source topic/partition/offset.",
)

KERNEL_EVENTS = TopicSpec(
    "gpufleet.kernel-events.v1", "KernelEvent", "trace_id", 8, other_schemas=("KernelEventColumns", "TraceEnd"),
    doc="Profiler trace events of one rank in start order (KernelEventColumns, what the agents send; KernelEvent "
        "records of older agents), then a TraceEnd marker; keyed by trace.",
)
TRACE_ANALYSES = TopicSpec(
    "gpufleet.trace-analyses.v1", "TraceAnalysis", "workflow_id", 4,
    doc="One analysis per trace (rank): temporal and idle breakdown, overlap, launch statistics.",
)
FINDINGS = TopicSpec(
    "gpufleet.findings.v1", "Finding", "workflow_id", 4,
    doc="Antipatterns found in traces, with evidence, GPU time at stake and the fix.",
)
PROFILE_REQUESTS = TopicSpec(
    "gpufleet.profile-requests.v1", "ProfileRequest", "workflow_id", 4,
    doc="Control plane: profile this workflow (periodic, on demand, or automatic on an alert).",
)
PROFILE_STATUSES = TopicSpec(
    "gpufleet.profile-statuses.v1", "ProfileStatus", "request_id", 4,
    doc="Progress of each profile request per host and rank: accepted ... analysed, or failed with why.",
)
PROFILE_RESULTS = TopicSpec(
    "gpufleet.profile-results.v1", "ProfileResult", "workflow_id", 8,
    doc="What each rank's trace of a requested profile showed; partitioned like the GPU samples so the "
        "workflow's alerts can take in the root cause.",
)

PROFILE_SCHEDULE = TopicSpec(
    "gpufleet.profile-schedule.v1", "ScheduleReport", "source_partition", 1,
    doc="Internal to the worker: what runs on each partition of the window stage, for the one periodic "
        "profiling scheduler (one partition, so its budget is fleet-wide).",
)

ENFORCEMENT = TopicSpec(
    "gpufleet.enforcement.v1", "EnforcementEvent", "workflow_id", 4,
    doc="The enforcement ladder: warnings, actions falling due, exemptions, holds and cancellations from the "
        "worker; what `gpufleet enforce` did about each action (claimed, ran, would have run, failed).",
)
OWNER_ACTIONS = TopicSpec(
    "gpufleet.owner-actions.v1", "OwnerAction", "workflow_id", 1,
    doc="What people did about jobs on the owners' service: profiles asked for, alerts acknowledged or "
        "snoozed, exemptions asked for, approved or refused. One partition: few records, read whole by the "
        "notifier and the enforcer, and kept for good (an exemption or an acknowledgement outlives any "
        "retention: a reader started later must still see it).",
    configs=(("retention.ms", "-1"),),
)
SERVING_WINDOWS = TopicSpec(
    "gpufleet.serving-windows.v1", "ServingWindow", "workflow_id", 4,
    doc="One record per serving replica and closed window: the traffic it served and how it is judged "
        "(busy, headroom, idle, saturated), with the capacity it showed.",
)

# The default of a deployment's --partitions: room for 32 workers (one read 128k samples a
# second here in benchmarks/bench_fleet.py) before the topics must be recreated.
DEFAULT_PARTITIONS = 32

# Keyed by workflow and read together into one per-workflow state: the same partition count.
CO_PARTITIONED: tuple[TopicSpec, ...] = (GPU_SAMPLES, WORKFLOW_EVENTS, PROFILE_RESULTS)

ALL_TOPICS: tuple[TopicSpec, ...] = (
    GPU_SAMPLES, HOST_SAMPLES, WORKFLOW_EVENTS, WORKFLOW_WINDOWS, WORKFLOW_SUMMARIES, ALERTS, DEAD_LETTERS,
    KERNEL_EVENTS, TRACE_ANALYSES, FINDINGS, PROFILE_REQUESTS, PROFILE_STATUSES, PROFILE_RESULTS, PROFILE_SCHEDULE,
    ENFORCEMENT, OWNER_ACTIONS, SERVING_WINDOWS,
)


def by_name(name: str) -> TopicSpec:
    for spec in ALL_TOPICS:
        if spec.name == name:
            return spec
    raise KeyError(f"unknown topic {name!r}")


def key_of(spec: TopicSpec, record: dict) -> bytes | None:
    """The message key of ``record`` on ``spec``'s topic (UTF-8 of the key field), or None."""
    if spec.key_field is None:
        return None
    return str(record[spec.key_field]).encode()


def trace_id_for(path: str, workflow_id: str) -> str:
    """A trace file's id: stable per file. The worker does not analyse a trace again within an
    hour of its end (``TraceSessionConfig.done_retention_ms``: a replay); a file published again
    after that is analysed again, and its analysis replaces the first in ClickHouse (same key)."""
    return f"{workflow_id}/{PurePath(path).name}"


def trace_id_of(request_id: str, host: str, rank: int) -> str:
    """Parsed back by the worker (``request_of_trace``) to report the analysis on the request."""
    return f"profile/{request_id}/{host}/rank{rank}"


def request_of_trace(trace_id: str) -> tuple[str, str, int] | None:
    parts = trace_id.split("/")
    if len(parts) < 4 or parts[0] != "profile" or not parts[-1].startswith("rank"):
        return None
    try:
        return "/".join(parts[1:-2]), parts[-2], int(parts[-1][4:])
    except ValueError:
        return None
