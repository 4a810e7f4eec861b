"""Why each CUDA stream of a rank sat idle between kernels (HTA 0.5.0's idle time breakdown).

For each kernel, memcpy or memset, the gap since the previous one on its stream is:
host wait if the runtime call that launched it started after the previous one ended (the
CPU was not enqueuing fast enough); kernel wait if the gap is under 30 us (launch overhead
between back-to-back kernels); other otherwise. State: one previous end per stream.
"""

from __future__ import annotations

from collections import defaultdict

import msgspec

from streams.traces.analysis import Finished, Options
from streams.traces.batch import EventBatch

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

    @classmethod
    def create(cls, options: Options) -> IdleBreakdown:
        return cls()

    def add(self, batch: EventBatch) -> None:
        """The batch's kernels, copies and sets in start order, each with the start of the runtime
        call that launched it (where known)."""
        streams, prev_ends, kernel_wait_us = self.streams, self._prev_end, self.kernel_wait_us
        for cat, stream, ts, end, call in zip(batch.g_cat, batch.g_stream, batch.g_ts, batch.g_end, batch.calls):
            if cat not in KERNEL_CATS:
                continue
            prev_end = prev_ends.get(stream)
            prev_ends[stream] = end
            idle = streams[stream]
            if prev_end is None:
                continue
            gap = ts - prev_end
            if call is not None and call.ts > prev_end:
                idle.host_wait += gap
            elif gap < kernel_wait_us:
                idle.kernel_wait += gap
            else:
                idle.other += gap

    def result(self, finished: Finished) -> dict:
        return {"idle_by_stream": {s: self.streams[s].as_dict() for s in sorted(self.streams)}}

    def to_state(self) -> dict:
        return {"idle": {str(s): [v.host_wait, v.kernel_wait, v.other] for s, v in self.streams.items()},
                "prev_end": {str(s): e for s, e in self._prev_end.items()}}

    @classmethod
    def from_state(cls, state: dict, options: Options) -> IdleBreakdown:
        b = cls()
        for s, (h, k, o) in state["idle"].items():
            b.streams[int(s)] = StreamIdle(h, k, o)
        b._prev_end = {int(s): e for s, e in state["prev_end"].items()}
        return b
