"""Per-workflow event-time tumbling windows over GPU samples -> ``WorkflowWindow`` dicts.

Plain logic, no Faust: the worker (``streams.topology``) feeds it batches per partition
and persists what it reports as changed. Design:

* Samples come in blocks, column by column (``schemas.sample_columns``): a block's samples
  in one window are added with a few builtin calls per column, not one step per sample.

* A window ``[start, start + size)`` of a workflow closes when its partition's
  **watermark** (the highest event time applied on that partition minus the allowed
  lateness) reaches ``start + size``. Only event time moves it; wall clock never does.
* Samples whose window has already closed when they arrive are **late**: they are returned
  for the dead-letter topic, never dropped silently. The watermark moves between blocks.
* State is one JSON-able dict per workflow in a caller-provided mapping (the Faust table).
  Each holds the offset (and block of that message) it was updated through, so a batch
  replayed after a crash (at-least-once delivery) is not applied twice; the partition's
  watermark is derived from these states, so it can never run ahead of what the state
  contains.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass, field
from operator import mul

from schemas.sample_columns import columns_of, take
from schemas.sample_columns import size as samples_in
from schemas.validate_sample import NOT_WORKFLOWS
from streams.window_efficiency import add_efficiency, efficiency_fields, new_efficiency

Record = dict


@dataclass(frozen=True)
class WindowConfig:
    size_ms: int = 60_000
    allowed_lateness_ms: int = 10_000
    # Workflows with no open window whose newest sample is this far behind the partition's
    # newest are forgotten (their offsets are too old to be replayed).
    retention_ms: int = 3_600_000

    def __post_init__(self) -> None:
        if self.size_ms <= 0 or self.allowed_lateness_ms < 0 or self.retention_ms <= self.allowed_lateness_ms:
            raise ValueError(f"invalid window config {self}")


@dataclass(frozen=True)
class Incoming:
    """A block of samples (``schemas.sample_columns``) with where it came from: its message's
    offset and its index among the blocks of that message."""

    offset: int
    record: Record
    index: int = 0

    @classmethod
    def row(cls, offset: int, sample: Record, index: int = 0) -> Incoming:
        """One ``GpuSample`` dict as a block of one."""
        (block,) = columns_of([sample])
        return cls(offset, block, index)


@dataclass
class BatchResult:
    closed: list[Record] = field(default_factory=list)
    late: list[tuple[Incoming, str]] = field(default_factory=list)
    replayed: int = 0
    changed: set[str] = field(default_factory=set)  # workflow ids whose state must be persisted
    removed: set[str] = field(default_factory=set)  # workflow ids whose state must be deleted


def window_start(event_time_ms: int, size_ms: int) -> int:
    return event_time_ms - event_time_ms % size_ms


def _new_acc() -> dict:
    return {
        "n": 0, "interval_ms": 0, "util_weighted": 0.0,
        "util_min": None, "util_max": None, "mem_sum": 0.0, "mem_n": 0,
        "energy_j": 0.0, "energy_n": 0, "eff": new_efficiency(),
    }


def _add(acc: dict, c: Record) -> None:
    """The samples of block ``c`` (``schemas.sample_columns``), all in this accumulator's window."""
    # A GPU shared by several workflows counts for each in proportion to its share.
    share = c["share"]
    w = c["interval_ms"] if share is None else list(map(mul, c["interval_ms"], share))
    total = sum(w)
    util = c["utilization_pct"]
    acc["n"] += len(util)
    acc["interval_ms"] += total
    acc["util_weighted"] += sum(map(mul, util, w))
    low, high = min(util), max(util)
    if acc["util_min"] is None or low < acc["util_min"]:
        acc["util_min"] = low
    if acc["util_max"] is None or high > acc["util_max"]:
        acc["util_max"] = high
    used = c["memory_used_bytes"]
    if used is not None:
        acc["mem_sum"] += sum(used)
        acc["mem_n"] += len(used)
    power = c["power_watts"]
    if power is not None:
        acc["energy_j"] += sum(map(mul, power, w)) / 1000.0
        acc["energy_n"] += len(power)
    add_efficiency(acc["eff"], c, w, total)


