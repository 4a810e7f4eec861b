"""Memory copies and sets of one rank, per kind (``Memcpy HtoD``, ``Memcpy DtoH``,
``Memcpy DtoD``, ``Memset``...): how many, bytes, GPU time and the bandwidth they reached,
and Holistic Trace Analysis 0.5.0's memory bandwidth summary (``get_memory_bw_summary``).

HTA's summary: for each kind, the bandwidth of the copies running at once, as a step
function that rises by a copy's bandwidth (the profiler's ``memory bandwidth (GB/s)``) when
it starts and falls by it when it ends (a copy of 0 us is taken to last 1 us); the summary
is count, mean, standard deviation, min, quartiles and max of the function's values after
each change, zeros left out. A copy that starts when another of its kind ends is counted
as starting first (HTA sorts with an unstable sort; this equals it with a stable one).

State: per kind the running sum, the ends still to come, and the values seen (one or two per
copy: the quartiles need them all; copies are few next to kernels).
"""

from __future__ import annotations

import heapq
import math

from streams.trace_stats import quantile


def memory_kind(name: str) -> str:
    """HTA's kind of a memory event: ``Memset``, the first 11 characters of a ``Memcpy``
    (``Memcpy HtoD``), or ``Memcpy Unknown``."""
    if name.startswith("Memset"):
        return "Memset"
    if not name.startswith("Memcpy"):
        return "Memcpy Unknown"
    return name[:11]


class _Kind:
    __slots__ = ("bytes", "copies", "ends", "running", "seq", "time_us", "values")

    def __init__(self) -> None:
        self.copies = 0
        self.bytes = 0
        self.time_us = 0.0
        self.running = 0.0
        self.seq = 0
        self.ends: list[tuple[float, int, float]] = []  # (end, order of start, bandwidth): a heap
        self.values: list[float] = []

    def step(self, delta: float) -> None:
        self.running += delta
        if self.running > 0:
            self.values.append(self.running)

    def ended_before(self, ts: float) -> None:
        ends = self.ends
        while ends and ends[0][0] < ts:
            self.step(-heapq.heappop(ends)[2])


class MemoryCopies:
    def __init__(self) -> None:
        self.kinds: dict[str, _Kind] = {}

    def add(self, event: dict) -> None:
        """One memory copy or set (a GPU event of kernel type MEMORY), in start-time order."""
        key = memory_kind(event["name"])
        k = self.kinds.get(key)
        if k is None:
            k = self.kinds[key] = _Kind()
        ts, dur = event["ts"], event["end"] - event["ts"]
        k.copies += 1
        k.bytes += event.get("bytes") or 0
        k.time_us += dur
        bandwidth = event.get("bandwidth_gbps") or 0.0
        k.ended_before(ts)
        k.step(bandwidth)
        heapq.heappush(k.ends, (ts + (dur if dur != 0 else 1), k.seq, bandwidth))
        k.seq += 1

    def result(self) -> list[dict]:
        out = []
        for name, k in sorted(self.kinds.items()):
            values = list(k.values)
            running, ends = k.running, sorted(k.ends)
            for _, _, bandwidth in ends:  # the copies still running at the end of the trace end
                running -= bandwidth
                if running > 0:
                    values.append(running)
            out.append({"kind": name, "copies": k.copies, "bytes": k.bytes, "time_us": float(k.time_us),
                        "achieved_gbps": k.bytes / (k.time_us * 1e3) if k.time_us > 0 else None,
                        **_describe(values)})
        return out

    # -- checkpoints (JSON-able) ---------------------------------------------------------------
    def to_state(self) -> dict:
        return {name: [k.copies, k.bytes, k.time_us, k.running, k.seq, k.ends, k.values]
                for name, k in self.kinds.items()}

    @classmethod
    def from_state(cls, state: dict) -> MemoryCopies:
        m = cls()
        for name, (copies, nbytes, time_us, running, seq, ends, values) in state.items():
            k = m.kinds[name] = _Kind()
            k.copies, k.bytes, k.time_us, k.running, k.seq = copies, nbytes, time_us, running, seq
            k.ends = [tuple(e) for e in ends]
            heapq.heapify(k.ends)
            k.values = list(values)
        return m


def _describe(values: list[float]) -> dict:
    """pandas' ``describe()`` of ``values``: count, mean, std (n-1), min, quartiles, max."""
    keys = ("bw_samples", "bw_mean_gbps", "bw_std_gbps", "bw_min_gbps", "bw_p25_gbps", "bw_p50_gbps",
            "bw_p75_gbps", "bw_max_gbps")
    n = len(values)
    if n == 0:
        return dict.fromkeys(keys) | {"bw_samples": 0}
    s = sorted(values)
    mean = math.fsum(values) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None
    return dict(zip(keys, (n, mean, std, s[0], quantile(s, 0.25), quantile(s, 0.5), quantile(s, 0.75), s[-1]),
                    strict=True))
