"""ProfileRequest: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import TIMESTAMP_MS, Enum, Field, Record, array, optional

PROFILE_REASON = Enum(
    "ProfileReason",
    ("PERIODIC", "ON_DEMAND", "AUTO"),
)


PROFILE_REQUEST = Record(
    "ProfileRequest",
    versions={
        1: ("Ask the agents to profile a workflow's training processes (torch.profiler, plus high-frequency NVML) "
            "and publish the traces for analysis. Keyed by workflow_id."),
    },
    fields=(
        Field("request_id", "string", "The request's id."),
        Field("workflow_id", "string", "The workflow to profile."),
        Field("hosts", array("string"), "Hosts that must answer; empty: every host the workflow runs on.", default=[]),
        Field("ranks", array("int"), "Ranks to profile; empty: all.", default=[]),
        Field("duration_ms", optional("long"), "Profile for this long ...", default=None),
        Field("steps", optional("int"), "... or for this many optimizer steps.", default=None),
        Field("reason", PROFILE_REASON, "Why: on demand, periodic, or an alert's root cause."),
        Field("requester", "string", "Who asked: a user, 'scheduler', or the alert that triggered it."),
        Field("requested_at", TIMESTAMP_MS, "When it was asked."),
        Field("deadline_ms", "long", "Epoch ms after which an unanswered host counts as failed."),
    ),
)
