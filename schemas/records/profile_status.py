"""ProfileStatus: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import TIMESTAMP_MS, Enum, Field, Record, optional

PROFILE_STATE = Enum(
    "ProfileState",
    ("ACCEPTED", "RUNNING", "TRACE_PUBLISHED", "ANALYSED", "FAILED"),
)


PROFILE_STATUS = Record(
    "ProfileStatus",
    versions={
        1: "Progress of a profile request, per host and rank where it applies. Keyed by request_id.",
    },
    fields=(
        Field("request_id", "string", "The request."),
        Field("workflow_id", "string", "The workflow profiled."),
        Field("host", optional("string"), "The host that answers.", default=None),
        Field("rank", optional("int"), "The rank profiled.", default=None),
        Field("pid", optional("int"), "The process profiled.", default=None),
        Field("state", PROFILE_STATE, "Where the profile stands."),
        Field("reason", optional("string"), "Why it failed, in words.", default=None),
        Field("trace_id", optional("string"), "The trace it made, once made.", default=None),
        Field("at", TIMESTAMP_MS, "When."),
    ),
)
