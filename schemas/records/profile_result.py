"""ProfileResult: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import TIMESTAMP_MS, Field, Record, array, optional
from schemas.records.finding import CARRIED
from schemas.records.trace_end import PROFILE_SYSTEM_CONTEXT

PROFILE_FINDING = Record(
    "ProfileFinding",
    fields=(
        *CARRIED,
    ),
)


PROFILE_RESULT = Record(
    "ProfileResult",
    versions={
        1: ("The analysis of one rank's trace of a requested profile, with its findings: what the worker learnt "
            "from a ProfileRequest. Keyed by workflow_id and partitioned like the GPU samples, so the stage that "
            "keeps the workflow's alerts can put the root cause into them."),
        2: ("The analysis of one rank's trace of a requested profile, with its findings: what the worker learnt "
            "from a ProfileRequest. Keyed by workflow_id and partitioned like the GPU samples, so the stage that "
            "keeps the workflow's alerts can put the root cause into them."),
    },
    fields=(
        Field("request_id", "string", "The request."),
        Field("workflow_id", "string", "The workflow profiled."),
        Field("trace_id", "string", "The trace analysed."),
        Field("host", "string", "Its host."),
        Field("rank", "int", "Its rank."),
        Field("kernel_time_us", "double", "The profiled span of GPU time."),
        Field("idle_pct", optional("double"), "The GPU's idle time over the trace's span, in percent.", default=None),
        Field(
            "host_wait_pct_of_idle",
            optional("double"),
            "Of the GPU's idle time, the share spent waiting on the host (HTA's idle breakdown).",
            default=None,
        ),
        Field("error", optional("string"), "Set when the trace was damaged or partial.", default=None),
        Field("findings", array(PROFILE_FINDING), "What the analysis found."),
        Field("analyzed_at", TIMESTAMP_MS, "When it was analysed."),
        Field(
            "system",
            optional(PROFILE_SYSTEM_CONTEXT),
            "From the TraceAnalysis: what the host saw while the trace was captured.",
            since=2,
            default=None,
        ),
    ),
)
