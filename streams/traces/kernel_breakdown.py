"""Kernel breakdown of one rank's GPU time, as Holistic Trace Analysis 0.5.0 computes it
(``get_gpu_kernel_breakdown``), from GPU events fed in start order.

* **By kernel type**: the time during which computation, communication or memory kernels
  ran (the union of each type's intervals, touching ones merged), split where types
  overlap: "COMPUTATION" is time with computation alone, "COMPUTATION overlapping MEMORY"
  time with both and no communication, and so on. Other GPU events (synchronisations) are
  not counted. Kept as O(1) state: the covered length of each of the 7 unions of the three
  types, from which inclusion-exclusion gives each overlap.
* **Top kernels** of each type: per kernel name its launches, total, min, max, mean and
  standard deviation (n-1) of duration; the kernels by total time, the first 10 named and
  the rest grouped as "others", and also grouped as "others" every kernel past the 0.8
  quantile (linear) of the running total, which is HTA's rule. State: one entry per distinct
  kernel name.

Where HTA reports the top kernels of a type with more than 10 kernels, its regrouping
replaces each named kernel's min, max and mean by its total (and its deviation by 0), and
gives "others" the min, max, mean and deviation of the grouped kernels' totals: this keeps
the true per-launch figures of every kernel, and of "others" the launches it groups. The
totals and the grouping are HTA's.
"""

from __future__ import annotations

import math
from functools import lru_cache
from itertools import combinations, compress

from streams.traces.analysis import Finished, Options
from streams.traces.batch import EventBatch
from streams.traces.coverage import Coverage
from streams.traces.kernel_type import KernelType, kernel_type
from streams.traces.stats import quantile

TYPES = (KernelType.COMPUTATION, KernelType.COMMUNICATION, KernelType.MEMORY)
BIT = {t: 1 << i for i, t in enumerate(TYPES)}
COMPUTATION_BIT, COMMUNICATION_BIT, MEMORY_BIT = (BIT[t] for t in TYPES)
# Every non-empty set of types, as a bit mask: the unions kept.
MASKS = tuple(range(1, 1 << len(TYPES)))
TOP_KERNELS = 10
DURATION_RATIO = 0.8


def type_label(mask: int) -> str:
    """HTA's name of the time when exactly the types of ``mask`` run."""
    return " overlapping ".join(t.name for t in TYPES if mask & BIT[t])


