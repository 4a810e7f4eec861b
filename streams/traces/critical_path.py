"""The critical path of each profiler step: the chain of dependent work, across CPU threads and
GPU streams, that set how long the step took, and what it was spent on.

The graph is Holistic Trace Analysis' (``critical_path_analysis``): every CPU operator and CUDA
runtime call, and every GPU operation launched from the step, has a start and an end node.

* On a CPU thread the nodes follow each other in time inside a top-level operator, each edge
  weighted by the time between them and charged to the operator it was spent in (a start and the
  next start: the first; a start and its end: the operator; an end and the next end: the outer
  one; an end and the next start: the operator both are inside). Between two top-level
  operators the edge weighs nothing: a thread waiting for work sets no one's pace. A blocking
  call (``cudaDeviceSynchronize``, ``cudaStreamSynchronize``, ``cudaEventSynchronize``,
  ``cudaEventQuery``, ``cudaMemcpy[Async]``) weighs nothing either: its time is the GPU's, and
  reaches the call's end through the synchronisation edge below.
* A GPU operation weighs its duration. It follows whichever of its dependencies was ready last:
  its launch call (a launch delay: the stream was idle when it was launched), the operation
  before it on its stream (the gap between them), or an operation it waits for through a CUDA
  event (below).
* Synchronisation: the last operation of the stream (``Stream Sync``), of every stream
  (``Context Sync``) or the one an event was recorded after (``Event Sync``) precedes the end of
  the blocking call; a ``Stream Wait Event`` makes the next operation launched on the waiting
  stream follow the one the event was recorded after.

The critical path is the longest path (by weight) of the graph. HTA builds a step's graph in
memory and runs networkx over it; here each node's longest distance is final when it is made
(every edge goes forward in time), so the path is found in one pass over the batches' columns,
event by event in start order: a node keeps its distance and best predecessor, a step is
summarised and forgotten once over (``IN_FLIGHT`` steps held at most), and a step of more than
``MAX_NODES`` nodes is given up with a reason.

**CUDA graphs.** A ``cudaGraphLaunch`` puts many kernels on the GPU under one correlation id.
HTA 0.5.0 fails on a step of graphs (its launch queue counts only kernel launch calls); here
every kernel of the graph follows the launch or the kernel before it on its stream, so a step
of graphs has the path of the same kernels launched one by one. Without profiler steps the
whole trace is one region.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left
from collections import Counter
from itertools import count

from streams.traces.batch import EventBatch
from streams.traces.kernel_type import KernelType, kernel_type, short_kernel_name

BLOCKING_CALLS = frozenset({"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventQuery",
                            "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpyAsync"})
GPU_KINDS = frozenset({"kernel", "memcpy", "memset"})
IN_FLIGHT = 2  # steps held at once: a step's GPU work may still run while the next one starts
MAX_NODES = 2_000_000  # ~40 bytes a node: a step past this is given up, not held
TOP = 10
RECENT_LAUNCHES = 1024  # per stream, to find the operation an event was recorded after
_NO_EXTRAS: dict = {}

# The time a step's annotation holds outside its operators: the training loop's own Python
STEP_CODE = "ProfilerStep (the step's code between operators)"

# What the time of an edge on the path was spent on
NONE, CPU, GPU, LAUNCH, GAP = range(5)


class _Thread:
    __slots__ = ("last", "last_is_start", "last_label", "last_top", "stack")

    def __init__(self) -> None:
        self.stack: list[int] = []  # labels of the open events
        self.last = -1  # the thread's latest node inside a top-level event
        self.last_is_start = False
        self.last_label = -1
        self.last_top = -1  # end node of the latest top-level event


class _Region:
    """One step's graph, built as its events arrive."""

    def __init__(self, name: str, start: float, end: float, infer_syncs: bool) -> None:
        self.name, self.start, self.end = name, start, end
        self.infer_syncs = infer_syncs
        self.ts, self.dist, self.pred = array("d"), array("d"), array("q")
        self.how, self.attr = array("B"), array("q")  # the best incoming edge: its kind, its label
        self.labels: list[tuple[str, int, bool]] = []  # (name, stream, communication)
        self.pending: list[tuple] = []  # CPU ends to come: (ts, -start order, tid, label, corr, blocking)
        self.threads: dict[int, _Thread] = {}
        self.stream_last: dict[int, int] = {}  # stream -> end node of its latest operation
        self.launched: dict[int, tuple[list[float], list[int]]] = {}  # stream -> launch times, end nodes
        self.calls: dict[int, tuple[int, float]] = {}  # correlation -> (start node, ts) of the call
        self.records: dict[int, float] = {}  # cudaEventRecord correlation -> ts
        self.syncs: dict[int, tuple] = {}  # correlation of a blocking call -> (name, stream, waited stream, record)
        self.copies: dict[int, int] = {}  # correlation of a copy call -> end node of its copy
        self.waits: dict[int, list[tuple[float, int, float]]] = {}  # stream -> (call ts, recorded stream, record ts)
        self.seq = 0
        self.too_big = False

    def release(self) -> None:
        """Let go of the graph (a step given up)."""
        self.ts, self.dist, self.pred, self.how, self.attr = array("d"), array("d"), array("q"), array("B"), array("q")
        self.labels, self.pending = [], []
        for held in (self.threads, self.stream_last, self.launched, self.calls, self.records, self.syncs,
                     self.copies, self.waits):
            held.clear()

    # -- nodes and edges ---------------------------------------------------------------
    def node(self, ts: float) -> int:
        if len(self.ts) >= MAX_NODES:
            self.too_big = True
            raise _TooBig
        self.ts.append(ts)
        self.dist.append(0.0)
        self.pred.append(-1)
        self.how.append(NONE)
        self.attr.append(-1)
        return len(self.ts) - 1

    def edge(self, src: int, dst: int, weight: float, how: int, label: int) -> None:
        d = self.dist[src] + (weight if weight > 0 else 0.0)
        if self.pred[dst] < 0 or d > self.dist[dst]:
            self.dist[dst], self.pred[dst], self.how[dst], self.attr[dst] = d, src, how, label

    def sync_edge(self, src: int | None, dst: int) -> None:
        if src is not None and self.ts[src] <= self.ts[dst]:  # never back in time
            self.edge(src, dst, 0.0, NONE, -1)

    def label(self, name: str, stream: int = -1) -> int:
        comm = stream >= 0 and kernel_type(name) is KernelType.COMMUNICATION
        self.labels.append((name, stream, comm))
        return len(self.labels) - 1

    # -- CPU ------------------------------------------------------------------------------
    def advance(self, ts: float) -> None:
        """Make the ends of CPU events up to ``ts`` (ends before starts at the same time)."""
        pending = self.pending
        while pending and pending[0][0] <= ts:
            self.end_cpu(*heapq.heappop(pending))

    def add_cpu(self, name: str, ts: float, dur: float, corr: int, tid: int) -> None:
        self.advance(ts)
        label = self.label(name)
        start = self.node(ts)
        th = self.threads.get(tid)
        if th is None:
            th = self.threads[tid] = _Thread()
        if not th.stack:
            if th.last_top >= 0:
                self.edge(th.last_top, start, 0.0, NONE, -1)
        elif th.last >= 0:
            owner = th.last_label if th.last_is_start else th.stack[-1]
            self.edge(th.last, start, ts - self.ts[th.last], CPU, owner)
        th.stack.append(label)
        th.last, th.last_is_start, th.last_label = start, True, label
        if corr >= 0:
            self.calls[corr] = (start, ts)
            if name == "cudaEventRecord":
                self.records[corr] = ts
        self.seq -= 1  # (of two ends at the same time, the event that started later ends first)
        heapq.heappush(self.pending, (ts + dur, self.seq, tid, label, corr, name in BLOCKING_CALLS))

    def end_cpu(self, ts: float, _seq: int, tid: int, label: int, corr: int, blocking: bool) -> None:
        end = self.node(ts)
        th = self.threads[tid]
        if label in th.stack:  # (an event that outlived its parent closes what it holds)
            while th.stack.pop() != label:
                pass
        if th.last >= 0:
            owner = th.last_label if th.last_is_start else label
            self.edge(th.last, end, 0.0 if blocking else ts - self.ts[th.last], CPU, owner)
        sync = self.syncs.pop(corr, None) if corr >= 0 else None
        if sync is not None:
            self.sync_into(sync, end)
        elif blocking and self.infer_syncs:
            self.inferred_sync(corr, self.labels[label][0], end)
        if th.stack:
            th.last, th.last_is_start, th.last_label = end, False, label
        else:
            th.last, th.last_top = -1, end

    def sync_into(self, sync: tuple, end: int) -> None:
        name, stream, wait_on_stream, wait_on_record = sync
        if name == "Context Sync":
            for last in self.stream_last.values():
                self.sync_edge(last, end)
        elif name == "Stream Sync":
            self.sync_edge(self.stream_last.get(stream), end)
        elif name == "Event Sync":
            self.sync_edge(self.recorded_after(wait_on_stream, wait_on_record), end)

    def inferred_sync(self, corr: int, name: str, end: int) -> None:
        """A blocking call the profiler wrote no synchronisation event for (traces before
        PyTorch 2.3; HTA then leaves the GPU off the path): a copy call waits for its copy, a
        device or stream synchronisation for the operations running on any stream."""
        copy = self.copies.pop(corr, None)
        if copy is not None:
            self.sync_edge(copy, end)
        elif name in ("cudaDeviceSynchronize", "cudaStreamSynchronize"):
            for last in self.stream_last.values():
                self.sync_edge(last, end)

    def recorded_after(self, stream: int, record: int) -> int | None:
        """The end node of the operation a CUDA event was recorded after: the latest launched on
        the recorded ``stream`` before the ``cudaEventRecord`` call (correlation ``record``)."""
        record_ts = self.records.get(record)
        return None if record_ts is None else self.launched_before(stream, record_ts)

    def launched_before(self, stream: int, ts: float) -> int | None:
        """The end node of the latest operation launched on ``stream`` before ``ts``."""
        launched = self.launched.get(stream)
        if not launched:
            return None
        i = bisect_left(launched[0], ts)
        return launched[1][i - 1] if i else None

    # -- GPU ------------------------------------------------------------------------------
    def add_gpu(self, kind: str, name: str, ts: float, dur: float, stream: int, corr: int, call: tuple) -> None:
        self.advance(ts)
        label = self.label(name, stream)
        start, end = self.node(ts), self.node(ts + dur)
        launch_node, launch_ts = call
        # It could start once launched, the operation before it on its stream done, and the
        # events it waits for recorded: it follows whichever came last (the GPU's side on a tie).
        prev = self.stream_last.get(stream)
        waited = [w for w in self.waited(stream, launch_ts) if self.ts[w] <= ts]
        last_wait = max(waited, key=self.ts.__getitem__) if waited else None
        ready = max(launch_ts, -1.0 if prev is None else self.ts[prev],
                    -1.0 if last_wait is None else self.ts[last_wait])
        if last_wait is not None and self.ts[last_wait] == ready:
            self.edge(last_wait, start, 0.0, NONE, -1)
        elif prev is not None and self.ts[prev] == ready:
            self.edge(prev, start, ts - self.ts[prev], GAP, -1)
        else:  # the stream was idle at the launch
            self.edge(launch_node, start, ts - launch_ts, LAUNCH, -1)
        self.edge(start, end, dur, GPU, label)
        self.stream_last[stream] = end
        if kind == "memcpy":
            self.copies[corr] = end
        times, ends = self.launched.setdefault(stream, ([], []))
        if times and launch_ts < times[-1]:  # (launches on a stream start in order; a trace that says not is cut here)
            del times[:], ends[:]
        times.append(launch_ts)
        ends.append(end)
        if len(times) > 2 * RECENT_LAUNCHES:
            del times[:RECENT_LAUNCHES], ends[:RECENT_LAUNCHES]

    def waited(self, stream: int, launch_ts: float) -> list[int]:
        """The operations a ``Stream Wait Event`` on ``stream`` makes an operation launched at
        ``launch_ts`` follow (once: the wait holds the next operation)."""
        waits = self.waits.get(stream)
        if not waits:
            return []
        due = [w for w in waits if w[0] < launch_ts]
        if not due:
            return []
        waits[:] = [w for w in waits if w[0] >= launch_ts]
        found = (self.launched_before(recorded_stream, record_ts) for _call_ts, recorded_stream, record_ts in due)
        return [end for end in found if end is not None]

    def add_sync(self, corr: int, sync: tuple) -> None:
        """A GPU-side synchronisation event of a call made in this region."""
        name, stream, wait_on_stream, wait_on_record = sync
        if name == "Stream Wait Event":
            record_ts = self.records.get(wait_on_record)
            call = self.calls.get(corr)
            if record_ts is not None and call is not None:
                self.waits.setdefault(stream, []).append((call[1], wait_on_stream, record_ts))
        else:
            self.syncs[corr] = sync

    # -- the path -------------------------------------------------------------------------
    def summary(self) -> dict:
        self.advance(float("inf"))
        out = {"step": self.name, "span_us": float(self.end - self.start) if self.end != float("inf") else None,
               "path_us": 0.0, "cpu_us": 0.0, "gpu_compute_us": 0.0, "communication_us": 0.0,
               "launch_overhead_us": 0.0, "kernel_gap_us": 0.0, "streams": {}, "top": []}
        if not len(self.dist):
            return out
        dist, pred, how, attr = self.dist, self.pred, self.how, self.attr
        node = max(range(len(dist)), key=dist.__getitem__)
        out["path_us"] = float(dist[node])
        on: Counter = Counter()
        streams: Counter = Counter()
        while pred[node] >= 0:
            p = pred[node]
            w, kind, label = dist[node] - dist[p], how[node], attr[node]
            if kind == CPU:
                out["cpu_us"] += w
            elif kind == GPU:
                name, stream, comm = self.labels[label]
                out["communication_us" if comm else "gpu_compute_us"] += w
                streams[stream] += w
            elif kind == LAUNCH:
                out["launch_overhead_us"] += w
            elif kind == GAP:
                out["kernel_gap_us"] += w
            if (kind == CPU or kind == GPU) and w > 0:  # (a gap or a launch delay is no event's time)
                name, stream, _ = self.labels[label]
                if name.startswith("ProfilerStep#"):
                    name = STEP_CODE
                on[(name, "gpu" if stream >= 0 else "cpu")] += w
            node = p
        out["streams"] = {s: t for s, t in sorted(streams.items())}
        out["top"] = [{"name": n, "on": where, "time_us": t} for (n, where), t in on.most_common(TOP)]
        out["_on"] = on
        return out


