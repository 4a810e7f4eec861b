"""DeadLetter: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import TIMESTAMP_MS, Field, Record, optional

DEAD_LETTER = Record(
    "DeadLetter",
    versions={
        1: "A record a stage could not process, with the reason and where it came from.",
    },
    fields=(
        Field("stage", "string", "Which stage gave up on it (e.g. window-utilization, clickhouse-sink)."),
        Field("reason", "string"),
        Field("source_topic", "string"),
        Field("source_partition", "int"),
        Field("source_offset", "long"),
        Field("key", optional("bytes"), default=None),
        Field("value", optional("bytes"), default=None),
        Field("failed_at", TIMESTAMP_MS),
    ),
)