def _by_window(c: Record, size_ms: int) -> list[tuple[int, Record]]:
    """``(window start, the block's samples in that window)``: the whole block when it falls in
    one window, as it mostly does."""
    times = c["event_time"]
    start = window_start(times[0], size_ms)
    if start <= min(times) and max(times) < start + size_ms:
        return [(start, c)]
    starts: dict[int, list[int]] = {}
    for i, t in enumerate(times):
        starts.setdefault(window_start(t, size_ms), []).append(i)
    return [(s, take(c, indices)) for s, indices in starts.items()]


def to_window(workflow_id: str, state: dict, start: int, acc: dict, size_ms: int, closed_at: int) -> Record:
    """The ``WorkflowWindow`` record of one accumulator."""
    interval = acc["interval_ms"]
    return {
        "workflow_id": workflow_id,
        "owner": state.get("owner"),
        "team": state.get("team"),
        "window_start": start,
        "window_end": start + size_ms,
        "sample_count": acc["n"],
        "gpu_count": len(acc["eff"]["per_gpu"]),  # every GPU a sample came from
        "gpu_seconds": interval / 1000.0,
        "utilization_mean_pct": acc["util_weighted"] / interval if interval else 0.0,
        "utilization_min_pct": float(acc["util_min"]),
        "utilization_max_pct": float(acc["util_max"]),
        "memory_used_mean_bytes": acc["mem_sum"] / acc["mem_n"] if acc["mem_n"] else None,
        "energy_joules": acc["energy_j"] if acc["energy_n"] else None,
        **efficiency_fields(acc["eff"]),
        "closed_at": closed_at,
    }


def _late(times: list[int], start: int, size: int, wf: str, watermark: int, partition: int,
          lateness: int) -> str:
    when = (f"late sample: event time {times[0]}" if len(times) == 1
            else f"{len(times)} late samples: event times {min(times)}..{max(times)}")
    return (f"{when} fall{'s' if len(times) == 1 else ''} in window [{start}, {start + size}) of workflow "
            f"{wf}, already closed by the watermark {watermark} of partition {partition} "
            f"(allowed lateness {lateness} ms)")