class _TooBig(Exception):
    pass


class CriticalPath:
    """The analyser: fed every event of a rank in start order (CPU operators included), it
    keeps the regions in flight and the summaries of those that are over."""

    def __init__(self, infer_syncs: bool = False) -> None:
        """``infer_syncs``: the trace has no synchronisation events (see ``_Region.inferred_sync``)."""
        self.infer_syncs = infer_syncs
        self.regions: list[_Region] = []
        self.done: list[dict] = []
        self.by_call: dict[int, _Region] = {}  # correlation of a call -> its region
        self.stepped = False
        self.skipped: list[str] = []
        self.on: Counter = Counter()

    def _region_at(self, kind: str, name: str, ts: float, dur: float) -> _Region | None:
        if name.startswith("ProfilerStep#"):
            if not self.stepped:  # the region before the first step is not a step: dropped
                self.stepped = True
                self.regions.clear()
                self.by_call.clear()
            self._open(_Region(name, ts, ts + dur, self.infer_syncs))
            return self.regions[-1] if kind == "cpu_op" else None  # (an annotation is not an operator)
        if not self.stepped and not self.regions:
            self._open(_Region("(whole trace)", ts, float("inf"), self.infer_syncs))
        region = self.regions[-1] if self.regions else None
        return region if region is not None and region.start <= ts <= region.end else None

    def _open(self, region: _Region) -> None:
        self.regions.append(region)
        while len(self.regions) > IN_FLIGHT:
            self._close(self.regions.pop(0))

    def _close(self, region: _Region) -> None:
        for corr in region.calls:
            if self.by_call.get(corr) is region:
                del self.by_call[corr]
        if region.too_big:
            self.skipped.append(f"{region.name}: more than {MAX_NODES:,} nodes")
            return
        summary = region.summary()
        self.on.update(summary.pop("_on", {}))
        self.done.append(summary)

    def add(self, b: EventBatch) -> None:
        """The next events of the trace, in start order: one by one (a path is sequential), over
        the batch's columns."""
        extras, by_call = b.extras, self.by_call
        for i, kind, name, ts, dur, stream, corr, tid in zip(count(), b.kind, b.name, b.ts, b.dur, b.stream,
                                                             b.correlation, b.tid):
            try:
                if stream < 0 and kind != "sync":  # a CPU operator, runtime call or step annotation
                    if dur > 0 and (kind == "cpu_op" or kind == "runtime" or name.startswith("ProfilerStep#")):
                        region = self._region_at(kind, name, ts, dur)
                        if region is not None and not region.too_big:
                            region.add_cpu(name, ts, dur, corr, tid)
                            if corr >= 0:
                                by_call[corr] = region
                    continue
                region = by_call.get(corr)
                if region is None or region.too_big:
                    continue
                if kind == "sync":
                    x = extras.get(i, _NO_EXTRAS)
                    region.add_sync(corr, (name, stream, x.get("wait_on_stream", -1), x.get("wait_on_record", -1)))
                elif kind in GPU_KINDS:
                    call = region.calls.get(corr)
                    if call is not None:
                        region.add_gpu(kind, name, ts, dur, stream, corr, call)
            except _TooBig:  # the step is given up: what it held is let go now, not at its end
                for region in self.regions:
                    if region.too_big:
                        region.release()
                self.by_call = by_call = {c: r for c, r in by_call.items() if not r.too_big}

    def result(self) -> dict:
        """Every step's path and their sum; the regions still open are closed (the trace is over)."""
        for region in self.regions:
            self._close(region)
        self.regions.clear()
        self.by_call.clear()
        steps = self.done
        keys = ("path_us", "cpu_us", "gpu_compute_us", "communication_us", "launch_overhead_us", "kernel_gap_us")
        total = {k: sum(s[k] for s in steps) for k in keys}
        streams: Counter = Counter()
        for s in steps:
            streams.update(s["streams"])
        total["streams"] = dict(sorted(streams.items()))
        top = [{"name": n, "short_name": short_kernel_name(n) if where == "gpu" else n, "on": where, "time_us": t}
               for (n, where), t in self.on.most_common(TOP)]
        return {"steps": steps, "total": total, "top": top, "skipped": list(self.skipped)}
