"""Reads a PyTorch profiler (Kineto) trace file into the time-ordered event records the
trace analysis consumes, with Holistic Trace Analysis' loading rules.

Streams the JSON (``.json`` or ``.json.gz``) in blocks instead of loading the document:
only the events the analysis needs are kept, as small dicts with interned names. Loading
rules (HTA 0.5.0):

* events without ``dur`` or ``cat`` (and the ``Trace`` envelope) are ignored;
* if any event has a float (or missing) ``ts``, every event is rounded to whole
  microseconds: ``end = floor(ts + dur)``, ``ts = ceil(ts)``;
* with at least two distinct ``ProfilerStep`` names, the last step is dropped: CPU-side
  events are kept only if they start before the last ProfilerStep starts, GPU-side events
  only if their correlation id matches a kept CPU-side event.

A trace damaged part-way (truncated, invalid JSON) yields what was valid before the damage,
with ``partial`` set and the parser's error; it never raises for that.
"""

from __future__ import annotations

import gc
import math
import re
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from operator import itemgetter
from pathlib import Path
from typing import IO, Annotated, Any, Self

import msgspec
from zlib_ng import zlib_ng

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


class TraceError(ValueError):
    """A trace file that cannot be read at all (missing, not JSON, no traceEvents)."""


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

    def memory(self) -> dict | None:
        if self.memory_peak_bytes is None:
            return None
        return {"peak_bytes": self.memory_peak_bytes, "total_bytes": self.memory_total_bytes}


def open_trace(path: str | Path) -> IO[bytes]:
    path = Path(path)
    if not path.exists():
        raise TraceError(f"no trace file at {path}")
    with path.open("rb") as probe:
        gz = probe.read(2) == b"\x1f\x8b"
    return _Gunzip(path) if gz else path.open("rb")


class _Gunzip:
    """A gzip file read through zlib-ng's decompressor (3-4x the standard zlib's speed), in
    ``read(n)`` steps, members one after another as ``gzip.open`` reads them. Not zlib-ng's
    ``gzip_ng.open``: importing it (argparse, shutil, bz2, lzma) takes longer than reading
    a small trace. Raises ``EOFError`` for a file cut short, ``TraceDamaged`` for corrupt data."""

    CHUNK = 1 << 16

    def __init__(self, path: Path) -> None:
        self._raw = path.open("rb")
        self._inflate = zlib_ng.decompressobj(wbits=31)  # 31: a gzip header and trailer
        self._pending = b""  # compressed input not yet given to the decompressor

    def read(self, n: int = -1) -> bytes:
        """At most ``n`` bytes (all that is left when ``n`` < 0); b"" at the end."""
        if n < 0:
            return b"".join(iter(lambda: self.read(self.CHUNK), b""))
        if n == 0:
            return b""
        while True:
            d = self._inflate
            if d.eof:  # one member done: another may follow (zero padding is skipped, as gzip does)
                rest = (d.unused_data + self._pending).lstrip(b"\0")
                self._pending = b""
                while not rest:
                    chunk = self._raw.read(self.CHUNK)
                    if not chunk:
                        return b""
                    rest = chunk.lstrip(b"\0")
                if rest[:2] != b"\x1f\x8b":
                    raise TraceDamaged("data after the end of the gzip stream")
                self._inflate = d = zlib_ng.decompressobj(wbits=31)
                self._pending = rest
            data = d.unconsumed_tail or self._pending or self._raw.read(self.CHUNK)
            self._pending = b""
            if not data:
                raise EOFError("Compressed file ended before the end-of-stream marker was reached")
            try:
                out = d.decompress(data, n)
            except zlib_ng.error as exc:
                raise TraceDamaged(f"corrupt gzip data: {exc}") from exc
            if out:
                return out

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _metadata(head: bytes, path: Path) -> dict[str, Any]:
    """Top-level entries before ``traceEvents`` (Kineto writes its metadata first), from the
    file's first bytes ``head``. Kineto's metadata is a few kB at the top: what precedes the
    traceEvents key, closed with a brace, is the metadata object. Anything else is streamed
    with ijson."""
    anchor = head.find(b'"traceEvents"')
    if anchor > 0:
        try:
            meta = _any_decoder.decode(head[:anchor].rstrip(b" \t\r\n").rstrip(b",") + b"}")
        except msgspec.DecodeError:
            meta = None
        if type(meta) is dict:
            return meta
    return _metadata_streamed(path)


