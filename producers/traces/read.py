"""Reads a PyTorch profiler (Kineto) trace file into the time-ordered event records the
trace analysis consumes, with Holistic Trace Analysis' loading rules.

The file is streamed (``trace_json``) and only the events the analysis needs are kept, in
columns (``trace_events``). Loading rules (HTA 0.5.0):

* events without ``dur`` or ``cat`` (and the ``Trace`` envelope) are ignored;
* if any event has a float (or missing) ``ts``, every event is rounded to whole
  microseconds: ``end = floor(ts + dur)``, ``ts = ceil(ts)``;
* with at least two distinct ``ProfilerStep`` names, the last step is dropped: CPU-side
  events are kept only if they start before the last ProfilerStep starts, GPU-side events
  only if their correlation id matches a kept CPU-side event.

Items of ``traceEvents`` that are not objects, and events whose time, duration or category
has the wrong type (``"ts": "abc"``), are skipped and counted (``skipped``: how many of each
and the first, named by its place); a trace of which nothing usable remains is a TraceError
naming the first. A trace damaged part-way (truncated, invalid JSON) yields what was valid before the damage,
with ``partial`` set and the parser's error; it never raises for that.
"""

from __future__ import annotations

import gc
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from itertools import compress
from pathlib import Path
from typing import Any

import msgspec

from producers.traces.events import SYNC_CODE, Columns, EventList, escaped
from producers.traces.json_text import (
    NO_ARGS,
    Args,
    Event,
    TraceDamaged,
    TraceError,
    Unusable,
    any_decoder,
    event_blocks,
    metadata,
    open_trace,
    to_int,
)

# Kineto categories -> the kinds of the KernelEvent schema.
KIND_BY_CAT = {
    "kernel": "kernel", "Kernel": "kernel",
    "gpu_memcpy": "memcpy", "Memcpy": "memcpy",
    "gpu_memset": "memset", "Memset": "memset",
    "cuda_sync": "sync",
    "cuda_runtime": "runtime", "Runtime": "runtime", "cuda_driver": "runtime",
    "cpu_op": "cpu_op", "Operator": "cpu_op",
    "user_annotation": "annotation", "gpu_user_annotation": "annotation",
}
DEVICE_SYNC_NAMES = frozenset({"Event Sync", "Context Sync"})


class TraceRead(msgspec.Struct):
    path: str
    rank: int = 0
    events: Any = msgspec.field(default_factory=list)  # an EventList: sorted by (ts, CPU before GPU)
    events_seen: int = 0
    last_step_dropped: bool = False
    rounded: bool = False
    partial: bool = False
    error: str | None = None
    device_properties: list[dict] = msgspec.field(default_factory=list)
    memory_peak_bytes: int | None = None  # highest allocated on any GPU, from the profiler's memory events
    memory_total_bytes: int | None = None  # that GPU's memory
    # FLOPs of the operators the profiler counted (with_flops=True), per precision of their inputs
    flops: dict[str, int] = msgspec.field(default_factory=dict)
    gpu_name: str | None = None  # the GPU most of the rank's GPU events ran on, from deviceProperties
    sync_events: int = 0  # the profiler's synchronisation events (cuda_sync; PyTorch 2.3 and later)
    # items of traceEvents that could not be used (``Skipped.as_record``), or None
    skipped: dict | None = None

    def memory(self) -> dict | None:
        if self.memory_peak_bytes is None:
            return None
        return {"peak_bytes": self.memory_peak_bytes, "total_bytes": self.memory_total_bytes}


