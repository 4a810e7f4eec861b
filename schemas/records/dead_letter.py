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
        Field("reason", "string", "Why it could not be used."),
        Field("source_topic", "string", "The topic it was read from."),
        Field("source_partition", "int", "Its partition."),
        Field("source_offset", "long", "Its offset."),
        Field("key", optional("bytes"), "Its key, as sent.", default=None),
        Field("value", optional("bytes"), "Its value, as sent (bytes).", default=None),
        Field("failed_at", TIMESTAMP_MS, "When it was refused."),
    ),
)
