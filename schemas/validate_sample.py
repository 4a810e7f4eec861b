"""Checks a decoded ``GpuSample`` for values no GPU can report; returns the reason or None.

Part of the contract: the worker and the sink both refuse what fails it (to the dead-letter topic).
"""

from __future__ import annotations

# 2000-01-01T00:00:00Z: an event time before this is a clock or unit error (seconds, not ms).
MIN_EVENT_TIME_MS = 946_684_800_000
MAX_INTERVAL_MS = 3_600_000


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
