"""Runs the detectors and the alert life cycle on a workflow's closed window -> ``Alert`` records.

The state (each detector's life cycle, and the GPU-seconds the job has wasted so far) lives
in the workflow's entry of the worker's window-state table, so it is checkpointed with the
windows themselves.

What is judged is what the waterfall counts (``streams.windows.goodput``): a window with no
sample (its GPU time unobserved: the agent was not running) is judged by no detector, and a
condition that was building up (pending) starts again after it; a window holding start-up time
is not judged by the detectors of how the GPUs are used (``USAGE``), since the waterfall counts
those seconds as start-up, not as idle or low utilisation. Nor is a serving replica's window (one
with ``serving`` figures, ``streams.serving.traffic``): a replica is judged by its traffic, by the
detectors in ``SERVING``. When the workflow ends, every alert still firing resolves with the
reason (``end_alerts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from msgspec.structs import replace

from schemas.vocabulary import wasted_seconds
from streams.alerts.detectors import DETECTORS, Thresholds, detect
from streams.alerts.lifecycle import LifecycleConfig, interrupt, resolve, step


class AlertState(Protocol):
    """What the alerts keep of a workflow (``streams.windows.workflow_state.WorkflowState`` has
    it): each detector's life cycle, the GPU-seconds wasted so far, the job's totals."""

    alerts: dict[str, dict]
    wasted_s: float
    job: dict | None


@dataclass(frozen=True)
class AlertConfig:
    """How alerts live (the thresholds they judge by are the worker's one ``Thresholds``)."""

    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)
    # When set, every detector's minimum duration (for demos and tests at compressed time).
    min_duration_s: float | None = None


# The detectors of how the GPUs are used: the seconds the waterfall counts as start-up are start-up to them.
USAGE = frozenset({"low_utilization", "idle_allocated", "partial_use", "imbalance", "memory_underuse", "input_bound"})

SERVING = frozenset({"idle_replica", "saturated"})  # the detectors of a serving replica's traffic


def raise_alerts(state: AlertState, window: dict, config: AlertConfig, now_ms: int, *,
                 thresholds: Thresholds) -> list[dict]:
    """Advance every detector's life cycle by ``window``, judged by its team's ``thresholds``;
    return the alerts that transition."""
    lifecycles = state.alerts
    state.wasted_s += wasted_seconds(window)  # as every report counts it (schemas.vocabulary)
    observed = window.get("sample_count", 1) > 0
    serving = window.get("serving") is not None
    starting = (window.get("startup_gpu_seconds") or 0.0) > 0
    violations = detect(_with_job_totals(state, window), thresholds.for_team(window.get("team"))) if observed else {}
    out = []
    for fn in DETECTORS:
        name = fn.__name__
        if not observed or (starting and name in USAGE) or (name in SERVING and not serving):
            if not observed and name in lifecycles:
                lifecycles[name] = interrupt(lifecycles[name])  # nothing seen: nothing builds up
            continue
        v = None if serving and name in USAGE else violations.get(name)  # a replica: judged by its traffic
        if v is not None and config.min_duration_s is not None:
            v = replace(v, min_duration_s=config.min_duration_s)
        new, alert = step(lifecycles.get(name, {}), name, v, window, state.wasted_s, config.lifecycle, now_ms)
        if alert is not None:
            new["last_alert"] = alert  # a root cause that lands later updates this record
            out.append(alert)
        if new:
            lifecycles[name] = new
        else:
            lifecycles.pop(name, None)
    return out


def end_alerts(state: AlertState, workflow_id: str, reason: str, at_ms: int, now_ms: int) -> list[dict]:
    """The workflow ended (``reason``) at ``at_ms``: each of its alerts still firing resolves,
    saying why; a condition building up is dropped."""
    out = []
    for name in list(state.alerts):
        new, alert = resolve(state.alerts[name], name, workflow_id, reason, at_ms, state.wasted_s, now_ms)
        if alert is not None:
            new["last_alert"] = alert
            out.append(alert)
        if new:
            state.alerts[name] = new
        else:
            state.alerts.pop(name)
    return out


def _with_job_totals(state: AlertState, window: dict) -> dict:
    """The window with what the detectors judge over the whole job so far: the memory peak
    (the job's totals, ``state.job``, hold the windows before this one)."""
    peaks = [p for p in ((state.job or {}).get("mem_peak"), window.get("memory_peak_fraction"))
             if p is not None]
    return {**window, "job_memory_peak_fraction": max(peaks)} if peaks else window
