"""The closed loop's first half: a workflow whose GPUs go underused gets profiled automatically.

When a low-utilisation or input-bound alert fires, the worker asks the agents for one
profile of that workflow (every host that runs it with the profiling hook answers), at most
once per ``every_s`` of event time per workflow, so that the analysis and its findings --
the root cause -- are there while the owner reads the alert. The request id is derived from
the alert's, so a request and the episode that caused it are linked in ClickHouse.
"""

from __future__ import annotations

from dataclasses import dataclass

from streams.profiling.root_cause import FOLLOWS
from streams.windows.workflow_state import WorkflowState

# The detectors whose firing alert asks for an automatic profile: the trace shows their cause.
PROFILED_DETECTORS = ("low_utilization", "input_bound")


@dataclass(frozen=True)
class AutoProfileConfig:
    enabled: bool = True
    every_s: float = 6 * 3600.0  # at most one automatic profile per workflow in this much event time
    steps: int = 20
    deadline_s: float = 600.0


def request_id_for(alert_id: str) -> str:
    return "auto-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in alert_id)


def auto_profile_requests(
    state: WorkflowState, alerts: list[dict], config: AutoProfileConfig, now_ms: int
) -> list[dict]:
    """``ProfileRequest`` records for the alerts that call for one (recorded in ``state``)."""
    if not config.enabled:
        return []
    out = []
    for alert in alerts:
        if alert["status"] != "FIRING" or alert["detector"] not in PROFILED_DETECTORS:
            continue
        last = state.auto_profiled_at
        if last is not None and alert["window_end"] - last < config.every_s * 1000:
            continue
        state.auto_profiled_at = alert["window_end"]
        request_id = request_id_for(alert["alert_id"])
        # The episode knows its profile: the analysis, when it lands, updates this alert
        # (streams.profiling.root_cause). The alert record is the episode's last_alert: one object.
        state.alerts.setdefault(alert["detector"], {})["profile_request_id"] = request_id
        alert["profile_request_id"] = request_id
        alert["message"] += FOLLOWS
        out.append({
            "request_id": request_id, "workflow_id": alert["workflow_id"], "hosts": [],
            "ranks": [], "duration_ms": None, "steps": config.steps, "reason": "AUTO",
            "requester": alert["alert_id"], "requested_at": now_ms,
            "deadline_ms": now_ms + int(config.deadline_s * 1000),
        })
    return out
