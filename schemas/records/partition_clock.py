"""PartitionClock: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import TIMESTAMP_MS, Field, Record

PARTITION_CLOCK = Record(
    "PartitionClock",
    versions={
        1: ("Sent by each worker to every partition of the GPU samples topic, a few times a minute: the newest "
            "event time it has applied on its partitions. The owner of a partition whose own samples stopped (a "
            "quiet partition) moves its clock to it, so that its last windows close whichever worker owns it. "
            "Consumers of the samples topic that are not gpufleet workers skip it."),
    },
    fields=(
        Field(
            "event_time",
            TIMESTAMP_MS,
            "The newest event time the sending worker has applied on any partition it owns.",
        ),
        Field("worker", "string", "The sending worker (host and process id), for tracing."),
        Field("sent_at", TIMESTAMP_MS, "The sender's wall clock."),
    ),
)
