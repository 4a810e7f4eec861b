"""UnobservedTime: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import OWNER, TEAM, TIMESTAMP_MS, Field, Record, array, optional

UNOBSERVED_TIME = Record(
    "UnobservedTime",
    versions={
        1: ("GPU time a job held on a host, as its scheduler says, that no sample stands for: the host's agent "
            "was not running (killed, restarting, started after the job) from from_time to to_time. Sent by the "
            "agent when it learns of it, on the samples topic keyed by workflow; the worker adds it to the job's "
            "windows as unobserved GPU-seconds, which no detector judges and no report counts as used or wasted."),
    },
    fields=(
        Field("workflow_id", "string", "The workflow (the record's key)."),
        Field("host", "string", "The host whose agent did not sample."),
        OWNER,
        TEAM,
        Field("scheduler_job_id", optional("string"), "The scheduler's id of the job.", default=None),
        Field("from_time", TIMESTAMP_MS, "Where its samples stopped (or the job's start)."),
        Field("to_time", TIMESTAMP_MS, "Where they begin again (or the job's end)."),
        Field("gpus", "double", "The GPUs the job held on the host, each counted by the job's share of it."),
        Field("gpu_uuids", array("string"), "The job's GPUs on the host."),
        Field("reason", "string", "Why no sample stands for it."),
        Field("event_time", TIMESTAMP_MS, "When the agent learnt of it."),
    ),
)
