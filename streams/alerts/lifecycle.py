"""The life of an alert per (workflow, detector): pending -> firing -> resolved.

Plain logic over a JSON-able state (kept in the workflow's entry of the worker's changelog
table, so a restarted worker neither loses nor repeats an alert). A violation must hold for
its detector's minimum duration (event time) before the alert fires; it resolves on the first
clean window. A violation that comes back within ``reopen_within_s`` of the resolution (and
holds its minimum duration again) continues the same episode: the same alert id, FIRING again,
recorded, with no second message; after that, it is a new episode. An owner is told about the
same workflow and detector at most once per ``notify_every_s`` (the anchors' e-mail rule is once
per violation per 7 days; the default here is 24 h). Every transition yields an ``Alert``
record; ``notify`` says whether to message the owner: on a RESOLVED, whether its episode's FIRING
was to be told, so that whichever notifier reads it (its sent log its own) tells the team the end
of what they heard of. When the workflow ends, every alert still firing resolves with the reason
(``resolve``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from streams.alerts.detectors import Violation

FIRING, RESOLVED = "FIRING", "RESOLVED"
# What belongs to one episode (its automatic profile and root cause, its last alert record):
# a new episode starts without them.
EPISODE_KEYS = ("profile_request_id", "profile_ranks", "root_cause", "findings", "root_cause_notified", "last_alert",
                "told")


@dataclass(frozen=True)
class LifecycleConfig:
    reopen_within_s: float = 3600.0  # a violation back this soon after the resolution: the same episode
    notify_every_s: float = 86_400.0


def step(
    state: dict, detector: str, violation: Violation | None, window: dict, wasted_so_far_s: float,
    config: LifecycleConfig, now_ms: int,
) -> tuple[dict, dict | None]:
    """Advance one (workflow, detector) by a closed window; returns (new state, alert or None).

    The state: ``status`` (pending, firing, resolved), ``since`` (the episode's start: its alert
    id), ``pending_since`` (where the condition that may fire began; a pending of a resolved
    episode continues it), ``resolved_at``, ``notified_at``, ``last_violation``."""
    status = state.get("status")
    end = window["window_end"]
    if status == "pending" and "pending_since" not in state:  # as releases before reopening wrote it
        state = {**state, "pending_since": state["since"]}
    if violation is None:
        if status == "firing":
            new = {**state, "status": "resolved", "resolved_at": end}
            return new, _alert(new, detector, RESOLVED, state["last_violation"], window, wasted_so_far_s,
                               notify=bool(state.get("told")), now_ms=now_ms)
        return interrupt(state), None  # a return that did not hold: the episode stays resolved
    last = _as_dict(violation)
    if status == "firing":
        return {**state, "last_violation": last}, None
    if status == "resolved":
        if window["window_start"] - state["resolved_at"] < config.reopen_within_s * 1000:
            state = {**state, "status": "pending", "pending_since": window["window_start"]}  # the same episode
        else:  # a new episode
            state = {k: v for k, v in state.items() if k not in (*EPISODE_KEYS, "resolved_at", "since")}
    if state.get("status") != "pending":
        state = {**state, "status": "pending", "pending_since": window["window_start"]}
    if end - state["pending_since"] < violation.min_duration_s * 1000:
        return {**state, "last_violation": last}, None
    again = "resolved_at" in state
    since = state["since"] if again else state["pending_since"]
    last_notified = state.get("notified_at")
    notify = not again and (last_notified is None or end - last_notified >= config.notify_every_s * 1000)
    new = {k: v for k, v in state.items() if k not in ("pending_since", "resolved_at")}
    new = {**new, "status": "firing", "since": since, "last_violation": last,
           "notified_at": end if notify else last_notified, "told": notify or bool(state.get("told"))}
    alert = _alert(new, detector, FIRING, last, window, wasted_so_far_s, notify=notify, now_ms=now_ms,
                   again_since=state["pending_since"] if again else None)
    return new, alert


def interrupt(state: dict) -> dict:
    """A window in which nothing was seen (the agent was not running): a condition building up
    starts again; a firing or resolved alert stays as it is."""
    if state.get("status") != "pending":
        return state
    back = {k: v for k, v in state.items() if k != "pending_since"}
    return {**back, "status": "resolved"} if "resolved_at" in state else {
        k: v for k, v in back.items() if k not in ("status", "since")}


def resolve(state: dict, detector: str, workflow_id: str, reason: str, at_ms: int, wasted_so_far_s: float,
            now_ms: int) -> tuple[dict, dict | None]:
    """The workflow ended (``reason``): a firing alert resolves at ``at_ms``, saying so; a
    pending one is dropped. Returns (new state, alert or None)."""
    if state.get("status") != "firing":
        return interrupt(state), None
    new = {**state, "status": "resolved", "resolved_at": at_ms}
    last = state.get("last_alert") or {}
    window = {"workflow_id": workflow_id, "window_start": at_ms, "window_end": at_ms, "owner": last.get("owner"),
              "team": last.get("team")}
    alert = _alert(new, detector, RESOLVED, state["last_violation"], window, wasted_so_far_s,
                   notify=bool(state.get("told")), now_ms=now_ms)
    alert["message"] = f"Resolved: the workflow ended ({reason}); {detector.replace('_', ' ')} no longer applies."
    return new, alert


def _as_dict(v: Violation) -> dict:
    return {"severity": v.severity, "observed": v.observed, "threshold": v.threshold,
            "message": v.message, "advice": v.advice}


def _period(since_ms: int, end_ms: int) -> str:
    """"For the 10 min since 09:50 UTC (2026-01-01)": how long a condition held, and from when."""
    since = datetime.fromtimestamp(since_ms / 1000, tz=UTC)
    return f"For the {(end_ms - since_ms) / 60_000:g} min since {since:%H:%M} UTC ({since:%Y-%m-%d})"


def _alert(state: dict, detector: str, status: str, v: dict, window: dict, wasted_so_far_s: float,
           notify: bool, now_ms: int, again_since: int | None = None) -> dict:
    wf = window["workflow_id"]
    message = v["message"]
    if status == FIRING:  # the whole period the rule judged, not only the window that completed it
        period = _period(again_since if again_since is not None else state["since"], window["window_end"])
        message = (("Again, soon after it resolved: " + period[:1].lower() + period[1:] if again_since
                    is not None else period)
                   + f": {message[:1].lower()}{message[1:]} {wasted_so_far_s / 3600:.2f} GPU-hours wasted by the job "
                     "so far.")
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
        # a replica's service, as its window's traffic names it (a window the workflow's end makes has
        # none: the episode's own, then)
        "service": (window.get("serving") or {}).get("service") or (state.get("last_alert") or {}).get("service"),
    }