def _metadata_streamed(path: Path) -> dict[str, Any]:
    import ijson  # only for traces not in Kineto's layout: a few ms less start-up for the others

    meta: dict[str, Any] = {}
    with open_trace(path) as fh:
        builder: ijson.ObjectBuilder | None = None
        key = None
        try:
            for prefix, event, value in ijson.parse(fh, use_float=True):
                if prefix == "" and event == "map_key":
                    if value == "traceEvents":
                        break
                    key, builder = value, ijson.ObjectBuilder()
                elif builder is not None and key is not None:
                    builder.event(event, value)
                    if prefix == key and event in ("end_map", "end_array", "string", "number", "boolean", "null"):
                        meta[key] = builder.value
                        key, builder = None, None
        except (ijson.JSONError, UnicodeDecodeError, EOFError, OSError) as exc:
            raise TraceError(f"{path} is not a readable JSON trace: {exc}") from exc
    return meta


def _int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # not a number, or inf
        return default


class TraceDamaged(ValueError):
    """The trace stops making sense part-way (truncated or corrupt)."""


class Args(msgspec.Struct, gc=False):
    """The part of an event's ``args`` the analysis reads; the rest (shapes, call stacks) is
    skipped by the parser without building it."""

    stream: Any = -1  # the defaults of HTA's reading: -1 when absent
    correlation: Any = -1
    device: Any = -1
    bytes: Any = -1
    device_type: Any = msgspec.field(default=None, name="Device Type")  # [memory] events
    device_id: Any = msgspec.field(default=None, name="Device Id")
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    alloc_bytes: Any = msgspec.field(default=None, name="Bytes")
    flops: Any = None  # CPU operators, where the profiler ran with_flops=True
    input_type: Any = msgspec.field(default=None, name="Input type")  # with record_shapes=True
    bandwidth: Any = msgspec.field(default=None, name="memory bandwidth (GB/s)")  # copies and sets
    # with record_shapes=True: kept unparsed, read only for the operators that count FLOPs
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")


# A time in microseconds the analysis can place: a number below 2**53 (285 years) either way.
_Time = Annotated[int, msgspec.Meta(gt=-(2**53), lt=2**53)] | Annotated[float, msgspec.Meta(gt=-(2.0**53), lt=2.0**53)]


class Event(msgspec.Struct, gc=False):
    """One item of ``traceEvents``, the fields the analysis reads. The parser checks the types
    (in C, at no cost to speak of): an event whose time is a string or 1e300, or whose
    category is not a name, is read as an event without them, which the analysis skips."""

    name: Any = ""
    cat: str | None = None
    tid: Any = None
    ts: _Time | None = None
    dur: _Time | None = None
    args: Args | None = None




_NO_ARGS = Args()
_block_decoder = msgspec.json.Decoder(list[Event])
_any_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


def _typed(items: Iterable[Any]) -> Iterator[Event | None]:
    """Generic JSON items as Events (None for an item that is not an object). An ``args``
    that is not an object counts as no args."""
    for item in items:
        if type(item) is not dict:
            yield None
            continue
        args = item.get("args")
        if type(args) is dict and "Input Dims" in args:  # kept unparsed, as the Kineto reader keeps it
            item = {**item, "args": {**args, "Input Dims": msgspec.Raw(_encoder.encode(args["Input Dims"]))}}
        try:
            yield msgspec.convert(item, Event)
        except msgspec.ValidationError:
            try:
                yield msgspec.convert({k: v for k, v in item.items() if k != "args"}, Event)
            except msgspec.ValidationError:  # a time or category of the wrong type
                yield Event(name=item.get("name", ""))


_EVENT_START, _EVENT_END = b"\n  {", b"\n  }"
_LAST_EVENT = re.compile(rb"\n  \}[ \t\r\n]*\]")
_CLOSE = re.compile(rb"[, \t\r\n]*\]")