class WindowAggregator:
    """Applies batches of one partition's samples to per-workflow window state."""

    def __init__(self, config: WindowConfig, store: MutableMapping[str, dict]) -> None:
        self.config = config
        self.store = store
        self._max_event_time: dict[int, int] = {}
        # partition -> window end -> workflow ids with an open window ending there
        self._open: dict[int, dict[int, set[str]]] = {}
        # partition -> workflow ids with no open window (candidates for forgetting)
        self._idle: dict[int, set[str]] = {}

    # -- partition bookkeeping, derived from the store ---------------------------------
    def forget_partitions(self) -> None:
        """Drop derived per-partition indexes (after a rebalance); they are rebuilt from the store."""
        self._max_event_time.clear()
        self._open.clear()
        self._idle.clear()

    def _load_partition(self, partition: int) -> None:
        if partition in self._max_event_time:
            return
        newest = -1
        index: dict[int, set[str]] = {}
        idle: set[str] = set()
        for wf, state in self.store.items():
            if not isinstance(state, dict) or state.get("partition") != partition:
                continue
            newest = max(newest, state["max_event_time"])
            for start in state["windows"]:
                index.setdefault(int(start) + self.config.size_ms, set()).add(wf)
            if not state["windows"]:
                idle.add(wf)
        self._max_event_time[partition] = newest
        self._open[partition] = index
        self._idle[partition] = idle

    def watermark(self, partition: int) -> int | None:
        self._load_partition(partition)
        newest = self._max_event_time[partition]
        return None if newest < 0 else newest - self.config.allowed_lateness_ms

    def open_windows(self, partition: int) -> int:
        self._load_partition(partition)
        return sum(len(v) for v in self._open[partition].values())

    # -- the batch ---------------------------------------------------------------------
    def state_of(self, workflow_id: str, partition: int, owner: str | None = None, team: str | None = None) -> dict:
        """The workflow's state, created empty if no sample of it has been applied yet (its life
        cycle can be heard of before its samples are)."""
        state = self.store.get(workflow_id)
        if state is None:
            state = self.store[workflow_id] = {"partition": partition, "owner": owner, "team": team,
                                               "last_offset": -1, "max_event_time": -1, "windows": {}}
        return state

    def running(self, partitions: Iterable[int]) -> dict[int, list[str]]:
        """Per partition, the workflows that have samples and have not ended (GPUs of no
        workflow left out); one pass over the store for all of them."""
        out: dict[int, list[str]] = {p: [] for p in partitions}
        for wf, s in self.store.items():
            if (isinstance(s, dict) and s.get("partition") in out and s["max_event_time"] >= 0
                    and not s.get("ended") and not s.get("ending") and wf not in NOT_WORKFLOWS):
                out[s["partition"]].append(wf)
        return {p: sorted(wfs) for p, wfs in out.items()}

    def newest(self, partition: int) -> int:
        """The newest event time applied on ``partition`` (-1 before any)."""
        self._load_partition(partition)
        return self._max_event_time[partition]

    def advance(self, partition: int, event_time: int, closed_at: int) -> BatchResult:
        """Move an idle partition's clock to ``event_time`` (the newest of the busy partitions)
        and close what that closes: without it, a partition that stopped receiving samples
        would keep its last windows open for ever (Flink calls this idleness)."""
        self._load_partition(partition)
        result = BatchResult()
        if event_time > self._max_event_time[partition] >= 0:
            self._max_event_time[partition] = event_time
            self._close(partition, event_time - self.config.allowed_lateness_ms, closed_at, result)
        return result

    def ended(self, partition: int, silent_ms: int) -> list[str]:
        """Workflows of ``partition`` with no open window that either had no sample for
        ``silent_ms`` of event time or are marked ``ending`` (their hosts said so), and are not
        yet marked ``ended``."""
        self._load_partition(partition)
        horizon = self._max_event_time[partition] - silent_ms
        out = []
        for wf in self._idle[partition]:
            state = self.store[wf]
            if state["max_event_time"] < 0 or state.get("ended"):
                continue  # no sample yet (its life cycle came first), or summarised already
            if state["max_event_time"] < horizon or state.get("ending"):
                out.append(wf)
        return sorted(out)

    def process(self, partition: int, batch: Iterable[Incoming], closed_at: int) -> BatchResult:
        """Apply ``batch`` (in offset order) and close every window the watermark has passed."""
        self._load_partition(partition)
        cfg = self.config
        size = cfg.size_ms
        lateness = cfg.allowed_lateness_ms
        newest = self._max_event_time[partition]
        index = self._open[partition]
        idle = self._idle[partition]
        result = BatchResult()
        for item in batch:
            c = item.record
            wf = c["workflow_id"]
            state = self.store.get(wf)
            if state is None:
                state = self.state_of(wf, partition, c["owner"], c["team"])
                idle.add(wf)
            elif (item.offset, item.index) <= (state["last_offset"], state.get("last_index", 0)):
                result.replayed += samples_in(c)  # applied before a restart; at-least-once replay
                continue
            state["last_offset"], state["last_index"] = item.offset, item.index
            if state.pop("ended", None):
                state.pop("ending", None)  # it came back after it ended: a new life
            self.store[wf] = state
            result.changed.add(wf)
            watermark = newest - lateness if newest >= 0 else None
            for start, part in _by_window(c, size):
                times = part["event_time"]
                if watermark is not None and start + size <= watermark:
                    result.late.append((item, _late(times, start, size, wf, watermark, partition, lateness)))
                    continue
                key = str(start)
                acc = state["windows"].get(key)
                if acc is None:
                    acc = state["windows"][key] = _new_acc()
                    index.setdefault(start + size, set()).add(wf)
                    idle.discard(wf)
                _add(acc, part)
                t = max(times)
                state["max_event_time"] = max(state["max_event_time"], t)
                newest = max(newest, t)
            if c["owner"]:
                state["owner"], state["team"] = c["owner"], c["team"]
        self._max_event_time[partition] = newest
        if newest >= 0:
            self._close(partition, newest - lateness, closed_at, result)
        return result

    def _close(self, partition: int, watermark: int, closed_at: int, result: BatchResult) -> None:
        size = self.config.size_ms
        index = self._open[partition]
        idle = self._idle[partition]
        for end in sorted(e for e in index if e <= watermark):
            for wf in sorted(index.pop(end)):
                state = self.store[wf]
                start = end - size
                acc = state["windows"].pop(str(start))
                result.closed.append(to_window(wf, state, start, acc, size, closed_at))
                result.changed.add(wf)
                if not state["windows"]:
                    idle.add(wf)
        horizon = self._max_event_time[partition] - self.config.retention_ms
        for wf in [wf for wf in idle if self.store[wf]["max_event_time"] < horizon]:
            idle.discard(wf)
            del self.store[wf]
            result.changed.discard(wf)
            result.removed.add(wf)
