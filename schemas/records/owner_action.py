"""OwnerAction: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import TIMESTAMP_MS, Enum, Field, Record, optional

OWNER_ACTION_KIND = Enum(
    "OwnerActionKind",
    ("PROFILE_NOW", "ACKNOWLEDGE", "SNOOZE", "EXEMPTION_REQUESTED", "EXEMPTION_APPROVED", "EXEMPTION_REFUSED"),
)


OWNER_ACTION = Record(
    "OwnerAction",
    versions={
        1: ("What a person did about a job on the owners' service (gpufleet serve): its owner asked for a profile "
            "now, acknowledged or snoozed an alert, asked for an exemption from the enforcement ladder; an "
            "operator approved or refused an exemption. Who, when, what and why: shown on the job's page and kept "
            "in ClickHouse. The notifier sends no more messages for an acknowledged episode, nor for a snoozed "
            "one until its time; the enforcer runs no action on a workflow with an approved exemption."),
    },
    fields=(
        Field("action_id", "string", "Unique per action (a replay carries the same id)."),
        Field("workflow_id", "string", "The job acted on."),
        Field("kind", OWNER_ACTION_KIND, "What was done."),
        Field("alert_id", optional("string"), "The alert episode acknowledged or snoozed.", default=None),
        Field("actor", "string", "The user who did it, as the service was told (the proxy's header, MUNGE)."),
        Field("role", "string", "owner, team lead or operator: what the actor was to this job."),
        Field("reason", optional("string"), "In the actor's words (an exemption's reason, a refusal's).", default=None),
        Field(
            "until",
            optional(TIMESTAMP_MS),
            "A snooze's end; an exemption's end (null: while the workflow runs).",
            default=None,
        ),
        Field(
            "request_id",
            optional("string"),
            ("The profile request made (PROFILE_NOW), or the exemption request answered (EXEMPTION_APPROVED, "
             "EXEMPTION_REFUSED)."),
            default=None,
        ),
        Field("at", TIMESTAMP_MS, "Wall-clock time of the action."),
    ),
)
