"""Why each CUDA stream of a rank sat idle between kernels (HTA 0.5.0's idle time breakdown).

For each kernel, memcpy or memset, the gap since the previous one on its stream is:
host wait if the runtime call that launched it started after the previous one ended (the
CPU was not enqueuing fast enough); kernel wait if the gap is under 30 us (launch overhead
between back-to-back kernels); other otherwise. State: one previous end per stream.
"""

from __future__ import annotations

from collections import defaultdict

import msgspec

KERNEL_WAIT_US = 30
IDLE_CATEGORIES = ("host_wait", "kernel_wait", "other")
KERNEL_CATS = frozenset({"kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy"})


class StreamIdle(msgspec.Struct):
    host_wait: float = 0.0
    kernel_wait: float = 0.0
    other: float = 0.0

    @property
    def total(self) -> float:
        return self.host_wait + self.kernel_wait + self.other

    def as_dict(self) -> dict:
        total = self.total
        out = {f"{c}_us": getattr(self, c) for c in IDLE_CATEGORIES}
        out.update({f"{c}_ratio": (getattr(self, c) / total if total else None) for c in IDLE_CATEGORIES})
        return out


class IdleBreakdown(msgspec.Struct):
    kernel_wait_us: float = KERNEL_WAIT_US
    streams: dict[int, StreamIdle] = msgspec.field(default_factory=lambda: defaultdict(StreamIdle))
    _prev_end: dict[int, float] = msgspec.field(default_factory=dict)

    def add(self, event: dict, runtime_ts: float | None) -> None:
        """A GPU event in start order, with the start of the runtime call that launched it (if known)."""
        if event["cat"] not in KERNEL_CATS:
            return
        stream = event["stream"]
        prev_end = self._prev_end.get(stream)
        self._prev_end[stream] = event["end"]
        idle = self.streams[stream]
        if prev_end is None:
            return
        gap = event["ts"] - prev_end
        if runtime_ts is not None and runtime_ts > prev_end:
            idle.host_wait += gap
        elif gap < self.kernel_wait_us:
            idle.kernel_wait += gap
        else:
            idle.other += gap

    def result(self) -> dict[int, dict]:
        return {s: self.streams[s].as_dict() for s in sorted(self.streams)}
