"""ServingWindow: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import OWNER, TEAM, TIMESTAMP_MS, Enum, Field, Record, optional

SERVING_STATE = Enum(
    "ServingState",
    ("BUSY", "HEADROOM", "IDLE", "SATURATED"),
)


SERVING_WINDOW = Record(
    "ServingWindow",
    versions={
        1: ("A serving replica's closed event-time window, judged by the traffic it served: BUSY (near the "
            "capacity the replica showed in its own busiest windows), HEADROOM (traffic below it: spare capacity "
            "a service needs, not waste), IDLE (no request: the GPU time is held for no traffic) or SATURATED "
            "(requests queued longer than the target: too few replicas). One per replica and window, beside its "
            "WorkflowWindow; per service, the replicas held against those the peak needed come from these "
            "(gpufleet serving)."),
    },
    fields=(
        Field("workflow_id", "string", "The replica's workflow."),
        OWNER,
        TEAM,
        Field("service", "string", "The service it serves (a model or deployment)."),
        Field("engine", "string", "vllm, sglang, tgi or triton."),
        Field("window_start", TIMESTAMP_MS, "The window's start (event time)."),
        Field("window_end", TIMESTAMP_MS, "Its end, excluded."),
        Field("gpu_count", "int", "The replica's GPUs in the window (0: its GPU samples did not come)."),
        Field("gpu_seconds", "double", "Their GPU-seconds."),
        Field("utilization_mean_pct", "double", "Their mean utilisation."),
        Field("requests", "double", "Requests it finished in the window."),
        Field("requests_per_s", "double", "Those a second."),
        Field("tokens_per_s", optional("double"), "Tokens it generated a second.", default=None),
        Field("queue_time_ms", optional("double"), "The window's requests' mean queue time.", default=None),
        Field(
            "ttft_ms",
            optional("double"),
            "The mean time to first token of the requests that finished.",
            default=None,
        ),
        Field("waiting_max", optional("double"), "The most requests waiting at one reading.", default=None),
        Field(
            "capacity_per_s",
            optional("double"),
            ("The requests a second the replica served in its busiest window within the queue target so far; null "
             "until it served any."),
            default=None,
        ),
        Field("capacity_window_start", optional(TIMESTAMP_MS), "The window that capacity came from.", default=None),
        Field(
            "capacity_windows",
            "int",
            "How many of the replica's windows served traffic within the target (what the capacity was learnt from).",
        ),
        Field("state", SERVING_STATE, "BUSY, HEADROOM, IDLE or SATURATED."),
        Field(
            "idle_since",
            optional(TIMESTAMP_MS),
            "For an IDLE window: when the replica served its last request (its first window's start if none yet).",
            default=None,
        ),
        Field("closed_at", TIMESTAMP_MS, "When the window was judged."),
    ),
)
