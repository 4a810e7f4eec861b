"""Temporal breakdown and communication/computation overlap of one rank's GPU time.

Consumes the GPU-side events (``stream >= 0``) of each batch in start-time order and keeps O(1)
state: the open merged interval and the covered time so far (a ``Coverage``) of all GPU events.
The unions of computation kernels, of communication kernels and of both (overlap = comp + comm -
union) are the kernel breakdown's, which keeps them for its own split by type: the result reads
them there.
Semantics of HTA 0.5.0: touching intervals merge; kernel time = last end - first start.
"""

from __future__ import annotations

import msgspec

from streams.traces.analysis import Finished, Options
from streams.traces.batch import EventBatch
from streams.traces.coverage import Coverage
from streams.traces.kernel_breakdown import KernelBreakdown


class TemporalResult(msgspec.Struct, frozen=True):
    kernel_us: float
    idle_us: float
    compute_us: float
    non_compute_us: float
    communication_us: float
    comp_comm_overlap_us: float

    def pct(self, value: float) -> float | None:
        return None if self.kernel_us <= 0 else 100.0 * value / self.kernel_us

    @property
    def overlap_pct(self) -> float | None:
        """Share of communication time that computation overlaps (None without communication)."""
        if self.communication_us <= 0:
            return None
        return 100.0 * self.comp_comm_overlap_us / self.communication_us


class TemporalBreakdown:
    def __init__(self) -> None:
        self.all = Coverage()

    @classmethod
    def create(cls, options: Options) -> TemporalBreakdown:
        return cls()

    def add(self, batch: EventBatch) -> None:
        self.all.add_all(batch.g_ts, batch.g_end)

    def result(self, finished: Finished) -> dict:
        t = self.breakdown(*finished.analyses[KernelBreakdown].computation_and_communication())
        return {
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
        }

    def to_state(self) -> dict:
        return {"coverage": {"all": self.all.to_state()}}

    @classmethod
    def from_state(cls, state: dict, options: Options) -> TemporalBreakdown:
        t = cls()
        t.all = Coverage.from_state(state["coverage"]["all"])
        return t

    def breakdown(self, compute: float, comm: float, either: float) -> TemporalResult:
        """The breakdown, with the time covered by computation kernels, by communication kernels
        and by either (the kernel breakdown's unions of the same GPU events)."""
        kernel = self.all.span
        idle = kernel - self.all.covered
        return TemporalResult(
            kernel_us=kernel,
            idle_us=idle,
            compute_us=compute,
            non_compute_us=kernel - compute - idle,
            communication_us=comm,
            comp_comm_overlap_us=compute + comm - either,
        )
