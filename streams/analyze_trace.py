"""One rank's trace analysis: feeds time-ordered events to each analyser and gathers the results.

The same object serves the command line (``gpufleet analyze``, fed from a file) and the
stream worker (fed from ``KernelEvent`` records). Events are dicts with ``kind, cat, name,
ts, dur, end, stream, correlation`` (see ``producers.read_trace``), in start order.
State: the analysers' own (per stream at most) and the CUDA runtime calls of the last
``pending_horizon_us``, which the GPU events they launched are joined to.
"""

from __future__ import annotations

from collections import deque

from streams.trace_idle_breakdown import IdleBreakdown
from streams.trace_launch_stats import LaunchStats
from streams.trace_temporal_breakdown import TemporalBreakdown

# A kernel starts at most this long after the call that launched it, or is not joined to it.
PENDING_HORIZON_US = 60_000_000


class TraceAnalyzer:
    def __init__(self, pending_horizon_us: float = PENDING_HORIZON_US) -> None:
        self.temporal = TemporalBreakdown()
        self.idle = IdleBreakdown()
        self.launch = LaunchStats()
        self.horizon = pending_horizon_us
        self.events = 0
        self.gpu_events = 0
        self.unmatched_gpu_events = 0
        self._calls: dict[int, dict] = {}
        self._call_order: deque[tuple[float, int]] = deque()
        self._last_ts: float | None = None
        self.out_of_order = 0

    def add(self, event: dict) -> None:
        """One event, in start-time order."""
        ts = event["ts"]
        if self._last_ts is not None and ts < self._last_ts:
            self.out_of_order += 1
        else:
            self._last_ts = ts
        self.events += 1
        corr = event["correlation"]
        if event["stream"] < 0:
            if corr >= 0:
                self._calls[corr] = event
                self._call_order.append((ts, corr))
                self._evict(ts)
            return
        self.gpu_events += 1
        call = self._calls.get(corr) if corr >= 0 else None
        if call is None:
            self.unmatched_gpu_events += 1
        self.temporal.add(event)
        self.idle.add(event, None if call is None else call["ts"])
        if call is not None:
            self.launch.add(call, event)

    def _evict(self, now: float) -> None:
        order, calls = self._call_order, self._calls
        while order and order[0][0] < now - self.horizon:
            ts, corr = order.popleft()
            call = calls.get(corr)
            if call is not None and call["ts"] == ts:
                del calls[corr]

    def result(self) -> dict:
        t = self.temporal.result()
        return {
            "events": self.events,
            "gpu_events": self.gpu_events,
            "gpu_events_without_launch": self.unmatched_gpu_events,
            "temporal": {
                "kernel_time_us": t.kernel_us,
                "idle_time_us": t.idle_us,
                "compute_time_us": t.compute_us,
                "non_compute_time_us": t.non_compute_us,
                "idle_pct": t.pct(t.idle_us),
                "compute_pct": t.pct(t.compute_us),
                "non_compute_pct": t.pct(t.non_compute_us),
            },
            "overlap": {
                "communication_time_us": t.communication_us,
                "comp_comm_overlap_us": t.comp_comm_overlap_us,
                "comp_comm_overlap_pct": t.overlap_pct,
            },
            "idle_by_stream": self.idle.result(),
            "launch": self.launch.result(),
        }


def analyze_events(events) -> dict:
    """Analyse an iterable of time-ordered events of one rank."""
    analyzer = TraceAnalyzer()
    for e in events:
        analyzer.add(e)
    return analyzer.result()