def _event_blocks(fh: IO[bytes], head: bytes, path: Path) -> Iterator[Iterable[Event | None]]:
    """The items of ``traceEvents``, a block at a time (a loop over blocks and then over a
    block's list costs less than resuming a generator per event). Kineto pretty-prints each
    event as a block from a line ``  {`` to a line ``  }``: such files are split on those
    lines and parsed with msgspec into ``Event``s, reading only the fields the analysis uses
    (about 2x faster than parsing whole events with orjson, 6x than a streaming parser); any
    other layout goes through ijson, as one block. ``head``: the bytes already read from ``fh``."""
    anchor = head.find(b'"traceEvents"')
    bracket = head.find(b"[", anchor) if anchor >= 0 else -1
    if bracket >= 0 and head[bracket + 1:].lstrip(b" \r\t").startswith(b"\n  {\n"):
        return _kineto_blocks(fh, head[bracket + 1:])
    return iter([_typed(_streamed_items(_HeadFirst(head, fh), path))])


def _streamed_items(fh: _HeadFirst, path: Path) -> Iterator[Any]:
    import ijson

    try:
        yield from ijson.items(_trace_shaped(ijson.parse(fh, use_float=True), path), "traceEvents.item")
    except (ijson.JSONError, UnicodeDecodeError) as exc:  # IncompleteJSONError too; text not UTF-8
        raise TraceDamaged(f"invalid JSON: {exc}") from exc


_JSON_TYPE = {"start_map": "an object", "start_array": "an array", "string": "a string", "number": "a number",
              "boolean": "a boolean", "null": "null"}


def _trace_shaped(events: Iterator[tuple[str, str, Any]], path: Path) -> Iterator[tuple[str, str, Any]]:
    """ijson's parse events of a document that has the shape of a trace: an object whose
    ``traceEvents`` is a list. Other JSON raises TraceError: read as a trace, it would be an
    empty one, and its analysis would report nothing wrong with a file that holds no trace."""
    for prefix, event, value in events:
        yield prefix, event, value
        if prefix == "" and event != "map_key" and event != "end_map":
            if event != "start_map":
                raise TraceError(f"{path} is not a trace: the top level is {_JSON_TYPE[event]}, where a "
                                 "PyTorch profiler trace is an object with a traceEvents list")
        elif prefix == "traceEvents" and event != "end_array":
            if event != "start_array":
                raise TraceError(f"{path} is not a trace: traceEvents is {_JSON_TYPE[event]}, "
                                 "where a PyTorch profiler trace has a list of events")
            yield from events  # the rest, unchecked
            return
    raise TraceError(f"{path} is not a trace: it has no traceEvents list")


def _kineto_blocks(fh: IO[bytes], head: bytes, block: int = 1 << 16) -> Iterator[Iterable[Event | None]]:
    """Events of a Kineto layout, a block of the file at a time: the complete events of each
    block are parsed in one call, as a JSON array framed in place (no copy of the block: the
    blank before the first event's brace becomes ``[`` and the byte after the last one's,
    a separator, ``]`` for the parse). ``traceEvents`` ends where an event's ``  }`` is
    followed by ``]`` (after it, top-level objects close with ``  }`` lines too); a block
    holding that end does not parse as an array, so the end is searched for only in a block
    that fails to parse (a full scan of every block would cost a tenth of the whole read)."""
    buf = bytearray(head)
    eof = False
    while True:
        if _CLOSE.match(buf):
            return
        first = buf.find(_EVENT_START)
        last = buf.rfind(_EVENT_END)
        if first >= 0 and last > first:
            events = _framed(buf, first + 2, last + 4)
            if events is None:
                m = _LAST_EVENT.search(buf)
                if m is not None and m.start() < first:  # an event's end, but no event began
                    raise TraceDamaged("an event of traceEvents is cut short")
                if m is not None:
                    last = m.start()
                events = _events_of(bytes(buf[first + 1:last + 4]))
            yield events
            del buf[:last + 4]
            continue
        if _LAST_EVENT.search(buf):  # the end of traceEvents after a part of an event
            raise TraceDamaged("an event of traceEvents is cut short")
        if eof:
            raise TraceDamaged("the file ends inside traceEvents")
        chunk = fh.read(block)
        eof = not chunk
        buf += chunk


