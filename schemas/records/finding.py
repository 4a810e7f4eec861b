"""Finding: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import TIMESTAMP_MS, Enum, Field, Record

FINDING_SEVERITY = Enum(
    "FindingSeverity",
    ("INFO", "WARNING", "CRITICAL"),
)


FINDING = Record(
    "Finding",
    versions={
        1: "An antipattern found in a trace: what, the evidence, the GPU time at stake, and the fix.",
    },
    fields=(
        Field("finding_id", "string", "trace_id:rule; a re-analysis replaces it."),
        Field("trace_id", "string"),
        Field("workflow_id", "string"),
        Field("rank", "int"),
        Field("rule", "string"),
        Field("severity", FINDING_SEVERITY),
        Field("title", "string"),
        Field("evidence", "string"),
        Field("gpu_seconds_at_stake", "double", "GPU time this antipattern cost in the trace (findings can overlap)."),
        Field("recommendation", "string"),
        Field("detected_at", TIMESTAMP_MS),
    ),
)
