"""Checks a decoded ``GpuSample`` for values no GPU can report; returns the reason or None.

Part of the contract: the worker and the sink both refuse what fails it (to the dead-letter topic).
"""

from __future__ import annotations

# 2000-01-01T00:00:00Z: an event time before this is a clock or unit error (seconds, not ms).
MIN_EVENT_TIME_MS = 946_684_800_000
MAX_INTERVAL_MS = 3_600_000

# The workflow ids of GPU samples that belong to no workflow: GPUs no process holds (idle
# capacity), and GPUs whose memory is held by a process that names no workflow.
IDLE = "idle"
UNATTRIBUTED = "unattributed"
NOT_WORKFLOWS = frozenset({IDLE, UNATTRIBUTED})


def _pct(name: str, value: float | None) -> str | None:
    if value is None:
        return None
    if not 0.0 <= value <= 100.0:  # also rejects NaN
        return f"{name} {value} is outside 0..100"
    return None


def validate_sample(r: dict) -> str | None:
    """None when the sample is usable, else what is wrong with it, in words."""
    if not r["workflow_id"]:
        return "empty workflow_id: the sample cannot be attributed to a workflow"
    if r["event_time"] < MIN_EVENT_TIME_MS:
        return f"event_time {r['event_time']} is before 2000-01-01 (expected epoch milliseconds)"
    if not 0 < r["interval_ms"] <= MAX_INTERVAL_MS:
        return f"interval_ms {r['interval_ms']} is outside 1..{MAX_INTERVAL_MS}"
    reason = _pct("utilization_pct", r["utilization_pct"]) or _pct(
        "memory_utilization_pct", r.get("memory_utilization_pct")
    )
    if reason:
        return reason
    used, total = r.get("memory_used_bytes"), r.get("memory_total_bytes")
    if used is not None and used < 0:
        return f"memory_used_bytes {used} is negative"
    if used is not None and total is not None and used > total:
        return f"memory_used_bytes {used} exceeds memory_total_bytes {total}"
    power = r.get("power_watts")
    if power is not None and not power >= 0.0:
        return f"power_watts {power} is negative"
    share = r.get("share")
    if share is not None and not 0.0 < share <= 1.0:
        return f"share {share} is outside (0, 1]"
    return None


def batch_samples(samples: list[dict], per_tick: bool = True, max_samples: int = 1000) -> list[dict]:
    """Group samples into ``GpuSampleBatch`` records, in the order each group first appears:
    one per (host, workflow, event time), or with ``per_tick=False`` one per (host, workflow)
    over several ticks (its ``event_time`` is its first sample's), at most ``max_samples``
    samples each so that a backlog does not make a message too large for the broker."""
    groups: dict[tuple, list[dict]] = {}
    for s in samples:
        key = (s["host"], s["workflow_id"], s["event_time"] if per_tick else None)
        groups.setdefault(key, []).append(s)
    return [{"host": host, "workflow_id": wf, "event_time": members[i]["event_time"],
             "samples": members[i:i + max_samples]}
            for (host, wf, _), members in groups.items() for i in range(0, len(members), max_samples)]


def samples_of(name: str, record: dict) -> list[tuple[dict, str | None]]:
    """The samples a ``GpuSample`` or ``GpuSampleBatch`` message carries, each with the reason
    it is unusable (or None). A batch's sample must belong to the batch's workflow: the
    message key, and so the partition, is the batch's."""
    if name == "GpuSample":
        return [(record, validate_sample(record))]
    if not record["samples"]:
        return []
    out = []
    for i, s in enumerate(record["samples"]):
        if s["workflow_id"] != record["workflow_id"]:
            reason = (f"sample {i} of a batch for workflow {record['workflow_id']!r} belongs to "
                      f"{s['workflow_id']!r}")
        else:
            reason = validate_sample(s)
            if reason:
                reason = f"sample {i} of the batch: {reason}"
        out.append((s, reason))
    return out
