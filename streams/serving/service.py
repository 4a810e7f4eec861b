"""A service (the replicas of one model or deployment) from its replicas' ``ServingWindow``s:
its busiest span, the replicas that span needed, and the GPU-hours the others held.

The replicas needed are the fewest whose capacities (each replica's own, learnt from its
busiest window within the queue target: ``streams.serving.traffic``), largest first, cover the
peak's requests a second with the margin; never more than the replicas there are. A service whose
replicas never saturated states an upper bound: none of them showed what it could do at most.

A service's load is computed from its spans (``Span``) and its replicas (``Replica``), each
summed over the windows: here from the windows themselves (``load``), and by ClickHouse for the
reports (``gpufleet.reports.serving``), which would otherwise carry every window of a week of a
fleet into Python. The rule is this module's alone (``of_parts``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
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


@dataclass(frozen=True)
class Span:
    """The service's windows that start in one span: its requests, its replicas and their GPU-seconds."""

    start: int  # ms
    requests: float
    replicas: int
    gpu_seconds: float


@dataclass(frozen=True)
class Replica:
    """One replica's windows of the service, summed."""

    workflow_id: str
    first_start: int  # ms, its first window's start
    last_end: int  # ms, its last window's end
    served_end: int | None  # ms, the end of its last window with a request (None: it served none)
    gpu_seconds: float
    idle_gpu_seconds: float  # of its windows without a request
    capacity_per_s: float | None  # the largest it had (None: none learnt)
    requests: float = 0.0
    states: dict[str, int] = field(default_factory=dict)  # windows by state (BUSY, HEADROOM, SATURATED, IDLE)

    @property
    def idle_tail_ms(self) -> int:
        """Its time without a request at the end of what was looked at: from the end of its last
        window that served traffic (or its first window's start) to its last window's end."""
        return self.last_end - (self.served_end if self.served_end is not None else self.first_start)


def idle_tails(windows: Iterable[dict]) -> dict[str, int]:
    """Each replica's time without a request at the end of what was looked at (ms)."""
    return {r.workflow_id: r.idle_tail_ms for r in replicas_of(windows)}


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


def spans_of(windows: Iterable[dict], span_ms: int) -> list[Span]:
    spans: dict[int, list] = defaultdict(lambda: [0.0, set(), 0.0])  # requests, replicas, gpu-seconds
    for w in windows:
        span = spans[w["window_start"] // span_ms * span_ms]
        span[0] += w["requests"]
        span[1].add(w["workflow_id"])
        span[2] += w["gpu_seconds"]
    return [Span(start, requests, len(live), gpu_s) for start, (requests, live, gpu_s) in sorted(spans.items())]


def replicas_of(windows: Iterable[dict]) -> list[Replica]:
    by_replica: dict[str, list[dict]] = defaultdict(list)
    for w in windows:
        by_replica[w["workflow_id"]].append(w)
    out = []
    for wf, mine in sorted(by_replica.items()):
        served = [w["window_end"] for w in mine if w["requests"] > 0]
        capacities = [w["capacity_per_s"] for w in mine if w.get("capacity_per_s") is not None]
        out.append(Replica(wf, min(w["window_start"] for w in mine), max(w["window_end"] for w in mine),
                           max(served) if served else None, sum(w["gpu_seconds"] for w in mine),
                           sum(w["gpu_seconds"] for w in mine if w["state"] == "IDLE"),
                           max(capacities) if capacities else None, sum(w["requests"] for w in mine),
                           dict(Counter(w["state"] for w in mine))))
    return out


def load(service: str, windows: Iterable[dict], span_ms: int, margin: float) -> ServiceLoad:
    """The service's load from its replicas' windows: the busiest span of ``span_ms`` (requests
    over the span), the replicas it needed, and the GPU-hours replicas beyond those held."""
    windows = list(windows)
    return of_parts(service, spans_of(windows, span_ms), replicas_of(windows), span_ms, margin)


def of_parts(service: str, spans: Sequence[Span], replicas: Sequence[Replica], span_ms: int,
             margin: float) -> ServiceLoad:
    """The service's load from its spans and replicas."""
    if not spans:
        return ServiceLoad(service, 0, 0.0, 0.0, 0, 0.0, 0, 0, 0.0, 0)
    busiest = max(spans, key=lambda s: (s.requests, -s.start))
    peak = busiest.requests / (span_ms / 1000)
    needed = replicas_needed([r.capacity_per_s for r in replicas if r.capacity_per_s is not None], peak, margin)
    # Each span's GPU time beyond the needed replicas' share of it (replicas held alike).
    freed = sum(max(0, s.replicas - needed) / s.replicas * s.gpu_seconds for s in spans if s.replicas)
    return ServiceLoad(service, len(replicas), sum(r.gpu_seconds for r in replicas) / 3600,
                       sum(r.idle_gpu_seconds for r in replicas) / 3600,
                       busiest.start, peak, busiest.replicas, needed, freed / 3600,
                       sum(r.states.get("SATURATED", 0) for r in replicas), {r.workflow_id: r.idle_tail_ms
                                                                          for r in replicas})