class Skipped:
    """The items of ``traceEvents`` the analysis could not use (``trace_json.Unusable``): how
    many were not events, how many had a time, duration or category of the wrong type, and the
    first of them, by its place in the list."""

    def __init__(self) -> None:
        self.not_events = self.items = 0
        self.first: str | None = None

    def add(self, index: int, why: str) -> None:
        self.items += 1
        if why.endswith("not an event object"):
            self.not_events += 1
        if self.first is None:
            self.first = f"item {index} of traceEvents: {why}"

    def __str__(self) -> str:
        unusable = self.items - self.not_events
        parts = [text for n, text in (
            (self.not_events, (f"{self.not_events} item{'s' if self.not_events > 1 else ''} that "
                              f"{'are' if self.not_events > 1 else 'is'} not an event")),
            (unusable, (f"{unusable} event{'s' if unusable > 1 else ''} whose time, duration or category "
                       f"{'have' if unusable > 1 else 'has'} the wrong type"))) if n]
        return f"{' and '.join(parts)} {'was' if self.items == 1 else 'were'} skipped; the first is {self.first}"

    def as_record(self) -> dict | None:
        if not self.items:
            return None
        return {"not_events": self.not_events, "unusable_events": self.items - self.not_events,
                "first": self.first, "says": str(self)}


