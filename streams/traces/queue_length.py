"""Launch queue length per CUDA stream, as Holistic Trace Analysis 0.5.0 defines it
(``get_queue_length_summary``, ``get_time_spent_blocked_on_full_queue``).

A stream's queue holds the operations launched on it and not yet started: it grows by one at
each launch call (``cudaLaunchKernel``, ``cudaMemcpyAsync``, ``cudaMemsetAsync``...) whose GPU
event ran on the stream, at the call's start, and shrinks by one when that event starts on the
GPU. HTA summarises the values the queue takes after each change (count, mean, deviation, min,
quartiles, max); the time blocked on a full queue is the time a stream's queue held at least
1024 operations (CUDA's launch queue), when the host cannot launch more. A launch and a start
at the same microsecond count the launch first (HTA with a stable sort).

Streamed: a launch's stream is known only when its GPU event arrives, so the changes wait, per
stream, until no launch still unmatched started before them; then they are applied in time
order. State: per stream the queue, the time of its last change, the number of times each
value was taken and how long it was held (values are small integers), and the changes not yet
applied (about the operations in flight).
"""

from __future__ import annotations

from streams.traces.analysis import Finished, Options
from streams.traces.batch import EventBatch
from streams.traces.stats import quantile

LAUNCH_CALLS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaMemcpyAsync",
                          "cudaMemsetAsync", "hipLaunchKernel", "hipExtModuleLaunchKernel", "hipMemsetAsync",
                          "hipMemcpyAsync", "hipMemcpyWithStream"})
FULL_QUEUE = 1024  # CUDA's launch queue per stream
BUFFER_LIMIT = 4096
# Each figure of a stream's queue length summary and its name in HTA's (pandas' describe()).
HTA_FIGURES = {"samples": "count", "mean": "mean", "std": "std", "min": "min", "p25": "25%", "p50": "50%",
               "p75": "75%", "max": "max"}  # changes waiting on a stream before they are applied as far as they can be


class _Stream:
    __slots__ = ("held", "last_ts", "launches", "queue", "seen", "starts")

    def __init__(self) -> None:
        self.queue = 0
        self.last_ts: float | None = None
        self.seen: dict[int, int] = {}  # value -> times taken
        self.held: dict[int, float] = {}  # value -> time held
        # Changes not yet applied: a stream runs its operations in the order they were launched,
        # so both lists are in time order as they come.
        self.launches: list[float] = []
        self.starts: list[float] = []

    def apply(self, horizon: float | None) -> None:
        """Apply the changes before ``horizon`` (all of them if None), in time order, a launch
        before a start in the same microsecond."""
        launches, starts = self.launches, self.starts
        launches.sort()  # (in order already but where a trace's times went backwards: a pass in C)
        starts.sort()
        end = float("inf") if horizon is None else horizon
        i = j = 0
        queue, last, seen, held = self.queue, self.last_ts, self.seen, self.held
        while True:
            launch = launches[i] if i < len(launches) else None
            start = starts[j] if j < len(starts) else None
            if launch is not None and (start is None or launch <= start) and launch < end:
                ts, step, i = launch, 1, i + 1
            elif start is not None and (launch is None or start < launch) and start < end:
                ts, step, j = start, -1, j + 1
            else:
                break
            if last is not None:
                held[queue] = held.get(queue, 0.0) + (ts - last)
            queue += step
            seen[queue] = seen.get(queue, 0) + 1
            last = ts
        self.queue, self.last_ts = queue, last
        del launches[:i], starts[:j]


