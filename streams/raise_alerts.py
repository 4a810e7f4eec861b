"""Runs the detectors and the alert life cycle on a workflow's closed window -> ``Alert`` records.

The state (each detector's life cycle, and the GPU-seconds the job has wasted so far) lives
in the workflow's entry of the worker's window-state table, so it is checkpointed with the
windows themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from streams.alert_lifecycle import LifecycleConfig, step
from streams.detect_waste import DETECTORS, DetectorConfig, detect


@dataclass(frozen=True)
class AlertConfig:
    detectors: DetectorConfig = field(default_factory=DetectorConfig)
    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)
    # When set, every detector's minimum duration (for demos and tests at compressed time).
    min_duration_s: float | None = None


def raise_alerts(state: dict, window: dict, config: AlertConfig, now_ms: int) -> list[dict]:
    """Advance every detector's life cycle by ``window``; return the alerts that transition."""
    lifecycles = state.setdefault("alerts", {})
    state["wasted_s"] = state.get("wasted_s", 0.0) + window["wasted_gpu_seconds"]
    violations = detect(window, config.detectors)
    out = []
    for fn in DETECTORS:
        name = fn.__name__
        v = violations.get(name)
        if v is not None and config.min_duration_s is not None:
            v = replace(v, min_duration_s=config.min_duration_s)
        new, alert = step(lifecycles.get(name, {}), name, v, window, state["wasted_s"], config.lifecycle, now_ms)
        if new:
            lifecycles[name] = new
        else:
            lifecycles.pop(name, None)
        if alert is not None:
            out.append(alert)
    return out
