"""Detector: a closed ``WorkflowWindow`` whose mean GPU utilisation is under a threshold -> ``Alert``."""

from __future__ import annotations

from dataclasses import dataclass

DETECTOR = "low_utilization"


@dataclass(frozen=True)
class LowUtilizationConfig:
    threshold_pct: float = 30.0
    critical_pct: float = 5.0


def detect_low_utilization(window: dict, config: LowUtilizationConfig, fired_at: int) -> dict | None:
    """An ``Alert`` for ``window`` if its mean utilisation is under the threshold, else None."""
    mean = window["utilization_mean_pct"]
    if mean >= config.threshold_pct:
        return None
    wasted_gpu_s = window["gpu_seconds"] * (1.0 - mean / 100.0)
    critical = mean < config.critical_pct
    minutes = (window["window_end"] - window["window_start"]) / 60_000
    if critical:
        message = (
            f"Workflow {window['workflow_id']} held {window['gpu_count']} GPU(s) at "
            f"{mean:.1f}% mean utilisation for {minutes:g} min: the GPUs are allocated but "
            f"almost idle ({wasted_gpu_s / 3600:.2f} GPU-hours wasted in this window)."
        )
        advice = (
            "Check that the job is still making progress; if it is stuck or finished, release "
            "its GPUs. If it is waiting for input, profile its data pipeline."
        )
    else:
        message = (
            f"Workflow {window['workflow_id']} ran its {window['gpu_count']} GPU(s) at "
            f"{mean:.1f}% mean utilisation for {minutes:g} min (threshold "
            f"{config.threshold_pct:g}%): {wasted_gpu_s / 3600:.2f} GPU-hours wasted in this window."
        )
        advice = (
            "Look for an input-bound loop (raise DataLoader num_workers, pin_memory), host "
            "synchronisations, or a batch size too small for the GPU; or ask for fewer GPUs."
        )
    return {
        "alert_id": f"{DETECTOR}:{window['workflow_id']}:{window['window_start']}",
        "detector": DETECTOR,
        "severity": "CRITICAL" if critical else "WARNING",
        "workflow_id": window["workflow_id"],
        "owner": window.get("owner"),
        "team": window.get("team"),
        "window_start": window["window_start"],
        "window_end": window["window_end"],
        "observed": mean,
        "threshold": config.threshold_pct,
        "message": message,
        "advice": advice,
        "fired_at": fired_at,
    }
