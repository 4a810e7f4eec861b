"""Per-workflow event-time tumbling windows over GPU samples -> ``WorkflowWindow`` dicts.

Plain logic: the window stage (``streams.stages.window_step``) feeds it batches per partition and
persists what it reports as changed; its thresholds are the worker's one ``Thresholds``. Design:

* Samples come in blocks, column by column (``schemas.sample_columns``): a block's samples
  in one window are added with a few builtin calls per column, not one step per sample
  (``streams.windows.record``: a window's accumulator and the record it becomes).

* A window ``[start, start + size)`` of a workflow closes when its partition's
  **watermark** (the highest event time applied on that partition minus the allowed
  lateness) reaches ``start + size``. Samples move it; so does ``advance``, which the worker
  calls for a partition that went quiet (its clock follows the busiest partition's).
* A sample more than ``max_future_skew_ms`` ahead of the worker's wall clock (a wrong clock,
  microseconds as milliseconds) is refused with the reason and never moves a watermark; a
  state restored with such a time is repaired on load (its future windows dropped, logged).
* Samples whose window has already closed when they arrive are **late**. Within
  ``update_horizon_ms`` behind the watermark they are added to that window, kept since it
  closed in the ``history`` mapping, and the window is emitted again with a higher
  ``version`` (``BatchResult.updated``; ClickHouse keeps the highest): a host that comes back
  after an outage and sends its spooled backlog completes its windows instead of losing them.
  Later than the horizon they are refused with the reason, never dropped silently.
* ``UnobservedTime`` (GPU time no sample stands for) goes to its windows' ``unobserved`` bucket.
* State is one ``WorkflowState`` per workflow in a caller-provided mapping (the Faust table),
  holding the offset (and block) it was updated through, so a batch replayed after a crash
  is not applied twice; a partition's watermark is derived from these states, so it can
  never run ahead of what the state contains.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, MutableMapping

from schemas.sample_columns import size as samples_in
from schemas.validate_sample import NOT_WORKFLOWS
from streams.alerts.detectors import DEFAULTS, Thresholds
from streams.windows import unobserved
from streams.windows.batches import (
    BatchResult,
    Incoming,
    Record,
    WindowConfig,
    future_reason,
    history_key,
    late_reason,
    start_of_key,
    unobserved_late_reason,
)
from streams.windows.goodput import add_unobserved
from streams.windows.record import add_block, by_window, new_acc, to_window
from streams.windows.workflow_state import WorkflowState, forgettable, repair_future

log = logging.getLogger(__name__)

OPEN, LATE = "open", "late"  # where ``_place`` put what it was given


def _wall_clock_ms() -> int:  # the default clock
    return int(time.time() * 1000)

class WindowAggregator:
    """Applies batches of one partition's samples to per-workflow window state.

    ``store``: workflow id -> its state (open windows, offsets, job totals). ``history``:
    ``history_key(workflow, start)`` -> a window closed within the update horizon, kept so
    that late samples can complete it. ``clock``: the wall clock in epoch ms, against which
    future event times are judged.
    """

    def __init__(self, config: WindowConfig, store: MutableMapping[str, dict],
                 history: MutableMapping[str, dict] | None = None,
                 clock: Callable[[], int] = _wall_clock_ms, thresholds: Thresholds = DEFAULTS) -> None:
        self.config = config
        self.judged = thresholds.for_team  # a team's thresholds, for the goodput buckets
        self.store = store
        self.history = {} if history is None else history
        self.clock = clock
        self._max_event_time: dict[int, int] = {}
        # partition -> window end -> workflow ids with an open window ending there
        self._open: dict[int, dict[int, set[str]]] = {}
        # partition -> workflow ids with no open window (candidates for forgetting)
        self._idle: dict[int, set[str]] = {}
        # partition -> window end -> history keys of closed windows ending there
        self._kept: dict[int, dict[int, set[str]]] = {}
        self._repaired: dict[int, set[str]] = {}  # states repaired on load, to be persisted

    # -- partition bookkeeping, derived from the store ---------------------------------
    def forget_partitions(self) -> None:
        """Drop derived per-partition indexes (after a rebalance); they are rebuilt from the store."""
        self._max_event_time.clear()
        self._open.clear()
        self._idle.clear()
        self._kept.clear()

    def _load_partition(self, partition: int) -> None:
        if partition in self._max_event_time:
            return
        newest = -1
        index: dict[int, set[str]] = {}
        idle: set[str] = set()
        limit = self.clock() + self.config.max_future_skew_ms
        for wf, state in self.store.items():
            if not isinstance(state, WorkflowState) or state.partition != partition:
                continue
            if state.max_event_time > limit:
                self._repair(wf, state, limit, partition)
            newest = max(newest, state.max_event_time)
            for start in state.windows:
                index.setdefault(int(start) + self.config.size_ms, set()).add(wf)
            if not state.windows:
                idle.add(wf)
        kept: dict[int, set[str]] = {}
        for key, closed in self.history.items():
            if isinstance(closed, dict) and closed.get("partition") == partition:
                kept.setdefault(start_of_key(key) + self.config.size_ms, set()).add(key)
        self._max_event_time[partition] = newest
        self._open[partition] = index
        self._idle[partition] = idle
        self._kept[partition] = kept

    def _repair(self, wf: str, state: WorkflowState, limit: int, partition: int) -> None:
        """A state whose clock a sample written before future times were refused moved into the
        future (``workflow_state.repair_future``), mended and persisted."""
        future = repair_future(state, limit, self.config.size_ms)
        log.warning("partition %d: workflow %s had event times in the future (beyond %d); dropped its "
                    "windows starting %s and set its clock back to %d", partition, wf, limit,
                    ", ".join(future) or "(none)", state.max_event_time)
        self.store[wf] = state
        self._repaired.setdefault(partition, set()).add(wf)

    def _result(self, partition: int) -> BatchResult:
        return BatchResult(changed=self._repaired.pop(partition, set()))

    def watermark(self, partition: int) -> int | None:
        self._load_partition(partition)
        newest = self._max_event_time[partition]
        return None if newest < 0 else newest - self.config.allowed_lateness_ms

    def open_windows(self, partition: int) -> int:
        self._load_partition(partition)
        return sum(len(v) for v in self._open[partition].values())

    # -- the batch ---------------------------------------------------------------------
    def state_of(self, workflow_id: str, partition: int, owner: str | None = None,
                 team: str | None = None) -> WorkflowState:
        """The workflow's state, created empty if no sample of it has been applied yet (its life
        cycle can be heard of before its samples are)."""
        state = self.store.get(workflow_id)
        if state is None:
            state = self.store[workflow_id] = WorkflowState(partition=partition, owner=owner, team=team)
        return state

    def running(self, partitions: Iterable[int]) -> dict[int, list[str]]:
        """Per partition, the workflows that have samples and have not ended (GPUs of no
        workflow left out); one pass over the store for all of them."""
        out: dict[int, list[str]] = {p: [] for p in partitions}
        for wf, s in self.store.items():
            if (isinstance(s, WorkflowState) and s.partition in out and s.max_event_time >= 0
                    and not s.ended and not s.ending and wf not in NOT_WORKFLOWS):
                out[s.partition].append(wf)
        return {p: sorted(wfs) for p, wfs in out.items()}

    def newest(self, partition: int) -> int:
        """The newest event time applied on ``partition`` (-1 before any)."""
        self._load_partition(partition)
        return self._max_event_time[partition]

    def advance(self, partition: int, event_time: int, closed_at: int) -> BatchResult:
        """Move an idle partition's clock to ``event_time`` (the newest of the busy partitions)
        and close what that closes: without it, a partition that stopped receiving samples
        would keep its last windows open for ever (Flink calls this idleness). A time ahead
        of the wall clock by more than the allowed skew moves nothing."""
        self._load_partition(partition)
        result = self._result(partition)
        if (event_time > self._max_event_time[partition] >= 0
                and event_time <= self.clock() + self.config.max_future_skew_ms):
            self._max_event_time[partition] = event_time
            self._close(partition, event_time - self.config.allowed_lateness_ms, closed_at, result)
        return result

    def follow(self, partition: int, fleet_time: int, quiet_ms: int, closed_at: int) -> BatchResult:
        """The fleet's event time (``PartitionClock``) reached ``partition``: if its own clock is
        more than ``quiet_ms`` behind, its samples stopped, and it follows the fleet's. Decided
        on event time alone, so a replay of the partition decides alike."""
        self._load_partition(partition)
        newest = self._max_event_time[partition]
        if newest >= 0 and fleet_time - newest > quiet_ms:
            return self.advance(partition, fleet_time, closed_at)
        return self._result(partition)

    def ended(self, partition: int, silent_ms: int) -> list[str]:
        """Workflows of ``partition`` with no open window that either had no sample for
        ``silent_ms`` of event time or are marked ``ending`` (their hosts said so), and are not
        yet marked ``ended``. The pseudo-workflows of GPUs no job holds never end."""
        self._load_partition(partition)
        horizon = self._max_event_time[partition] - silent_ms
        out = []
        for wf in self._idle[partition]:
            state = self.store[wf]
            if state.max_event_time < 0 or state.ended or wf in NOT_WORKFLOWS:
                continue  # no sample yet (its life cycle came first), summarised already, or no job
            if state.max_event_time < horizon or state.ending:
                out.append(wf)
        return sorted(out)

    def process(self, partition: int, batch: Iterable[Incoming], closed_at: int) -> BatchResult:
        """Apply ``batch`` (in offset order) and close every window the watermark has passed."""
        self._load_partition(partition)
        cfg = self.config
        size = cfg.size_ms
        lateness = cfg.allowed_lateness_ms
        future = self.clock() + cfg.max_future_skew_ms
        goodput = cfg.goodput
        newest = self._max_event_time[partition]
        index = self._open[partition]
        idle = self._idle[partition]
        result = self._result(partition)
        reopened: dict[str, Record | None] = {}  # history key -> its window before this batch
        for item in batch:
            c = item.record
            wf = c["workflow_id"]
            state = self.store.get(wf)
            if state is None:
                log.info("%s: its first samples on partition %d here (offset %d)", wf, partition, item.offset)
                state = self.state_of(wf, partition, c["owner"], c["team"])
                idle.add(wf)
            elif (item.offset, item.index) <= (state.last_offset, state.last_index):
                result.replayed += 0 if item.unobserved else samples_in(c)  # applied before a restart: a replay
                continue
            state.last_offset, state.last_index = item.offset, item.index
            self.store[wf] = state
            result.changed.add(wf)
            watermark = newest - lateness if newest >= 0 else None
            if item.unobserved:
                self._unobserved(partition, item, state, watermark, future, closed_at, reopened, result)
                continue
            for start, part in by_window(c, size):
                times = part["event_time"]
                if max(times) > future:
                    result.refused.append((item, future_reason(times, wf, future - cfg.max_future_skew_ms,
                                                         cfg.max_future_skew_ms)))
                    continue
                if state.ended and not (watermark is not None and start + size <= watermark):
                    state.ended = state.ending = False  # it came back after it ended: a new life
                    state.end_reason = None
                placed = self._place(partition, wf, state, start, watermark, closed_at, reopened,
                                     lambda acc, part=part, state=state: add_block(acc, part, state, goodput,
                                                                                   self.judged(state.team)))
                if placed is None:
                    result.refused.append((item, late_reason(times, start, size, wf, watermark, partition,
                                                             cfg.update_horizon_ms)))
                if placed != OPEN:
                    continue
                t = max(times)
                state.max_event_time = max(state.max_event_time, t)
                newest = max(newest, t)
            if c["owner"]:
                state.owner, state.team = c["owner"], c["team"]
            if newest >= 0 and index and newest - lateness >= min(index):
                # Windows close as soon as the watermark passes them, not at the end of the
                # batch: what a window holds never depends on where batches begin and end.
                self._max_event_time[partition] = newest
                self._close_windows(partition, newest - lateness, closed_at, result)
        for key, before in reopened.items():
            closed = self.history[key]
            closed["version"] += 1
            wf, start = key.rpartition("@")[0], start_of_key(key)
            after = to_window(wf, self.store[wf], start, closed["acc"], size, closed_at, closed["version"],
                              cfg.goodput, self.judged(self.store[wf].team))
            result.updated.append((after, before))
            result.history_changed.add(key)
        self._max_event_time[partition] = newest
        if newest >= 0:
            self._close(partition, newest - lateness, closed_at, result)
        return result

    def _place(self, partition: int, wf: str, state: WorkflowState, start: int, watermark: int | None,
               closed_at: int, reopened: dict[str, Record | None], add: Callable[[dict], None]) -> str | None:
        """``add`` to ``wf``'s window starting at ``start``: the open one (opened if need be:
        ``OPEN``), or the closed one within the update horizon, emitted again (``LATE``). None
        where the window is past the horizon: nothing is added. An open window takes its samples
        whatever the watermark (after a killed worker's changelogs were written in part)."""
        size = self.config.size_ms
        key = str(start)
        acc = state.windows.get(key)
        if acc is None and watermark is not None and start + size <= watermark:
            if start + size <= watermark - self.config.update_horizon_ms:
                return None
            self._add_late(partition, wf, state, start, add, closed_at, reopened)
            return LATE
        if acc is None:
            if self.history.get(history_key(wf, start)) is not None:
                # Closed already, on a clock since rebuilt lower (a quiet partition follows the fleet's
                # clock, which no state keeps): it stays closed, and takes these as a new version.
                self._add_late(partition, wf, state, start, add, closed_at, reopened)
                return LATE
            acc = state.windows[key] = new_acc()
            self._open[partition].setdefault(start + size, set()).add(wf)
            self._idle[partition].discard(wf)
        add(acc)
        return OPEN

    def _unobserved(self, partition: int, item: Incoming, state: WorkflowState, watermark: int | None,
                    future: int, closed_at: int, reopened: dict[str, Record | None], result: BatchResult) -> None:
        """An ``UnobservedTime`` span into the windows it covers; it moves no clock: no sample came."""
        span, cfg = item.record, self.config
        if span["to_time"] > future:
            result.refused.append((item, future_reason([span["to_time"]], span["workflow_id"],
                                                       future - cfg.max_future_skew_ms, cfg.max_future_skew_ms)))
            return
        for start, gpu_ms in unobserved.by_window(span, cfg.size_ms):
            if self._place(partition, span["workflow_id"], state, start, watermark, closed_at, reopened,
                           lambda acc, gpu_ms=gpu_ms: add_unobserved(acc["goodput"], gpu_ms)) is None:
                result.refused.append((item, unobserved_late_reason(span, start, cfg.size_ms, watermark,
                                                                    cfg.update_horizon_ms)))

    def _add_late(self, partition: int, wf: str, state: WorkflowState, start: int, add: Callable[[dict], None],
                  closed_at: int, reopened: dict[str, Record | None]) -> None:
        """Late samples of a closed window within the horizon: added to the window as kept
        since it closed, or to a new one if it never closed (all its samples came late)."""
        key = history_key(wf, start)
        closed = self.history.get(key)
        if closed is None:
            log.info("%s: samples of window %d came after the watermark passed it, and no closed window of "
                     "it is kept here: it starts anew (partition %d, %d windows kept)", wf, start, partition,
                     sum(map(len, self._kept[partition].values())))
            closed = {"partition": partition, "version": 0, "acc": new_acc()}
            self._kept[partition].setdefault(start + self.config.size_ms, set()).add(key)
        if key not in reopened:
            reopened[key] = (None if closed["version"] == 0 else
                             to_window(wf, state, start, closed["acc"], self.config.size_ms, closed_at,
                                       closed["version"], self.config.goodput, self.judged(state.team)))
        if "goodput" not in closed["acc"]:
            closed["acc"]["goodput"] = new_acc()["goodput"]
        add(closed["acc"])
        self.history[key] = closed

    def _close(self, partition: int, watermark: int, closed_at: int, result: BatchResult) -> None:
        """Close what ``watermark`` passed, drop kept windows past the update horizon and
        forget workflows silent for longer than the retention."""
        self._close_windows(partition, watermark, closed_at, result)
        kept = self._kept[partition]
        idle = self._idle[partition]
        horizon = watermark - self.config.update_horizon_ms
        for end in [e for e in kept if e <= horizon]:
            for key in kept.pop(end):
                self.history.pop(key, None)
                result.history_changed.discard(key)
                result.history_removed.add(key)
        horizon = self._max_event_time[partition] - self.config.retention_ms  # (a clock jump ends them first)
        for wf in [wf for wf in idle if forgettable(wf, self.store[wf], horizon)]:
            idle.discard(wf)
            del self.store[wf]
            result.changed.discard(wf)
            result.removed.add(wf)

    def _close_windows(self, partition: int, watermark: int, closed_at: int, result: BatchResult) -> None:
        index = self._open[partition]
        for end in sorted(e for e in index if e <= watermark):
            for wf in sorted(index.pop(end)):
                self._close_window(partition, wf, end, closed_at, result)

    def _close_window(self, partition: int, wf: str, end: int, closed_at: int, result: BatchResult) -> None:
        """Close ``wf``'s window ending at ``end`` (taken out of the open index by the caller)."""
        state = self.store[wf]
        start = end - self.config.size_ms
        acc = state.windows.pop(str(start))
        key = history_key(wf, start)
        # Kept closed already where a killed owner wrote its kept windows but not this state:
        # this close, from the state and every sample after it, outranks what it emitted.
        version = 1 + (self.history.get(key) or {}).get("version", 0)
        result.closed.append(to_window(wf, state, start, acc, self.config.size_ms, closed_at, version,
                                       self.config.goodput, self.judged(state.team)))
        result.changed.add(wf)
        if self.config.update_horizon_ms:
            self.history[key] = {"partition": partition, "version": version, "acc": acc}
            self._kept[partition].setdefault(end, set()).add(key)
            result.history_changed.add(key)
        if not state.windows:
            self._idle[partition].add(wf)

    def close_workflow(self, partition: int, wf: str, closed_at: int) -> BatchResult:
        """Close every open window of ``wf`` now, whatever the watermark: its scheduler said it
        ended and its agents sent all their samples of it (the end travels after them, in the
        same partition). A sample of it that still comes completes its window as a new version,
        as a late sample does."""
        self._load_partition(partition)
        result = self._result(partition)
        state = self.store.get(wf)
        if state is None:
            return result
        index = self._open[partition]
        for end in sorted(int(start) + self.config.size_ms for start in state.windows):
            index.get(end, set()).discard(wf)
            if end in index and not index[end]:
                del index[end]
            self._close_window(partition, wf, end, closed_at, result)
        return result
