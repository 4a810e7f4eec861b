"""A service (the replicas of one model or deployment) from its replicas' ``ServingWindow``s:
its busiest span, the replicas that span needed, and the GPU-hours the others held.

The replicas needed are the fewest whose capacities (each replica's own, learnt from its
busiest window within the queue target: ``streams.serving.traffic``), largest first, cover the
peak's requests a second with the margin; never more than the replicas there are. A service whose
replicas never saturated states an upper bound: none of them showed what it could do at most.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ServiceLoad:
    service: str
    replicas: int  # that served or held GPUs for it in the time looked at
    gpu_hours: float
    idle_gpu_hours: float  # in windows without a request
    peak_start: int  # the busiest span's start (ms)
    peak_per_s: float  # its requests a second
    replicas_at_peak: int
    replicas_needed: int
    freed_gpu_hours: float  # held beyond the replicas needed, span by span
    saturated_windows: int  # none: the capacities are upper bounds
    idle_tails: dict[str, int] = field(default_factory=dict)  # replica -> ms without a request at its end


def idle_tails(windows: Iterable[dict]) -> dict[str, int]:
    """Each replica's time without a request at the end of what was looked at (ms): from the end
    of its last window that served traffic (or its first window's start) to its last window's end."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    served: dict[str, int] = {}
    for w in windows:
        wf, start, end = w["workflow_id"], w["window_start"], w["window_end"]
        first[wf] = min(first.get(wf, start), start)
        last[wf] = max(last.get(wf, end), end)
        if w["requests"] > 0:
            served[wf] = max(served.get(wf, end), end)
    return {wf: last[wf] - served.get(wf, first[wf]) for wf in last}


def replicas_needed(capacities: Sequence[float], peak_per_s: float, margin: float) -> int:
    """The fewest replicas whose capacities, largest first, cover ``peak_per_s`` x (1 + margin);
    all of them where even all fall short."""
    need, total, k = peak_per_s * (1 + margin), 0.0, 0
    for capacity in sorted(capacities, reverse=True):
        if total >= need:
            break
        total += capacity
        k += 1
    return k


def load(service: str, windows: Iterable[dict], span_ms: int, margin: float) -> ServiceLoad:
    """The service's load from its replicas' windows: the busiest span of ``span_ms`` (requests
    over the span), the replicas it needed, and the GPU-hours replicas beyond those held."""
    windows = list(windows)
    spans: dict[int, list] = defaultdict(lambda: [0.0, set(), 0.0])  # requests, replicas, gpu-seconds
    capacity: dict[str, float] = {}
    gpu_s = idle_s = 0.0
    saturated = 0
    for w in windows:
        span = spans[w["window_start"] // span_ms * span_ms]
        span[0] += w["requests"]
        span[1].add(w["workflow_id"])
        span[2] += w["gpu_seconds"]
        gpu_s += w["gpu_seconds"]
        idle_s += w["gpu_seconds"] if w["state"] == "IDLE" else 0.0
        saturated += w["state"] == "SATURATED"
        if w.get("capacity_per_s") is not None:
            capacity[w["workflow_id"]] = max(capacity.get(w["workflow_id"], 0.0), w["capacity_per_s"])
    if not spans:
        return ServiceLoad(service, 0, 0.0, 0.0, 0, 0.0, 0, 0, 0.0, 0)
    start, (requests, live, _) = max(spans.items(), key=lambda kv: (kv[1][0], -kv[0]))
    peak = requests / (span_ms / 1000)
    needed = replicas_needed(list(capacity.values()), peak, margin)
    # Each span's GPU time beyond the needed replicas' share of it (replicas held alike).
    freed = sum(max(0, len(s[1]) - needed) / len(s[1]) * s[2] for s in spans.values() if s[1])
    replicas = set().union(*(s[1] for s in spans.values()))
    return ServiceLoad(service, len(replicas), gpu_s / 3600, idle_s / 3600, start, peak, len(live), needed,
                       freed / 3600, saturated, idle_tails(windows))
