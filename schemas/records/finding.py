"""Finding: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import TIMESTAMP_MS, Enum, Field, Record

FINDING_SEVERITY = Enum(
    "FindingSeverity",
    ("INFO", "WARNING", "CRITICAL"),
)


# What a trace's rule found, as a finding, an alert's root cause and a profile's result say it.
RULE = Field("rule", "string", "The rule that found it (streams/traces/rules.py).")
TITLE = Field("title", "string", "What was found, in a line.")
EVIDENCE = Field("evidence", "string", "The figures it rests on.")
RECOMMENDATION = Field("recommendation", "string", "What to try.")
# A finding carried inside another record: its severity a plain string, the GPU time of the profiled span.
CARRIED = (RULE, Field("severity", "string", "INFO, WARNING or CRITICAL."), TITLE, EVIDENCE, RECOMMENDATION,
           Field("gpu_seconds_at_stake", "double", "GPU-seconds it cost in the profiled span."))


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
        RULE,
        Field("severity", FINDING_SEVERITY, "INFO, WARNING or CRITICAL."),
        TITLE,
        EVIDENCE,
        Field("gpu_seconds_at_stake", "double", "GPU time this antipattern cost in the trace (findings can overlap)."),
        RECOMMENDATION,
        Field("detected_at", TIMESTAMP_MS, "When it was found."),
    ),
)
