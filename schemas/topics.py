"""Every Kafka topic gpufleet reads or writes: its name, the schema of its values, and its key.

This is the one place topic names live; producers, streams and sinks take them from here.
Names carry a version: an incompatible change of a topic's contract gets a new topic.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TopicSpec:
    name: str
    schema: str
    key_field: str | None
    partitions: int
    compacted: bool = False
    doc: str = ""


GPU_SAMPLES = TopicSpec(
    "gpufleet.gpu-samples.v1", "GpuSample", "workflow_id", 8,
    doc="Host agents' GPU samples; keyed by workflow so a workflow's samples stay in order.",
)
WORKFLOW_WINDOWS = TopicSpec(
    "gpufleet.workflow-windows.v1", "WorkflowWindow", "workflow_id", 8,
    doc="One record per workflow and closed event-time window.",
)
ALERTS = TopicSpec(
    "gpufleet.alerts.v1", "Alert", "workflow_id", 4,
    doc="Alerts for job owners; alert_id is deterministic, so consumers can deduplicate.",
)
DEAD_LETTERS = TopicSpec(
    "gpufleet.dead-letters.v1", "DeadLetter", None, 1,
    doc="Records a stage could not process, with the reason and their source topic/partition/offset.",
)

ALL_TOPICS: tuple[TopicSpec, ...] = (GPU_SAMPLES, WORKFLOW_WINDOWS, ALERTS, DEAD_LETTERS)


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
