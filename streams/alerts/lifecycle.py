"""The life of an alert per (workflow, detector): pending -> firing -> resolved.

Plain logic over a JSON-able state (kept in the workflow's entry of the worker's changelog
table, so a restarted worker neither loses nor repeats an alert). A violation must hold for
its detector's minimum duration (event time) before the alert fires; it resolves on the
first clean window; after resolving it cannot fire again within the cooldown; and an owner
is told about the same workflow and detector at most once per ``notify_every_s`` (the
anchors' e-mail rule is once per violation per 7 days; the default here is 24 h).
Every transition yields an ``Alert`` record; ``notify`` says whether to message the owner.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from streams.alerts.detectors import Violation

FIRING, RESOLVED = "FIRING", "RESOLVED"
# What belongs to one episode (its automatic profile and root cause, its last alert record):
# a new episode starts without them.
EPISODE_KEYS = ("profile_request_id", "profile_ranks", "root_cause", "findings", "root_cause_notified", "last_alert")


@dataclass(frozen=True)
class LifecycleConfig:
    cooldown_s: float = 900.0
    notify_every_s: float = 86_400.0


def step(
    state: dict, detector: str, violation: Violation | None, window: dict, wasted_so_far_s: float,
    config: LifecycleConfig, now_ms: int,
) -> tuple[dict, dict | None]:
    """Advance one (workflow, detector) by a closed window; returns (new state, alert or None)."""
    status = state.get("status")
    end = window["window_end"]
    if violation is None:
        if status == "firing":
            new = {**state, "status": "resolved", "resolved_at": end}
            return new, _alert(new, detector, RESOLVED, state["last_violation"], window, wasted_so_far_s,
                               notify=False, now_ms=now_ms)
        if status == "pending":
            return {k: v for k, v in state.items() if k not in ("status", "since")}, None
        return state, None
    last = _as_dict(violation)
    if status == "firing":
        return {**state, "last_violation": last}, None
    if status == "resolved" and end - state["resolved_at"] < config.cooldown_s * 1000:
        return state, None  # cooling down
    if status != "pending":  # a new episode
        state = {k: v for k, v in state.items() if k not in EPISODE_KEYS}
    since = state["since"] if status == "pending" else window["window_start"]
    if end - since < violation.min_duration_s * 1000:
        return {**state, "status": "pending", "since": since, "last_violation": last}, None
    last_notified = state.get("notified_at")
    notify = last_notified is None or end - last_notified >= config.notify_every_s * 1000
    new = {**state, "status": "firing", "since": since, "last_violation": last,
           "notified_at": end if notify else last_notified}
    return new, _alert(new, detector, FIRING, last, window, wasted_so_far_s, notify=notify, now_ms=now_ms)


def _as_dict(v: Violation) -> dict:
    return {"severity": v.severity, "observed": v.observed, "threshold": v.threshold,
            "message": v.message, "advice": v.advice}


def _period(since_ms: int, end_ms: int) -> str:
    """"For the 10 min since 09:50 UTC (2026-01-01)": how long a condition held, and from when."""
    since = datetime.fromtimestamp(since_ms / 1000, tz=UTC)
    return f"For the {(end_ms - since_ms) / 60_000:g} min since {since:%H:%M} UTC ({since:%Y-%m-%d})"


def _alert(state: dict, detector: str, status: str, v: dict, window: dict, wasted_so_far_s: float,
           notify: bool, now_ms: int) -> dict:
    wf = window["workflow_id"]
    message = v["message"]
    if status == FIRING:  # the whole period the rule judged, not only the window that completed it
        message = (f"{_period(state['since'], window['window_end'])}: {message[:1].lower()}{message[1:]}"
                   f" {wasted_so_far_s / 3600:.2f} GPU-hours wasted by the job so far.")
    else:
        message = f"Resolved: {detector.replace('_', ' ')} no longer holds for workflow {wf}."
    return {
        "alert_id": f"{detector}:{wf}:{state['since']}",  # one id per episode: replays and restarts repeat it
        "detector": detector,
        "severity": v["severity"],
        "status": status,
        "notify": notify,
        "workflow_id": wf,
        "owner": window.get("owner"),
        "team": window.get("team"),
        "window_start": window["window_start"],
        "window_end": window["window_end"],
        "since": state["since"],
        "observed": float(v["observed"]),
        "threshold": float(v["threshold"]),
        "wasted_gpu_hours_so_far": wasted_so_far_s / 3600,
        "message": message,
        "advice": v["advice"],
        "fired_at": now_ms,
        "profile_request_id": state.get("profile_request_id"),
        "root_cause": state.get("root_cause"),
        "findings": state.get("findings", []),
    }
