"""Memory copies and sets of one rank, per kind (``Memcpy HtoD``, ``Memcpy DtoH``,
``Memcpy DtoD``, ``Memset``...): how many, bytes, GPU time and the bandwidth they reached,
and Holistic Trace Analysis 0.5.0's memory bandwidth summary (``get_memory_bw_summary``).

HTA's summary: for each kind, the bandwidth of the copies running at once, as a step
function that rises by a copy's bandwidth (the profiler's ``memory bandwidth (GB/s)``) when
it starts and falls by it when it ends (a copy of 0 us is taken to last 1 us); the summary
is count, mean, standard deviation, min, quartiles and max of the function's values after
each change, zeros left out. Where HTA's figures depend on chance or drift, gpufleet keeps
the rule HTA means, and equals HTA with these two faults mended (``benchmarks/hta_reference.py``
runs it so; docs/trace-analysis.md has the evidence):

* **Equal times in the file's order.** HTA sorts the starts and ends with pandas' default,
  unstable sort, so copies that start or end in the same microsecond are counted in an
  order that depends on the trace's length. gpufleet counts, at one time, every start before
  any end, starts in their start order and ends in the order their copies have in the trace
  file (``trace_order``; HTA's with a stable sort).
* **An exact running sum.** HTA adds and subtracts the bandwidths as floats: when the copies
  running have all ended, the sum is not 0 but a residue (1e-14 .. 1e-11 GB/s), counted as
  a value (a tenth of a kind's values on a trace of overlapping copies). gpufleet keeps the
  sum exactly (each float an integer multiple of 2**-1074) and gives each value as the float
  nearest it.

State: per kind the copies still running (a heap of their ends) and the values seen (one or
two per copy: the quartiles need them all; copies are few next to kernels). The running sum
is that of the copies still running, made again from them when a checkpoint is restored.
"""

from __future__ import annotations

import heapq
import math

from streams.traces.analysis import Finished, Options
from streams.traces.batch import EventBatch
from streams.traces.kernel_breakdown import MEMORY_BIT
from streams.traces.stats import quantile

# Each figure of a kind's bandwidth summary and its name in HTA's (pandas' describe()).
HTA_FIGURES = {"bw_samples": "count", "bw_mean_gbps": "mean", "bw_std_gbps": "std", "bw_min_gbps": "min",
               "bw_p25_gbps": "25%", "bw_p50_gbps": "50%", "bw_p75_gbps": "75%", "bw_max_gbps": "max"}


def memory_kind(name: str) -> str:
    """HTA's kind of a memory event: ``Memset``, the first 11 characters of a ``Memcpy``
    (``Memcpy HtoD``), or ``Memcpy Unknown``."""
    if name.startswith("Memset"):
        return "Memset"
    if not name.startswith("Memcpy"):
        return "Memcpy Unknown"
    return name[:11]


_SHIFT = 1074  # every finite float is a whole multiple of 2**-1074
_ONE = 1 << _SHIFT


def exact(value: float) -> int:
    """``value`` as a whole multiple of 2**-1074, exactly (0 for a value that is not finite)."""
    if not math.isfinite(value):
        return 0
    numerator, denominator = value.as_integer_ratio()  # the denominator a power of 2
    return numerator << (_SHIFT - denominator.bit_length() + 1)


class _Kind:
    __slots__ = ("bytes", "copies", "ends", "running", "seq", "time_us", "values")

    def __init__(self) -> None:
        self.copies = 0
        self.bytes = 0
        self.time_us = 0.0
        self.running = 0  # the bandwidths of the copies running, in 2**-1074 GB/s
        self.seq = 0
        # (end, order in the trace file, bandwidth): a heap
        self.ends: list[tuple[float, int, float]] = []
        self.values: list[float] = []

    def step(self, delta: int) -> None:
        self.running += delta
        if self.running > 0:
            self.values.append(self.running / _ONE)  # (correctly rounded)

    def ended_before(self, ts: float) -> None:
        ends = self.ends
        while ends and ends[0][0] < ts:
            self.step(-exact(heapq.heappop(ends)[2]))


class MemoryCopies:
    def __init__(self) -> None:
        self.kinds: dict[str, _Kind] = {}

    @classmethod
    def create(cls, options: Options) -> MemoryCopies:
        return cls()

    def add(self, batch: EventBatch) -> None:
        """The batch's memory copies and sets (GPU-side events of kernel type MEMORY), in start-time
        order (the file's order among equal starts)."""
        if MEMORY_BIT not in batch.bits:
            return
        extras, gpu, names, starts, ends = batch.extras, batch.gpu, batch.g_name, batch.g_ts, batch.g_end
        for j, bit in enumerate(batch.bits):
            if bit == MEMORY_BIT:
                self._add(names[j], starts[j], ends[j], extras.get(gpu[j], _NONE))

    def _add(self, name: str, ts: float, end: float, extras: dict) -> None:
        key = memory_kind(name)
        k = self.kinds.get(key)
        if k is None:
            k = self.kinds[key] = _Kind()
        dur = end - ts
        k.copies += 1
        k.bytes += extras.get("bytes") or 0
        k.time_us += dur
        bandwidth = extras.get("bandwidth_gbps") or 0.0
        order = extras.get("trace_order")
        k.ended_before(ts)
        k.step(exact(bandwidth))
        heapq.heappush(k.ends, (ts + (dur if dur != 0 else 1), k.seq if order is None else order, bandwidth))
        k.seq += 1

    def result(self, finished: Finished) -> dict:
        out = []
        for name, k in sorted(self.kinds.items()):
            values = list(k.values)
            running = k.running
            for _, _, bandwidth in sorted(k.ends):  # the copies still running at the end of the trace end
                running -= exact(bandwidth)
                if running > 0:
                    values.append(running / _ONE)
            out.append({"kind": name, "copies": k.copies, "bytes": k.bytes, "time_us": float(k.time_us),
                        "achieved_gbps": k.bytes / (k.time_us * 1e3) if k.time_us > 0 else None,
                        **_describe(values)})
        return {"memory_copies": out}

    # -- checkpoints (JSON-able) ---------------------------------------------------------------
    def to_state(self) -> dict:
        return {"copies": {name: [k.copies, k.bytes, k.time_us, k.running / _ONE, k.seq, k.ends, k.values]
                           for name, k in self.kinds.items()}}

    @classmethod
    def from_state(cls, state: dict, options: Options) -> MemoryCopies:
        m = cls()
        for name, (copies, nbytes, time_us, _running, seq, ends, values) in state.get("copies", {}).items():
            k = m.kinds[name] = _Kind()
            k.copies, k.bytes, k.time_us, k.seq = copies, nbytes, time_us, seq
            k.ends = [tuple(e) for e in ends]
            heapq.heapify(k.ends)
            k.running = sum(exact(bandwidth) for _, _, bandwidth in k.ends)  # (exact: not the float stored)
            k.values = list(values)
        return m


_NONE: dict = {}


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