def _framed(buf: bytearray, start: int, end: int) -> list[Event] | None:
    """The events of ``buf[start:end]`` (from a blank before an event's ``{`` to just after
    the ``}`` of a later one), or None if that is not a list of events."""
    after = buf[end] if end < len(buf) else None
    buf[start] = 0x5B  # [
    if after is None:
        buf.append(0x5D)  # ]
    else:
        buf[end] = 0x5D
    try:
        # (a copy, 64 KiB: the events' unparsed Input Dims refer to what they were parsed from)
        return _block_decoder.decode(bytes(memoryview(buf)[start:end + 1]))
    except msgspec.DecodeError:
        return None
    finally:
        buf[start] = 0x20
        if after is None:
            del buf[end]
        else:
            buf[end] = after


def _events_of(body: bytes) -> Iterator[Event | None]:
    """Events of a block that did not parse as a list of events: generically if its items
    are not all event objects, else one by one up to the damage."""
    try:
        return _typed(_any_decoder.decode(b"[" + body + b"]"))
    except msgspec.DecodeError:
        return _one_by_one(body)


def _one_by_one(body: bytes) -> Iterator[Event | None]:
    """The events of ``body`` up to the first that does not parse; text between events other
    than commas and blanks (a part of an event whose start is lost) is damage too."""
    pos = 0
    while pos < len(body):
        i = body.find(b"{", pos)
        if i < 0 or body[pos:i].strip(b", \t\r\n"):
            if i < 0 and not body[pos:].strip(b", \t\r\n"):
                return
            raise TraceDamaged("text between events that is not an event")
        j = body.find(_EVENT_END, i)
        end = len(body) if j < 0 else j + 4
        try:
            yield from _typed([_any_decoder.decode(body[i:end])])
        except msgspec.DecodeError as exc:
            raise TraceDamaged(f"invalid event: {exc}") from exc
        pos = end


class _HeadFirst:
    """A file object that first returns bytes already read from it."""

    def __init__(self, head: bytes, fh: IO[bytes]) -> None:
        self.head, self.fh = head, fh

    def read(self, n: int = -1) -> bytes:
        if n == 0:  # ijson probes the file with read(0)
            return b""
        if self.head:
            out, self.head = self.head, b""
            return out
        return self.fh.read(n)


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


def read_trace(path: str | Path) -> TraceRead:
    """Read ``path`` with HTA's loading rules; see the module docstring."""
    path = Path(path)
    result = TraceRead(str(path))

    # One pass: candidate records with raw times, plus what the loading rules need globally.
    any_float = False
    steps: dict[str, list[float]] = {}
    cpu_corr_ts: dict[int, float] = {}
    names: dict[str, str] = {}
    tids: dict[Any, int] = {}
    rows = _Columns()
    memory = _MemoryPeaks()
    seen = 0
    try:
        with open_trace(path) as fh, no_cycle_collection():
            head = fh.read(1 << 16)  # a file cut short or corrupt here: no event read, a TraceError below
            meta = _metadata(head, path)
            info = meta.get("distributedInfo")
            if isinstance(info, dict):
                result.rank = _int(info.get("rank", 0), 0)
            props = meta.get("deviceProperties")
            if isinstance(props, list):
                result.device_properties = props
            # The hot loop of the analysis (one pass per event): kept flat on purpose.
            kinds, no_args = KIND_BY_CAT, _NO_ARGS
            for block in _event_blocks(fh, head, path):
                for e in block:
                    seen += 1
                    if e is None:  # not an object
                        any_float = True
                        continue
                    ts = e.ts
                    if ts is None or type(ts) is float:
                        any_float = True
                    cat = e.cat
                    if ts is None or cat is None or cat == "Trace" or e.dur is None:
                        if e.name == "[memory]":
                            memory.add(e.args or no_args)
                        continue
                    args = e.args or no_args
                    stream = args.stream
                    if type(stream) is not int:
                        stream = _int(stream)
                    corr = args.correlation
                    if type(corr) is not int:
                        corr = _int(corr)
                    name = e.name
                    if type(name) is not str:
                        name = "" if name is None else str(name)
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
                        op = None
                        if kind == "cpu_op" and args.flops is not None:
                            op = _add_flops(result.flops, args.flops, args.input_type)
                        if (kind == "cpu_op" or kind == "annotation") and op is None \
                                and "ProfilerStep" not in name and "DataLoader" not in name \
                                and cat != "gpu_user_annotation":
                            continue  # CPU ops the analysis does not use
                        if op is not None:  # an operator that counts its FLOPs: kept for the roofline
                            rows.add(e, kind, name, args, stream, corr, False, names, tids)
                            rows.extras[len(rows) - 1] = {
                                "flops": op[0], "precision": op[1],
                                "op_bytes": operator_bytes(name, args.input_dims, args.input_type)}
                            continue
                    rows.add(e, kind, name, args, stream, corr, gpu_side, names, tids)
    except (TraceDamaged, EOFError, OSError) as exc:
        result.partial = True
        result.error = f"trace damaged after {seen} events: {exc}"
    if seen == 0 and result.partial:
        raise TraceError(f"{path}: no event could be read ({result.error})")
    result.events_seen = seen
    if memory.peak:
        device, peak = max(memory.peak.items(), key=lambda kv: kv[1])
        result.memory_peak_bytes = peak
        result.memory_total_bytes = next(
            (p.get("totalGlobalMem") for p in result.device_properties if p.get("id") == device), None)

    devices = Counter(rows.device[i] for i in range(len(rows)) if rows.gpu[i] and rows.device[i] >= 0)
    result.gpu_name = _gpu_name(result.device_properties, devices.most_common(1)[0][0] if devices else None)
    result.rounded = any_float
    ts_col, dur_col = rows.ts, rows.dur
    if any_float:
        ceil, floor = math.ceil, math.floor
        for i in range(len(rows)):
            start = ceil(ts_col[i])
            dur_col[i] = floor(ts_col[i] + dur_col[i]) - start
            ts_col[i] = start
    keep = range(len(rows))
    if len(steps) >= 2:
        start_of = math.ceil if any_float else (lambda ts: ts)
        last_step_start = max(start_of(ts) for starts in steps.values() for ts in starts)
        kept = {c for c, ts in cpu_corr_ts.items() if start_of(ts) < last_step_start}
        result.last_step_dropped = True
        corr_col, gpu_col = rows.correlation, rows.gpu
        keep = [i for i in keep if (corr_col[i] in kept if gpu_col[i] else ts_col[i] < last_step_start)]
    # In start order, CPU-side before GPU-side at the same start: CPU events first, then a
    # stable sort on the start alone (a C-level key, several times faster than a tuple key).
    stream_col = rows.stream
    order = [i for i in keep if stream_col[i] < 0] + [i for i in keep if stream_col[i] >= 0]
    order.sort(key=ts_col.__getitem__)
    result.events = EventList(rows, array("q", order), whole_ts=True, whole_dur=any_float or not rows.float_dur)
    return result


