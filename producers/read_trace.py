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

import gzip
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import ijson
import orjson

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


@dataclass
class TraceRead:
    path: str
    rank: int = 0
    events: list[dict] = field(default_factory=list)  # sorted by (ts, CPU before GPU)
    events_seen: int = 0
    last_step_dropped: bool = False
    rounded: bool = False
    partial: bool = False
    error: str | None = None
    device_properties: list[dict] = field(default_factory=list)
    memory_peak_bytes: int | None = None  # highest allocated on any GPU, from the profiler's memory events
    memory_total_bytes: int | None = None  # that GPU's memory

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
    return gzip.open(path, "rb") if gz else path.open("rb")


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Top-level entries before ``traceEvents`` (Kineto writes its metadata first)."""
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
        except (ijson.JSONError, EOFError, OSError) as exc:
            raise TraceError(f"{path} is not a readable JSON trace: {exc}") from exc
    return meta


def _as_int(value: Any) -> int:
    """``value`` as an int (-1 if it is none), without a try for the common case."""
    return value if type(value) is int else _int(value)


def _int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


class TraceDamaged(ValueError):
    """The trace stops making sense part-way (truncated or corrupt)."""


_EVENT_START, _EVENT_END = b"\n  {", b"\n  }"
_LAST_EVENT = re.compile(rb"\n  \}[ \t\r\n]*\]")


def _events(fh: IO[bytes]) -> Iterator[dict]:
    """The items of ``traceEvents``. Kineto pretty-prints each event as a block from a line
    ``  {`` to a line ``  }``: such files are split on those lines and each event parsed with
    orjson (about 3x faster than a streaming parser); any other layout goes through ijson."""
    head = fh.read(1 << 16)
    anchor = head.find(b'"traceEvents"')
    bracket = head.find(b"[", anchor) if anchor >= 0 else -1
    if bracket >= 0 and head[bracket + 1:].lstrip(b" \r\t").startswith(b"\n  {\n"):
        return _kineto_blocks(fh, head[bracket + 1:])
    return ijson.items(_Prefixed(head, fh), "traceEvents.item", use_float=True)


def _kineto_blocks(fh: IO[bytes], buf: bytes, block: int = 1 << 16) -> Iterator[dict]:
    """Events of a Kineto layout, a block of the file at a time: the complete events of each
    block are parsed in one orjson call (as a JSON array: they are separated by commas);
    a block that does not parse is parsed event by event, so that every good event before
    the damage is still read. ``traceEvents`` ends where an event's ``  }`` is followed by ``]``
    (after it, top-level objects close with ``  }`` lines too)."""
    eof = False
    while True:
        m = _LAST_EVENT.search(buf)
        close = m.start() if m else -1
        first = buf.find(_EVENT_START)
        last = close if m else buf.rfind(_EVENT_END)
        rest = buf
        if first >= 0 and last > first:
            body = buf[first + 1:last + 4]
            try:
                yield from orjson.loads(b"[" + body + b"]")
            except orjson.JSONDecodeError:
                yield from _one_by_one(body)
            rest = buf[last + 4:]
        if close >= 0:
            if rest.lstrip(b",\r\n \t")[:1] != b"]":
                raise TraceDamaged("an event of traceEvents is cut short")
            return
        if eof:
            raise TraceDamaged("the file ends inside traceEvents")
        chunk = fh.read(block)
        eof = not chunk
        buf = rest + chunk


def _one_by_one(body: bytes) -> Iterator[dict]:
    pos = 0
    i = body.find(b"{")
    while i >= 0:
        j = body.find(_EVENT_END, i)
        end = len(body) if j < 0 else j + 4
        try:
            yield orjson.loads(body[i:end])
        except orjson.JSONDecodeError as exc:
            raise TraceDamaged(f"invalid event: {exc}") from exc
        pos = end
        i = body.find(_EVENT_START, pos)
        i = -1 if i < 0 else i + 1


class _Prefixed:
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


def read_trace(path: str | Path) -> TraceRead:
    """Read ``path`` with HTA's loading rules; see the module docstring."""
    path = Path(path)
    meta = read_metadata(path)
    result = TraceRead(str(path))
    info = meta.get("distributedInfo")
    if isinstance(info, dict):
        result.rank = _int(info.get("rank", 0), 0)
    props = meta.get("deviceProperties")
    if isinstance(props, list):
        result.device_properties = props

    # One pass: candidate records with raw times, plus what the loading rules need globally.
    any_float = False
    steps: dict[str, list[float]] = {}
    cpu_corr_ts: dict[int, float] = {}
    names: dict[str, str] = {}
    candidates: list[tuple[dict, bool]] = []  # (record, GPU-side)
    memory = _MemoryPeaks()
    seen = 0
    try:
        with open_trace(path) as fh:
            # The hot loop of the analysis (one pass per event): kept flat on purpose.
            kinds = KIND_BY_CAT
            for e in _events(fh):
                seen += 1
                if type(e) is not dict:
                    any_float = True
                    continue
                ts = e.get("ts")
                if ts is None or type(ts) is float:
                    any_float = True
                cat = e.get("cat")
                if ts is None or cat is None or cat == "Trace" or e.get("dur") is None:
                    if e.get("name") == "[memory]":
                        memory.add(e.get("args") or {})
                    continue
                args = e.get("args") or {}
                stream = _as_int(args.get("stream", -1))
                corr = _as_int(args.get("correlation", -1))
                name = e.get("name", "")
                gpu_side = (stream >= 0 and corr >= 0) or name in DEVICE_SYNC_NAMES
                kind = kinds.get(cat)
                if not gpu_side:
                    if "ProfilerStep" in name:
                        steps.setdefault(name, []).append(ts)
                    if corr >= 0:
                        cpu_corr_ts[corr] = min(ts, cpu_corr_ts.get(corr, ts))
                    if kind is None and stream < 0:
                        continue  # flow events, python functions...: not used by the analysis
                    if (kind == "cpu_op" or kind == "annotation") and "ProfilerStep" not in name \
                            and "DataLoader" not in name:
                        continue  # CPU ops the analysis does not use
                candidates.append((_record(e, kind, name, args, stream, corr, names), gpu_side))
    except (ijson.JSONError, ijson.IncompleteJSONError, TraceDamaged, EOFError, OSError, gzip.BadGzipFile) as exc:
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

    result.rounded = any_float
    if any_float:
        for record, _ in candidates:
            end = math.floor(record["ts"] + record["dur"])
            record["ts"] = math.ceil(record["ts"])
            record["end"] = end
            record["dur"] = end - record["ts"]
    if len(steps) >= 2:
        start_of = math.ceil if any_float else (lambda ts: ts)
        last_step_start = max(start_of(ts) for starts in steps.values() for ts in starts)
        kept = {c for c, ts in cpu_corr_ts.items() if start_of(ts) < last_step_start}
        result.last_step_dropped = True
        result.events = [
            r for r, gpu_side in candidates
            if (r["correlation"] in kept if gpu_side else r["ts"] < last_step_start)
        ]
    else:
        result.events = [r for r, _ in candidates]
    result.events.sort(key=lambda r: (r["ts"], r["stream"] >= 0))
    return result


