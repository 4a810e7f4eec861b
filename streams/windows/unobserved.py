"""Time a job held its GPUs that no sample stands for (``UnobservedTime``: the host's agent was
not running), cut at the window grid: each window it overlaps takes the job's GPUs times the
overlap, in the goodput bucket ``unobserved`` (``streams.windows.goodput``)."""

from __future__ import annotations

from streams.windows.record import window_start


def by_window(span: dict, size_ms: int) -> list[tuple[int, float]]:
    """``(window start, GPU-milliseconds)`` of each window ``span`` overlaps."""
    begin, end, gpus = span["from_time"], span["to_time"], span["gpus"]
    out = []
    start = window_start(begin, size_ms)
    while start < end:
        out.append((start, (min(end, start + size_ms) - max(begin, start)) * gpus))
        start += size_ms
    return out