class _MemoryPeaks:
    """Peak allocated bytes per CUDA device from ``[memory]`` instant events: their
    ``Total Allocated`` where the profiler writes it, else the running sum of ``Bytes``."""

    CUDA = 1

    def __init__(self) -> None:
        self.current: dict[int, int] = {}
        self.peak: dict[int, int] = {}

    def add(self, args: Args) -> None:
        if _int(args.device_type, -1) != self.CUDA:
            return
        device = _int(args.device_id, -1)
        if args.total_allocated is not None:
            now = _int(args.total_allocated, 0)
        else:
            now = self.current.get(device, 0) + _int(args.alloc_bytes, 0)
        self.current[device] = now
        if now > self.peak.get(device, -1):
            self.peak[device] = now


# Event kinds as stored, by code.
_KINDS = ("other", "kernel", "memcpy", "memset", "sync", "runtime", "cpu_op", "annotation")
_KIND_CODE = {k: i for i, k in enumerate(_KINDS)}


class _Columns:
    """The kept events, a column each: ~70 bytes an event, where a dict of its fields takes
    ~800 (the records of a trace that is mostly kernels and launches took three times HTA's
    memory). Times are doubles, exact for every time the reader accepts (|t| < 2**53 us, the
    parser's own floats); the rare fields (a copy's bytes and bandwidth, an operator's FLOPs)
    are kept apart, per row."""

    def __init__(self) -> None:
        self.kind, self.gpu = array("B"), array("B")
        self.cat: list[str | None] = []
        self.name: list[str] = []
        self.ts, self.dur = array("d"), array("d")
        self.stream, self.device, self.correlation, self.tid = array("q"), array("q"), array("q"), array("q")
        self.extras: dict[int, dict] = {}
        self.float_dur = False

    def __len__(self) -> int:
        return len(self.kind)

    def add(self, e: Event, kind: str | None, name: str, args: Args, stream: int, correlation: int, gpu_side: bool,
            names: dict[str, str], tids: dict[Any, int]) -> None:
        dur = e.dur
        if type(dur) is float:
            self.float_dur = True
        device, nbytes = args.device, args.bytes
        if type(device) is not int:
            device = _int(device)
        if type(nbytes) is not int:
            nbytes = _int(nbytes)
        name = names.setdefault(name, name)
        cat = e.cat
        self.kind.append(_KIND_CODE.get(kind, 0))
        self.gpu.append(gpu_side)
        self.cat.append(names.setdefault(cat, cat))
        self.name.append(name)
        self.ts.append(e.ts)
        self.dur.append(dur)
        self.stream.append(stream)
        self.device.append(device)
        self.correlation.append(correlation)
        self.tid.append(-1 if stream >= 0 else _tid(e.tid, tids))  # the CPU thread: where an operator launched a kernel
        if kind == "memcpy" or kind == "memset" or nbytes >= 0:
            self.extras[len(self.kind) - 1] = {
                "bytes": nbytes if nbytes >= 0 else None,
                "bandwidth_gbps": _bandwidth(args.bandwidth) if kind == "memcpy" or kind == "memset" else None,
                "memcpy_kind": name[len("Memcpy "):] if kind == "memcpy" and name.startswith("Memcpy ") else None}