class QueueLength:
    def __init__(self, horizon_us: float = 10_000_000) -> None:
        self.streams: dict[int, _Stream] = {}
        self.pending: dict[int, float] = {}  # correlation of a launch not yet matched -> its start
        self.horizon = horizon_us

    @classmethod
    def create(cls, options: Options) -> QueueLength:
        return cls(options.horizon_us)

    def add(self, batch: EventBatch) -> None:
        """The batch's launch calls, and its GPU-side events whose runtime call is known."""
        pending, calls, j = self.pending, batch.calls, 0
        for kind, name, ts, stream, corr in zip(batch.kind, batch.name, batch.ts, batch.stream, batch.correlation):
            if stream < 0:
                if kind == "runtime" and corr >= 0 and name in LAUNCH_CALLS:
                    pending[corr] = ts
                continue
            if calls[j] is not None:
                self._started(corr, stream, ts)
            j += 1

    def _started(self, corr: int, stream: int, ts: float) -> None:
        launched = self.pending.pop(corr, None)
        if launched is None:
            return  # not launched by a launch call
        s = self.streams.get(stream)
        if s is None:
            s = self.streams[stream] = _Stream()
        s.launches.append(launched)
        s.starts.append(ts)
        if len(s.starts) > BUFFER_LIMIT:
            s.apply(self._settled_before(ts))

    def _settled_before(self, now: float) -> float:
        """The time before which every change is known: that of the oldest launch not matched yet
        (launches unmatched for longer than the horizon never will be: their GPU events are not in
        the trace), or ``now``."""
        pending = self.pending
        for corr in [c for c, ts in pending.items() if ts < now - self.horizon]:
            del pending[corr]
        return min(now, min(pending.values(), default=now))

    def result(self, finished: Finished) -> dict:
        out = []
        for stream, s in sorted(self.streams.items()):
            copy = _Stream()
            copy.queue, copy.last_ts, copy.seen, copy.held = s.queue, s.last_ts, dict(s.seen), dict(s.held)
            copy.launches, copy.starts = list(s.launches), list(s.starts)
            copy.apply(None)
            out.append({"stream": stream, **_describe(copy.seen),
                        "blocked_us": sum(t for v, t in copy.held.items() if v >= FULL_QUEUE)})
        return {"queue_lengths": out}

    # -- checkpoints (JSON-able) ---------------------------------------------------------------
    def to_state(self) -> dict:
        return {"queues": {
            "streams": {str(k): [s.queue, s.last_ts, list(s.seen.items()), list(s.held.items()), s.launches,
                                 s.starts] for k, s in self.streams.items()},
            "pending": list(self.pending.items()), "horizon": self.horizon}}

    @classmethod
    def from_state(cls, state: dict, options: Options) -> QueueLength:
        state = state.get("queues")
        if state is None:  # (a session checkpointed before the queue lengths)
            return cls(options.horizon_us)
        q = cls(state["horizon"])
        for k, (queue, last_ts, seen, held, launches, starts) in state["streams"].items():
            s = q.streams[int(k)] = _Stream()
            s.queue, s.last_ts = queue, last_ts
            s.seen, s.held = {int(v): n for v, n in seen}, {int(v): t for v, t in held}
            s.launches, s.starts = list(launches), list(starts)
        q.pending = {int(c): ts for c, ts in state["pending"]}
        return q


def _describe(seen: dict[int, int]) -> dict:
    """pandas' describe() of the values taken, from how often each was."""
    n = sum(seen.values())
    if n == 0:
        return {"samples": 0, "mean": None, "std": None, "min": None, "p25": None, "p50": None, "p75": None,
                "max": None}
    values = sorted(seen)
    mean = sum(v * c for v, c in seen.items()) / n
    var = sum(c * (v - mean) ** 2 for v, c in seen.items()) / (n - 1) if n > 1 else None
    expanded = _Expanded(values, seen)
    return {"samples": n, "mean": mean, "std": None if var is None else var ** 0.5, "min": float(values[0]),
            "p25": quantile(expanded, 0.25), "p50": quantile(expanded, 0.5), "p75": quantile(expanded, 0.75),
            "max": float(values[-1])}


class _Expanded:
    """The sorted values with their repetitions, as a sequence, without building it."""

    def __init__(self, values: list[int], seen: dict[int, int]) -> None:
        self.values, self.ends = values, []
        total = 0
        for v in values:
            total += seen[v]
            self.ends.append(total)

    def __len__(self) -> int:
        return self.ends[-1]

    def __getitem__(self, i: int) -> float:
        lo, hi = 0, len(self.ends) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.ends[mid] > i:
                hi = mid
            else:
                lo = mid + 1
        return float(self.values[lo])
