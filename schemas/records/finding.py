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
        Field("trace_id", "string", "The analysis it comes from."),
        Field("workflow_id", "string", "The workflow profiled."),
        Field("rank", "int", "The trace's rank."),
        Field("rule", "string", "The rule that found it (streams/traces/rules.py)."),
        Field("severity", FINDING_SEVERITY, "INFO, WARNING or CRITICAL."),
        Field("title", "string", "What was found, in a line."),
        Field("evidence", "string", "The figures it rests on."),
        Field("gpu_seconds_at_stake", "double", "GPU time this antipattern cost in the trace (findings can overlap)."),
        Field("recommendation", "string", "What to try."),
        Field("detected_at", TIMESTAMP_MS, "When it was found."),
    ),
)
