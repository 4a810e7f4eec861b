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
        Field("request_id", "string"),
        Field("workflow_id", "string"),
        Field("host", optional("string"), default=None),
        Field("rank", optional("int"), default=None),
        Field("pid", optional("int"), default=None),
        Field("state", PROFILE_STATE),
        Field("reason", optional("string"), "Why it failed, in words.", default=None),
        Field("trace_id", optional("string"), default=None),
        Field("at", TIMESTAMP_MS),
    ),
)
