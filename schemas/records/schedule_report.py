"""ScheduleReport: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import TIMESTAMP_MS, Field, Record, array, optional

SCHEDULE_REPORT = Record(
    "ScheduleReport",
    versions={
        1: ("To the periodic profiling scheduler: the workflows running on one partition of the window stage, "
            "and/or workflows whose periodic profile finished. One-partition topic: one scheduler sees the fleet."),
    },
    fields=(
        Field(
            "source_partition",
            optional("int"),
            "The window stage's partition reporting; null for a report of finished profiles only.",
            default=None,
        ),
        Field("at", TIMESTAMP_MS, "When the window stage reported."),
        Field("running", array("string"), "The workflows running on its partitions.", default=[]),
        Field(
            "finished",
            array("string"),
            "Workflows whose periodic profile was analysed: their slots are free.",
            default=[],
        ),
    ),
)