class _MemoryPeaks:
    """Peak allocated bytes per CUDA device from ``[memory]`` instant events: their
    ``Total Allocated`` where the profiler writes it, else the running sum of ``Bytes``."""

    CUDA = 1

    def __init__(self) -> None:
        self.current: dict[int, int] = {}
        self.peak: dict[int, int] = {}

    def add(self, args: dict) -> None:
        if _int(args.get("Device Type"), -1) != self.CUDA:
            return
        device = _int(args.get("Device Id"), -1)
        if "Total Allocated" in args:
            now = _int(args["Total Allocated"], 0)
        else:
            now = self.current.get(device, 0) + _int(args.get("Bytes"), 0)
        self.current[device] = now
        if now > self.peak.get(device, -1):
            self.peak[device] = now


def _record(e: dict, kind: str | None, name: str, args: dict, stream: int, correlation: int,
            names: dict[str, str]) -> dict:
    ts, dur = e["ts"], e["dur"]
    name = names.setdefault(name, name)
    nbytes = _as_int(args.get("bytes", -1))
    device = _as_int(args.get("device", -1))
    return {
        "kind": kind or "other",
        "cat": e["cat"],
        "name": name,
        "ts": ts,
        "dur": dur,
        "end": ts + dur,
        "stream": stream,
        "device": device,
        "correlation": correlation,
        "bytes": nbytes if nbytes >= 0 else None,
        "memcpy_kind": name[len("Memcpy "):] if kind == "memcpy" and name.startswith("Memcpy ") else None,
        "grid": _dims(args.get("grid")),
        "block": _dims(args.get("block")),
    }


def _dims(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return value
    return None
