"""The length of a union of intervals fed in start order: the primitive of the temporal
breakdown, the kernel breakdown's unions by type and each step's busy time."""

from __future__ import annotations

from collections.abc import Iterable


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

    def add_all(self, starts: Iterable[float], ends: Iterable[float]) -> None:
        """Intervals in start order, as ``add`` of each (one loop, the fields in locals)."""
        first, start, end, closed = self.first, self.start, self.end, self.closed
        for ts, stop in zip(starts, ends):
            if first is None:
                first, start, end = ts, ts, stop
            elif ts > end:
                closed += end - start
                start, end = ts, stop
            elif stop > end:
                end = stop
        self.first, self.start, self.end, self.closed = first, start, end, closed

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
