"""Job-to-date efficiency of a workflow, accumulated from its closed windows -> ``WorkflowSummary``.

The totals live in the workflow's entry of the worker's window-state table; when the
workflow ends (no sample for a configurable time) one ``WorkflowSummary`` closes it: the
efficiency record of every executed workflow.
"""

from __future__ import annotations

from schemas.goodput_buckets import JOULES_FIELDS, SECONDS_FIELDS
from streams.windows.job_activity import activity_mean, add_activity
from streams.windows.right_size import recommend
from streams.windows.workflow_state import WorkflowState

_SUMS = ("gpu_seconds", "active_gpu_seconds", "wasted_gpu_seconds", "zero_util_gpu_seconds",
         "throttled_gpu_seconds", *SECONDS_FIELDS, *JOULES_FIELDS)


def observed(window: dict) -> float:
    """A window's GPU-seconds that samples stand for."""
    return window["gpu_seconds"] - (window.get("unobserved_gpu_seconds") or 0.0)


def accumulate(state: WorkflowState, window: dict, alerts: list[dict]) -> None:
    """Add a closed window (and the alerts it raised) to the job's totals."""
    if state.job is None:
        state.job = {
            "first": window["window_start"], "last": window["window_end"], "windows": 0, "max_gpus": 0,
            "util_weighted": 0.0, "energy_j": None, "mem_peak": None, "xids": 0, "fired": [],
            **{k: 0.0 for k in _SUMS},
        }
    job = state.job
    job["first"] = min(job["first"], window["window_start"])
    job["last"] = max(job["last"], window["window_end"])
    job["windows"] += 1
    job["max_gpus"] = max(job["max_gpus"], window["gpu_count"])
    for k in _SUMS:
        job[k] = job.get(k, 0.0) + window.get(k, 0.0)  # totals begun before goodput lack its keys
    if window.get("gpu_model"):
        job["model"] = window["gpu_model"]
    job["util_weighted"] += window["utilization_mean_pct"] * observed(window)
    add_activity(job, window, 1)
    if window.get("energy_joules") is not None:
        job["energy_j"] = (job["energy_j"] or 0.0) + window["energy_joules"]
    if window.get("memory_peak_fraction") is not None:
        job["mem_peak"] = max(job["mem_peak"] or 0.0, window["memory_peak_fraction"])
    if window.get("allocator_peak_fraction") is not None:
        job["alloc_peak"] = max(job.get("alloc_peak") or 0.0, window["allocator_peak_fraction"])
    if window.get("host_memory_per_gpu_bytes") is not None:
        job["host_mem_per_gpu"] = max(job.get("host_mem_per_gpu") or 0.0, window["host_memory_per_gpu_bytes"])
    job["xids"] += window["xid_count"]
    _add_opened(job, window)
    for a in alerts:
        if a["status"] == "FIRING" and a["detector"] not in job["fired"]:
            job["fired"].append(a["detector"])


def _add_opened(job: dict, window: dict) -> None:
    """Which of the job's GPUs a process of it ever opened, and which it was given and never did
    (where the agents count processes): the GPUs of a job that ran on the CPU only."""
    opened = set(job.get("opened") or ()) | set(window.get("opened_gpu_names") or ())
    seen = set(job.get("unopened") or ()) | set(window.get("untouched_gpu_names") or ())
    if opened or seen:
        job["opened"], job["unopened"] = sorted(opened), sorted(seen - opened)


def untouched_gpus(job: dict) -> int | None:
    """The GPUs no process of the job ever opened (None: no agent counted its processes)."""
    if "opened" not in job:
        return None
    return len(set(job["unopened"]) - set(job["opened"]))


def correct(state: WorkflowState, before: dict | None, after: dict) -> None:
    """A window completed by late samples: the job's totals take ``after`` in place of
    ``before`` (its previous emission; None where the window never closed before)."""
    if before is None or not state.job:
        accumulate(state, after, [])
        return
    job = state.job
    for k in _SUMS:
        job[k] = job.get(k, 0.0) + after.get(k, 0.0) - before.get(k, 0.0)
    job["max_gpus"] = max(job["max_gpus"], after["gpu_count"])
    job["util_weighted"] += (after["utilization_mean_pct"] * observed(after)
                             - before["utilization_mean_pct"] * observed(before))
    add_activity(job, before, -1)
    add_activity(job, after, 1)
    if after.get("energy_joules") is not None:
        job["energy_j"] = (job["energy_j"] or 0.0) + after["energy_joules"] - (before.get("energy_joules") or 0.0)
    if after.get("memory_peak_fraction") is not None:
        job["mem_peak"] = max(job["mem_peak"] or 0.0, after["memory_peak_fraction"])
    if after.get("allocator_peak_fraction") is not None:
        job["alloc_peak"] = max(job.get("alloc_peak") or 0.0, after["allocator_peak_fraction"])
    job["xids"] += after["xid_count"] - before["xid_count"]
    _add_opened(job, after)


def end_of(state: WorkflowState, scheduler: str) -> str:
    """How the scheduler says the job ended, in words: "slurm: CANCELLED by ana", "slurm:
    TIMEOUT (its time limit)", "slurm: FAILED with exit code 3", "slurm: COMPLETED"."""
    what = state.end_state
    if what is None:
        return f"its scheduler ({scheduler}) ended it"
    if what == "CANCELLED" and state.cancelled_by:
        what += f" by {state.cancelled_by}"
    elif what == "TIMEOUT":
        what += " (it reached its time limit)"
    elif what == "FAILED" and state.exit_code:
        what += f" with exit code {state.exit_code}"
    elif state.exit_signal and what in ("FAILED", "CANCELLED", "OUT_OF_MEMORY"):
        what += f" (signal {state.exit_signal})"
    return f"{scheduler}: {what}"


def summary(workflow_id: str, state: WorkflowState, reason: str, now_ms: int) -> dict | None:
    """The ``WorkflowSummary`` of a workflow's totals (None if no window of it ever closed)."""
    job = state.job
    if not job:
        return None
    seconds = job["gpu_seconds"] - job.get("unobserved_gpu_seconds", 0.0)  # the utilisation of what was seen
    return {
        "workflow_id": workflow_id, "owner": state.owner, "team": state.team,
        "first_window_start": job["first"], "last_window_end": job["last"], "end_reason": reason,
        "windows": job["windows"], "max_gpus": job["max_gpus"],
        **{k: job.get(k, 0.0) for k in _SUMS}, "gpu_model": job.get("model"),
        "utilization_mean_pct": job["util_weighted"] / seconds if seconds else 0.0,
        "memory_peak_fraction": job["mem_peak"], "energy_joules": job["energy_j"], "xid_count": job["xids"],
        "alerts_fired": sorted(job["fired"]), "tensor_active_mean_pct": activity_mean(job, "tensor"),
        "model_mfu_pct": activity_mean(job, "mfu"), "right_size": recommend(job), "summarized_at": now_ms,
        # what the scheduler says of it (WorkflowSummary v4)
        "scheduler": state.scheduler, "scheduler_job_id": state.scheduler_job_id, "allocated_at": state.allocated_at,
        "ended_at": state.ended_at, "end_state": state.end_state, "exit_code": state.exit_code,
        "exit_signal": state.exit_signal, "cancelled_by": state.cancelled_by,
        "untouched_gpus": untouched_gpus(job),  # WorkflowSummary v5
    }