class EventList(Sequence):
    """The events of a trace in start order, each a dict made when it is read (the fields of
    ``KernelEvent``: ``end`` = ``ts`` + ``dur``; a copy's ``bytes``, ``bandwidth_gbps`` and
    ``memcpy_kind`` and an operator's ``flops``, ``precision`` and ``op_bytes`` only where
    they are known). Iterate once to analyse: indexing makes a new dict each time."""

    CHUNK = 4096

    def __init__(self, rows: _Columns, order: array, whole_ts: bool, whole_dur: bool) -> None:
        self._rows, self._order = rows, order
        self._whole_ts, self._whole_dur = whole_ts, whole_dur

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self) -> Iterator[dict]:
        """The events in order, ``CHUNK`` at a time: each column's values for a chunk are taken in
        one C-level call (``itemgetter``), so a dict costs little more than its making."""
        r = self._rows
        columns = (r.kind, r.cat, r.name, r.ts, r.dur, r.stream, r.device, r.correlation, r.tid)
        extras, kinds = r.extras, _KINDS
        whole_ts, whole_dur = self._whole_ts, self._whole_dur
        order = self._order
        for first in range(0, len(order), self.CHUNK):
            chunk = order[first:first + self.CHUNK]
            if len(chunk) == 1:
                values = [[column[chunk[0]]] for column in columns]
            else:
                pick = itemgetter(*chunk)
                values = [pick(column) for column in columns]
            kind, cat, name, ts, dur, stream, device, correlation, tid = values
            if whole_ts:
                ts = map(int, ts)
            if whole_dur:
                dur = map(int, dur)
            for i, k, c, n, t, d, s, dev, corr, th in zip(chunk, kind, cat, name, ts, dur, stream, device,
                                                          correlation, tid):
                e = {"kind": kinds[k], "cat": c, "name": n, "ts": t, "dur": d, "end": t + d, "stream": s,
                     "device": dev, "correlation": corr, "tid": th}
                if extras:
                    x = extras.get(i)
                    if x is not None:
                        e.update(x)
                yield e

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        one = EventList(self._rows, self._order[index:index + 1], self._whole_ts, self._whole_dur)
        return next(iter(one))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"EventList({len(self)} events)"


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
        dims = _any_decoder.decode(raw_dims)
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
            return p["name"]
    return named[0]["name"] if named else None


def _tid(value: Any, tids: dict[Any, int]) -> int:
    """A thread as a number: the profiler's number, or the order in which a named thread
    (``"stream 7"``, ``"25738"`` as a string in older traces) was first seen, from 1 << 40."""
    if type(value) is int:
        return value
    if value is None:
        return -1
    known = tids.get(value)
    if known is None:
        text = str(value)
        known = tids[value] = int(text) if text.isdigit() and len(text) < 16 else (1 << 40) + len(tids)
    return known


def _bandwidth(value: Any) -> float | None:
    """The profiler's bandwidth of a copy (GB/s): a finite number, else None."""
    if type(value) is not float and type(value) is not int:
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None
