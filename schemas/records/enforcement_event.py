"""EnforcementEvent: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import OWNER, TEAM, TIMESTAMP_MS, Enum, Field, Record, array, optional

ENFORCEMENT_STEP = Enum(
    "EnforcementStep",
    ("FIRST_WARNING", "SECOND_WARNING", "ACTION_DUE", "EXEMPT", "HELD", "CANCELLED", "ACTING", "ACTED", "WOULD_ACT",
     "ACTION_FAILED"),
)


ENFORCEMENT_EVENT = Record(
    "EnforcementEvent",
    versions={
        1: ("A step of the enforcement ladder for one alert episode (from the worker: warnings, the action "
            "falling due, an exemption, a hold on stale or partial data, a cancellation when the alert resolved) "
            "or what the enforcer did about an action (claimed it, ran it, would have run it in a dry run, "
            "failed). Who, what, why and which policy: an owner can see why their job was stopped, an operator "
            "can audit it."),
    },
    fields=(
        Field(
            "event_id",
            "string",
            "Deterministic: alert id and step (and attempt for the enforcer's): a replay yields the same id.",
        ),
        Field("alert_id", "string", "The alert episode the ladder climbs."),
        Field("step", ENFORCEMENT_STEP, "The ladder's step this record is."),
        Field("policy", "string", "The name of the ladder (policy file) that decided."),
        Field("detector", "string", "The detector whose alert the ladder climbs on."),
        Field("workflow_id", "string", "The workflow (the record's key)."),
        OWNER,
        TEAM,
        Field("cluster", optional("string"), "The job's cluster.", default=None),
        Field("scheduler_job_id", optional("string"), "The scheduler's id of the job acted on.", default=None),
        Field("since", TIMESTAMP_MS, "When the condition started (event time)."),
        Field("due_at", TIMESTAMP_MS, "Event time the step fell due (the condition held this long)."),
        Field("action_at", optional(TIMESTAMP_MS), "Event time the action falls due, on a warning.", default=None),
        Field("dry_run", "boolean", "True: nothing is run, what would have been is recorded."),
        Field("gpus", "int", "GPUs the workflow holds in the window that decided."),
        Field("reason", "string", "Why, in plain words (the exemption, the hold, the command's error)."),
        Field("command", array("string"), "The action's argument vector (never run through a shell).", default=[]),
        Field("exit_code", optional("int"), "The action's exit code, once run.", default=None),
        Field("attempt", "int", "Which attempt of the action this is.", default=0),
        Field("at", TIMESTAMP_MS, "Wall-clock time of the record."),
    ),
)