@contextmanager
def no_cycle_collection() -> Iterator[None]:
    """Python's cycle collector off while a trace is read (and, in ``gpufleet analyze``,
    analysed). Every kept event is a new dict holding lists, so the collector runs again
    and again over all of them, and the records form no cycles: on a 9 MiB trace
    (``benchmarks/bench_trace_analysis.py --scale 10``) it found nothing and took a third
    of the analysis and a fifth to two fifths of the whole run."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def read_trace(path: str | Path, cpu_ops: bool = False) -> TraceRead:
    """Read ``path`` with HTA's loading rules; see the module docstring. ``cpu_ops``: keep every
    CPU operator and annotation (the critical path and the kernel sequences need them; the other
    analyses only a few)."""
    path = Path(path)
    result = TraceRead(str(path))
    read = _Read(cpu_ops)
    try:
        with open_trace(path) as fh, no_cycle_collection():
            head = fh.read(1 << 16)  # a file cut short or corrupt here: no event read, a TraceError below
            meta = metadata(head, path)
            info = meta.get("distributedInfo")
            if isinstance(info, dict):
                result.rank = to_int(info.get("rank", 0), 0)
            props = meta.get("deviceProperties")
            if isinstance(props, list):
                result.device_properties = props
            read.events(event_blocks(fh, head, path), result.flops)
    except (TraceDamaged, EOFError, OSError) as exc:
        result.partial = True
        result.error = f"trace damaged after {read.seen} events: {exc}"
    if read.seen == 0 and result.partial:
        raise TraceError(f"{path}: no event could be read ({result.error})")
    rows = read.rows
    if read.skipped.items and not len(rows):
        raise TraceError(f"{path}: no usable event: {read.skipped}")
    result.events_seen = read.seen
    result.skipped = read.skipped.as_record()
    if read.memory.peak:
        device, peak = max(read.memory.peak.items(), key=lambda kv: kv[1])
        result.memory_peak_bytes = peak
        result.memory_total_bytes = next(
            (p.get("totalGlobalMem") for p in result.device_properties if p.get("id") == device), None)

    devices = Counter(d for d in compress(rows.device, rows.gpu) if d >= 0)
    result.gpu_name = _gpu_name(result.device_properties, devices.most_common(1)[0][0] if devices else None)
    result.rounded = read.any_float
    result.sync_events = rows.kind.count(SYNC_CODE)
    rows.whole_times(rounded=read.any_float)
    keep = range(len(rows))
    if len(read.steps) >= 2:
        keep = _before_last_step(rows, read.steps, read.cpu_corr_ts, read.any_float)
        result.last_step_dropped = True
    result.events = EventList.in_start_order(rows, keep, nested=cpu_ops)
    return result


class _Read:
    """One pass over a trace's events: the rows kept, with raw times, and what the loading rules
    need of the whole trace (any float time; the profiler steps; each correlation's first CPU
    time), the memory peaks, and the items skipped."""

    def __init__(self, cpu_ops: bool) -> None:
        self.cpu_ops = cpu_ops
        self.any_float = False
        self.steps: dict[str, list[float]] = {}
        self.cpu_corr_ts: dict[int, float] = {}
        self.rows = Columns()
        self.memory = _MemoryPeaks()
        self.skipped = Skipped()
        self.seen = 0

    def events(self, blocks: Iterator[Iterable[Event]], flops: dict[str, int]) -> None:
        """The hot loop of the analysis (one pass per event): kept flat on purpose, its locals in
        local variables; a CPU operator it may keep is left to a call."""
        kinds, no_args, rows, steps, cpu_corr_ts = KIND_BY_CAT, NO_ARGS, self.rows, self.steps, self.cpu_corr_ts
        names: dict[str, str] = {}
        tids: dict[Any, int] = {}
        seen, any_float, keep_all = self.seen, self.any_float, self.cpu_ops
        try:
            for block in blocks:
                for e in block:
                    seen += 1
                    ts = e.ts
                    if ts is None or type(ts) is float:
                        any_float = True  # (an item that is not an object too, as HTA reads it)
                    cat = e.cat
                    if ts is None or cat is None or cat == "Trace" or e.dur is None:
                        if e.name == "[memory]":
                            self.memory.add(e.args or no_args)
                        elif type(e) is Unusable:
                            self.skipped.add(seen - 1, e.why)
                        continue
                    args = e.args or no_args
                    stream = args.stream
                    stream = stream if type(stream) is int else to_int(stream)
                    corr = args.correlation
                    corr = corr if type(corr) is int else to_int(corr)
                    name = e.name
                    name = name if type(name) is str else ("" if name is None else str(name))
                    # (endswith first: hashing every CPU operator's long name for the set costs more)
                    gpu_side = (stream >= 0 and corr >= 0) or (name.endswith("Sync")
                                                                and name in DEVICE_SYNC_NAMES)
                    kind = kinds.get(cat)
                    if not gpu_side:
                        if "ProfilerStep" in name:
                            steps.setdefault(name, []).append(ts)
                        if corr >= 0:
                            first_ts = cpu_corr_ts.get(corr)
                            if first_ts is None or ts < first_ts:
                                cpu_corr_ts[corr] = ts
                        if kind is None and stream < 0:
                            continue  # flow events, python functions...: not used by the analysis
                        if kind == "cpu_op" or kind == "annotation":
                            if args.flops is None and not keep_all and "ProfilerStep" not in name \
                                    and "DataLoader" not in name and cat != "gpu_user_annotation":
                                continue  # CPU ops the analysis does not use
                            self._cpu_op(e, kind, name, args, stream, corr, flops, names, tids)
                            continue
                    rows.add(e, kind, name, args, stream, corr, gpu_side, names, tids)
        finally:
            self.seen, self.any_float = seen, any_float

    def _cpu_op(self, e: Event, kind: str, name: str, args: Args, stream: int, corr: int, flops: dict[str, int],
                names: dict[str, str], tids: dict[Any, int]) -> None:
        """A CPU operator or annotation: kept if it counts its FLOPs (for the roofline), if the
        analyses read it (profiler steps, data loading, the GPU's annotations) or if every CPU
        operator is kept (``cpu_ops``)."""
        op = _add_flops(flops, args.flops, args.input_type) if kind == "cpu_op" and args.flops is not None else None
        if op is not None:
            self.rows.add(e, kind, name, args, stream, corr, False, names, tids)
            self.rows.extras[len(self.rows) - 1] = {
                "flops": op[0], "precision": op[1], "op_bytes": operator_bytes(name, args.input_dims, args.input_type)}
        elif self.cpu_ops or "ProfilerStep" in name or "DataLoader" in name or e.cat == "gpu_user_annotation":
            self.rows.add(e, kind, name, args, stream, corr, False, names, tids)


def _before_last_step(rows: Columns, steps: dict[str, list[float]], cpu_corr_ts: dict[int, float],
                      rounded: bool) -> list[int]:
    """The rows HTA keeps when the last profiler step is dropped: CPU-side events that start
    before it, GPU-side events launched by a CPU-side event that does."""
    start_of = math.ceil if rounded else (lambda ts: ts)
    last_step_start = max(start_of(ts) for starts in steps.values() for ts in starts)
    # The launches of the last step, a few among all: fewer to collect than those kept. (A raw
    # time is before the rounded start L, an integer, if its ceiling is: if it is <= L - 1.)
    after = last_step_start - 1 if rounded else last_step_start
    dropped = {c for c, ts in cpu_corr_ts.items() if (ts > after if rounded else ts >= after)}
    return [i for i, (gpu, corr, ts) in enumerate(zip(rows.gpu, rows.correlation, rows.ts))
            if ((corr not in dropped and corr in cpu_corr_ts) if gpu else ts < last_step_start)]


class _MemoryPeaks:
    """Peak allocated bytes per CUDA device from ``[memory]`` instant events: their
    ``Total Allocated`` where the profiler writes it, else the running sum of ``Bytes``."""

    CUDA = 1

    def __init__(self) -> None:
        self.current: dict[int, int] = {}
        self.peak: dict[int, int] = {}

    def add(self, args: Args) -> None:
        if to_int(args.device_type, -1) != self.CUDA:
            return
        device = to_int(args.device_id, -1)
        if args.total_allocated is not None:
            now = to_int(args.total_allocated, 0)
        else:
            now = self.current.get(device, 0) + to_int(args.alloc_bytes, 0)
        self.current[device] = now
        if now > self.peak.get(device, -1):
            self.peak[device] = now


# The profiler's names of input types -> the precision whose peak an operator is measured against.
_PRECISION = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "double": "fp64",
              "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
              "c10::Float8_e5m2fnuz": "fp8"}


def _add_flops(flops: dict[str, int], count: Any, input_types: Any) -> tuple[int, str] | None:
    """An operator's FLOPs, added under the precision of its first floating-point input
    ("unknown" where the profiler did not record input types); returns (FLOPs, precision), or
    None for a count that is not a positive number."""
    if type(count) is not int or count <= 0:
        if not (type(count) is float and 0 < count < 2**63):
            return None
        count = int(count)
    precision = "unknown"
    if type(input_types) is list:
        precision = next((_PRECISION[t] for t in input_types if type(t) is str and t in _PRECISION), "unknown")
    flops[precision] = flops.get(precision, 0) + count
    return count, precision


# Bytes per element of the profiler's input types.
_ELEMENT_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
                  "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1,
                  "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1}
# Operators whose output shape follows from their inputs': name -> the output's element count.
_OUTPUT_ELEMENTS = {
    "aten::mm": lambda d: d[0][0] * d[1][1],
    "aten::addmm": lambda d: d[1][0] * d[2][1],
    "aten::bmm": lambda d: d[0][0] * d[0][1] * d[1][2],
    "aten::baddbmm": lambda d: d[1][0] * d[1][1] * d[2][2],
    "aten::add": lambda d: math.prod(d[0]),
    "aten::mul": lambda d: math.prod(d[0]),
}


def operator_bytes(name: str, raw_dims: msgspec.Raw, input_types: Any) -> int | None:
    """The memory an operator moves at least: its input tensors, and its output where its
    shape follows from theirs (``record_shapes=True``); None without shapes."""
    if not raw_dims:
        return None
    try:
        dims = any_decoder.decode(raw_dims)
    except msgspec.DecodeError:
        return None
    if type(dims) is not list or type(input_types) is not list:
        return None
    total, first = 0, None
    for shape, dtype in zip(dims, input_types):
        size = _ELEMENT_BYTES.get(dtype) if type(dtype) is str else None
        if size is None or type(shape) is not list or not shape or not all(type(x) is int and x >= 0 for x in shape):
            continue
        total += size * math.prod(shape)
        first = first or size
    output = _OUTPUT_ELEMENTS.get(name)
    if output is not None and first is not None:
        try:
            total += first * output(dims)
        except (IndexError, TypeError):
            pass
    return total or None


def _gpu_name(properties: list[dict], device: int | None) -> str | None:
    """The name of ``device`` in the trace's deviceProperties (its first GPU's where unknown)."""
    named = [p for p in properties if isinstance(p, dict) and isinstance(p.get("name"), str)]
    for p in named:
        if p.get("id") == device:
            return escaped(p["name"])
    return escaped(named[0]["name"]) if named else None


