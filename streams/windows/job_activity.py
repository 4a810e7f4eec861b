"""A job's activity means over its windows: SM and tensor activity, model MFU and the CPU its
processes used, each weighted by the time of the windows that have it (SM and tensor activity
only where GPM is read). Kept in the workflow's job totals as [sum of value x seconds, seconds];
a window completed by late samples is taken out (``sign`` -1) and put back as it is now."""

from __future__ import annotations

# key in the job totals, the window's field, the window's weight (None: its length in seconds)
ACTIVITY = (("sm", "sm_active_mean_pct", "gpu_seconds"), ("tensor", "tensor_active_mean_pct", "gpu_seconds"),
            ("mfu", "model_mfu_pct", "gpu_seconds"), ("cpu", "workflow_cpu_mean_pct", None))


def add_activity(job: dict, window: dict, sign: int) -> None:
    for key, field, weight in ACTIVITY:
        value = window.get(field)
        if value is not None:
            w = (window[weight] - (window.get("unobserved_gpu_seconds") or 0.0) if weight
                 else (window["window_end"] - window["window_start"]) / 1000)
            pair = job.setdefault(key, [0.0, 0.0])
            pair[0] += sign * value * w
            pair[1] += sign * w


def activity_mean(job: dict, key: str) -> float | None:
    """The job's mean of ``key`` (a key of ``ACTIVITY``), or None where no window had it."""
    total, weight = job.get(key, (0.0, 0.0))
    return total / weight if weight > 0 else None