class KernelBreakdown:
    def __init__(self) -> None:
        self.unions = {mask: Coverage() for mask in MASKS}
        # kernel name -> [type bit (0: not one of TYPES), launches, total, min, max, sum of squares]
        self.kernels: dict[str, list] = {}

    @classmethod
    def create(cls, options: Options) -> KernelBreakdown:
        return cls()

    def add(self, batch: EventBatch) -> None:
        """The batch's GPU-side events (``stream >= 0``), in start-time order, with their types'
        bits (``batch.bits``: ``kernel_bit``)."""
        kernels = self.kernels
        for name, ts, end, bit in zip(batch.g_name, batch.g_ts, batch.g_end, batch.bits):
            dur = end - ts
            k = kernels.get(name)
            if k is None:
                kernels[name] = [bit, 1, dur, dur, dur, dur * dur]
            else:
                k[1] += 1
                k[2] += dur
                if dur < k[3]:  # noqa: PLR1730 - per GPU event: a comparison costs less than a call of min()
                    k[3] = dur
                if dur > k[4]:  # noqa: PLR1730
                    k[4] = dur
                k[5] += dur * dur
        bits = batch.bits
        if not any(bits):
            return
        for mask, union in self.unions.items():
            chosen = [b & mask for b in bits]  # (each union: the events of its types, in start order)
            union.add_all(compress(batch.g_ts, chosen), compress(batch.g_end, chosen))

    # -- results -----------------------------------------------------------------------------
    def computation_and_communication(self) -> tuple[float, float, float]:
        """The time covered by computation kernels, by communication kernels, and by either."""
        comp, comm = COMPUTATION_BIT, COMMUNICATION_BIT
        return self.unions[comp].covered, self.unions[comm].covered, self.unions[comp | comm].covered

    def type_times(self) -> dict[int, float]:
        """Time with exactly the types of each mask running (inclusion-exclusion over the unions)."""
        covered = {mask: u.covered for mask, u in self.unions.items()}
        full = MASKS[-1]
        exact: dict[int, float] = {}
        for mask in MASKS:
            # In every type of S and none of the others O: -sum over R ⊆ S of (-1)^|R| |U(O ∪ R)|
            # (inclusion-exclusion over the complements; U of no type is empty).
            others = full & ~mask
            members = [b for b in BIT.values() if mask & b]
            total = 0.0
            for r in range(len(members) + 1):
                for chosen in combinations(members, r):
                    union = others | sum(chosen)
                    if union:
                        total += (1 if r % 2 else -1) * covered[union]
            exact[mask] = total
        return exact

    def result(self, finished: Finished) -> dict:
        exact = self.type_times()
        total = sum(exact.values())
        # (a total of 0 with a type's time above it: intervals that end before they start, kernels
        # shorter than 1 us rounded, can make the unions' lengths cancel; no share can be given then)
        kernel_types = [
            {"kernel_type": type_label(mask), "time_us": t, "pct": 100.0 * t / total if total > 0 else 0.0}
            for mask, t in sorted(exact.items(), key=lambda kv: (-kv[1], kv[0])) if t > 0
        ]
        top = []
        for kind in TYPES:
            top += self._top(kind)
        return {"kernel_types": kernel_types, "top_kernels": top}

    def _top(self, kind: KernelType) -> list[dict]:
        bit = BIT[kind]
        rows = grouped_rows({name: k[1:] for name, k in self.kernels.items() if k[0] == bit}, TOP_KERNELS)
        return [{"kernel_type": kind.name, **row} for row in rows]

    def per_kernel(self) -> dict[tuple[str, str], tuple[int, float]]:
        """Every kernel of the three types: (type, name) -> (launches, total time)."""
        names = {bit: kind.name for kind, bit in BIT.items()}
        return {(names[k[0]], name): (k[1], k[2]) for name, k in self.kernels.items() if k[0]}

    # -- checkpoints (JSON-able) ---------------------------------------------------------------
    def to_state(self) -> dict:
        return {"kernels": {"unions": {str(m): u.to_state() for m, u in self.unions.items()},
                            "kernels": self.kernels}}

    @classmethod
    def from_state(cls, state: dict, options: Options) -> KernelBreakdown:
        b = cls()
        if "kernels" not in state:
            # A session checkpointed before the kernel breakdown counts from here, with the unions of
            # computation, communication and either that the temporal breakdown kept then (its
            # ``coverage``: ``compute``, ``communication``, ``either``), which are now this breakdown's.
            comp, comm = COMPUTATION_BIT, COMMUNICATION_BIT
            for mask, name in ((comp, "compute"), (comm, "communication"), (comp | comm, "either")):
                b.unions[mask] = Coverage.from_state(state["coverage"][name])
            return b
        b.unions = {int(m): Coverage.from_state(u) for m, u in state["kernels"]["unions"].items()}
        b.kernels = {name: list(k) for name, k in state["kernels"]["kernels"].items()}
        return b


@lru_cache(maxsize=65_536)
def kernel_bit(name: str) -> int:
    """The bit (``BIT``) of a GPU event's kernel type; 0 for none of ``TYPES``."""
    return BIT.get(kernel_type(name), 0)


def grouped_rows(stats: dict[str, list], limit: int, ratio: float = DURATION_RATIO) -> list[dict]:
    """HTA's summary of durations by name (``_aggr_gpu_kernel_time``): ``stats`` is name ->
    [count, total, min, max, sum of squares]; by total time, at most ``limit`` named and, when
    there are more, only those within the ``ratio`` quantile of the running total; the rest as
    one row "others" (``kernels``: how many names it holds)."""
    rows = sorted(stats.items(), key=lambda nk: (-nk[1][1], nk[0]))
    named = len(rows)
    if len(rows) > limit:
        running, cumulative = 0, []
        for _, k in rows:
            running += k[1]
            cumulative.append(running)
        bound = quantile(cumulative, ratio)
        named = min(limit, sum(1 for c in cumulative if c <= bound))  # a prefix: the running total rises
    out = [_row(name, 1, *k) for name, k in rows[:named]]
    rest = rows[named:]
    if rest:
        out.append(_row("others", len(rest), sum(k[0] for _, k in rest), sum(k[1] for _, k in rest),
                        min(k[2] for _, k in rest), max(k[3] for _, k in rest), sum(k[4] for _, k in rest)))
    return out


def _row(name: str, kernels: int, launches: int, total: float, low: float, high: float, squares: float) -> dict:
    mean = total / launches
    # (integer microseconds in most traces: the sums are exact and so is the deviation)
    var = (squares - total * total / launches) / (launches - 1) if launches > 1 else 0.0
    return {"name": name, "kernels": kernels, "launches": launches, "time_us": float(total), "min_us": float(low),
            "max_us": float(high), "mean_us": mean, "stddev_us": math.sqrt(max(var, 0.0))}
