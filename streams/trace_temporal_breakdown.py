"""Temporal breakdown and communication/computation overlap of one rank's GPU time.

Consumes GPU events (``stream >= 0``) in start-time order and keeps O(1) state: the open
merged interval and the covered time so far, for all GPU events, for computation kernels,
for communication kernels, and for their union (overlap = comp + comm - union).
Semantics of HTA 0.5.0: touching intervals merge; kernel time = last end - first start.
"""

from __future__ import annotations

import msgspec

from streams.trace_kernel_type import KernelType, kernel_type


class Coverage:
    """Length of the union of intervals fed in start order."""

    __slots__ = ("closed", "end", "first", "start")

    def __init__(self) -> None:
        self.first: float | None = None
        self.start = 0.0
        self.end = 0.0
        self.closed = 0.0

    def add(self, ts: float, end: float) -> None:
        if self.first is None:
            self.first, self.start, self.end = ts, ts, end
        elif ts > self.end:
            self.closed += self.end - self.start
            self.start, self.end = ts, end
        elif end > self.end:
            self.end = end

    def to_state(self) -> list:
        return [self.first, self.start, self.end, self.closed]

    @classmethod
    def from_state(cls, state: list) -> Coverage:
        c = cls()
        c.first, c.start, c.end, c.closed = state
        return c

    @property
    def covered(self) -> float:
        return 0.0 if self.first is None else self.closed + self.end - self.start

    @property
    def span(self) -> float:
        return 0.0 if self.first is None else self.end - self.first


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
        self.compute = Coverage()
        self.communication = Coverage()
        self.either = Coverage()

    def add(self, event: dict) -> None:
        """One GPU event (``stream >= 0``), in start-time order."""
        ts, end = event["ts"], event["end"]
        self.all.add(ts, end)
        kind = kernel_type(event["name"])
        if kind is KernelType.COMPUTATION:
            self.compute.add(ts, end)
            self.either.add(ts, end)
        elif kind is KernelType.COMMUNICATION:
            self.communication.add(ts, end)
            self.either.add(ts, end)

    def result(self) -> TemporalResult:
        kernel = self.all.span
        idle = kernel - self.all.covered
        compute = self.compute.covered
        comm = self.communication.covered
        return TemporalResult(
            kernel_us=kernel,
            idle_us=idle,
            compute_us=compute,
            non_compute_us=kernel - compute - idle,
            communication_us=comm,
            comp_comm_overlap_us=compute + comm - self.either.covered,
        )
