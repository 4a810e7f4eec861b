"""Alert: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import OWNER, TEAM, TIMESTAMP_MS, Enum, Field, Record, array, optional
from schemas.records.finding import CARRIED

SEVERITY = Enum(
    "Severity",
    ("INFO", "WARNING", "CRITICAL"),
)


ALERT_STATUS = Enum(
    "AlertStatus",
    ("FIRING", "RESOLVED"),
)


ALERT_FINDING = Record(
    "AlertFinding",
    fields=(
        *CARRIED,
        Field("ranks", "int", "How many of the profiled ranks showed it."),
    ),
)


ALERT = Record(
    "Alert",
    versions={
        1: "Something a job owner should act on, with the evidence and what to try.",
        2: ("An alert's transition (FIRING or RESOLVED) for one workflow and detector, with the evidence and what "
            "to try. v2 adds the life cycle."),
        3: ("An alert's transition (FIRING or RESOLVED) for one workflow and detector, with the evidence and what "
            "to try. v2 adds the life cycle; v3 the automatic profile it caused and, once that profile is "
            "analysed, its root cause (an update of the same alert_id)."),
        4: ("An alert's transition (FIRING or RESOLVED) for one workflow and detector, with the evidence and what "
            "to try. v2 adds the life cycle; v3 the automatic profile it caused and, once that profile is "
            "analysed, its root cause (an update of the same alert_id); v4 the service a serving replica's "
            "alert is of."),
    },
    fields=(
        Field(
            "alert_id",
            "string",
            "detector:workflow:episode start; a replay or restart repeats it, a RESOLVED has its FIRING's id.",
        ),
        Field("detector", "string", "The detector that judged it (streams/alerts/detectors.py)."),
        Field("severity", SEVERITY, "INFO, WARNING or CRITICAL."),
        Field("status", ALERT_STATUS, "FIRING or RESOLVED: the transition this record is.", since=2, default="FIRING"),
        Field(
            "notify",
            "boolean",
            "Whether the owner should be messaged (the rate limit allows it).",
            since=2,
            default=True,
        ),
        Field("workflow_id", "string", "The workflow (the record's key)."),
        OWNER,
        TEAM,
        Field("window_start", TIMESTAMP_MS, "The start of the window that decided the transition."),
        Field("window_end", TIMESTAMP_MS, "That window's end."),
        Field("since", TIMESTAMP_MS, "Start of the episode: the first window of the violation.", since=2, default=0),
        Field("observed", "double", "The measured value that tripped the detector."),
        Field("threshold", "double", "The threshold the detector's value was held to."),
        Field(
            "wasted_gpu_hours_so_far",
            optional("double"),
            "GPU-hours the job has wasted since it started.",
            since=2,
            default=None,
        ),
        Field("message", "string", "What is wrong, in plain words."),
        Field("advice", "string", "What to try."),
        Field("fired_at", TIMESTAMP_MS, "When the worker decided it (wall time)."),
        Field(
            "profile_request_id",
            optional("string"),
            ("The automatic profile this episode caused (ProfileRequest.request_id); its traces are "
             "profile/<id>/<host>/rank<r>."),
            since=3,
            default=None,
        ),
        Field(
            "root_cause",
            optional("string"),
            "What the automatic profile found, in words; null until its analysis lands.",
            since=3,
            default=None,
        ),
        Field(
            "findings",
            array(ALERT_FINDING),
            "The profile's top findings, most GPU time at stake first.",
            since=3,
            default=[],
        ),
        Field(
            "service",
            optional("string"),
            ("The service the workflow is a serving replica of (ServingWindow.service), for an alert of a replica; "
             "null for any other workflow. The notifier tells a service's idle replicas together."),
            since=4,
            default=None,
        ),
    ),
)
