"""The events a trace analysis keeps, in columns: ~70 bytes an event, where a dict of its
fields took ~800 (the records of a trace that is mostly kernels and launches took three times
HTA's memory). ``EventList`` gives them back in start order, a dict each as it is read."""

from __future__ import annotations

import math
import unicodedata
from array import array
from collections.abc import Iterable, Iterator, Sequence
from operator import add, itemgetter, sub
from typing import Any

from producers.traces.json_text import Args, Event, to_int

# Event kinds as stored, by code.
_KINDS = ("other", "kernel", "memcpy", "memset", "sync", "runtime", "cpu_op", "annotation")
_KIND_CODE = {k: i for i, k in enumerate(_KINDS)}
SYNC_CODE = _KIND_CODE["sync"]


class Columns:
    """The kept events, a column each. Times are read as doubles, exact for every time the
    reader accepts (|t| < 2**53 us; the parser's own floats), and made whole once all are read
    (``whole_times``); the rare fields (a copy's bytes and bandwidth, an operator's FLOPs) are
    kept apart, per row."""

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

    def whole_times(self, rounded: bool) -> None:
        """Times as whole microseconds, in 64-bit integer columns (events are made from them as
        they are, with no conversion per event): ``rounded``, HTA's rounding (``end = floor(ts +
        dur)``, ``ts = ceil(ts)``); else the times are whole already, and so are the durations
        unless one was a float (those stay as they are). Each a C-level pass over a column."""
        if rounded:
            starts = array("q", map(math.ceil, self.ts))
            self.dur = array("q", map(sub, map(math.floor, map(add, self.ts, self.dur)), starts))
            self.ts = starts
            return
        self.ts = array("q", map(int, self.ts))
        if not self.float_dur:
            self.dur = array("q", map(int, self.dur))

    def add(self, e: Event, kind: str | None, name: str, args: Args, stream: int, correlation: int, gpu_side: bool,
            names: dict[str, str], tids: dict[Any, int]) -> None:
        dur = e.dur
        if type(dur) is float:
            self.float_dur = True
        device, nbytes = args.device, args.bytes
        if type(device) is not int:
            device = to_int(device)
        if type(nbytes) is not int:
            nbytes = to_int(nbytes)
        shown = names.get(name)
        if shown is None:  # (each name once: the names of a trace are few)
            shown = names[name] = name if name.isprintable() else escaped(name)
        name = shown
        cat = e.cat
        tid = -1 if stream >= 0 else _tid(e.tid, tids)  # the CPU thread: where an operator launched a kernel
        try:  # the 64-bit columns first: an id beyond 64 bits (no profiler writes one) fails here
            self.stream.append(stream)
            self.device.append(device)
            self.correlation.append(correlation)
            self.tid.append(tid)
        except OverflowError:  # read as no id at all
            n = len(self.kind)
            for column, value in ((self.stream, stream), (self.device, device), (self.correlation, correlation),
                                  (self.tid, tid)):
                del column[n:]
                column.append(value if -_INT64 <= value < _INT64 else -1)
        self.kind.append(_KIND_CODE.get(kind, 0))
        self.gpu.append(gpu_side)
        self.cat.append(names.setdefault(cat, cat))
        self.name.append(name)
        self.ts.append(e.ts)
        self.dur.append(dur)
        if kind == "memcpy" or kind == "memset" or nbytes >= 0:
            self.extras[len(self.kind) - 1] = {
                "bytes": nbytes if nbytes >= 0 else None,
                "bandwidth_gbps": _bandwidth(args.bandwidth) if kind == "memcpy" or kind == "memset" else None,
                "memcpy_kind": name[len("Memcpy "):] if kind == "memcpy" and name.startswith("Memcpy ") else None,
                "trace_order": len(self.kind) - 1}
        elif kind == "sync" and args.wait_on_record is not None:
            self.extras[len(self.kind) - 1] = {"wait_on_stream": to_int(args.wait_on_stream),
                                               "wait_on_record": to_int(args.wait_on_record)}


_UNSHOWN = frozenset({"Cc", "Cf", "Zl", "Zp"})  # control, format (bidi overrides), line and paragraph separators


def escaped(name: str) -> str:
    """An event's name with the characters that would drive a terminal, reorder or break the
    lines it is shown in (an e-mail, a webhook's message, a report) as their escapes (``\\x1b``,
    ``\\n``, ``\\u202e``): a name is the training code's to choose. Every other character as it is
    (not ``schemas.validate_ids.printable``, which escapes a no-break space too: names stay as HTA
    reads them)."""
    return "".join(c.encode("unicode_escape").decode("ascii") if unicodedata.category(c) in _UNSHOWN else c
                   for c in name)


class EventList(Sequence):
    """The events of a trace in start order, each a dict made when it is read (the fields of
    ``KernelEvent``: ``end`` = ``ts`` + ``dur``; a copy's ``bytes``, ``bandwidth_gbps`` and
    ``memcpy_kind`` and an operator's ``flops``, ``precision`` and ``op_bytes`` only where
    they are known). Iterate once to analyse: indexing makes a new dict each time."""

    CHUNK = 4096

    def __init__(self, rows: Columns, order: array) -> None:
        self._rows, self._order = rows, order

    @classmethod
    def in_start_order(cls, rows: Columns, keep: Iterable[int], nested: bool = False) -> EventList:
        """``keep``'s rows in start order, CPU-side before GPU-side at the same start: CPU events
        first, then a stable sort on the start alone (a C-level key, several times faster than a
        tuple key). ``nested``: of CPU events that start together, the longer first (the one the
        others are nested in: a step and its first operator, an operator and its first call), for
        the analyses that follow the nesting (CPU events sorted by duration first: ~2 % more
        time, so only for them). Times are whole microseconds (``Columns.whole_times``)."""
        stream_col = rows.stream
        keep = list(keep)
        cpu = [i for i in keep if stream_col[i] < 0]
        if nested:
            cpu.sort(key=rows.dur.__getitem__, reverse=True)  # (stable: equal durations keep their order)
        order = cpu + [i for i in keep if stream_col[i] >= 0]
        order.sort(key=rows.ts.__getitem__)
        return cls(rows, array("q", order))

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self) -> Iterator[dict]:
        """The events in order, ``CHUNK`` at a time: each column's values for a chunk are taken in
        one C-level call (``itemgetter``), so a dict costs little more than its making."""
        r = self._rows
        columns = (r.kind, r.cat, r.name, r.ts, r.dur, r.stream, r.device, r.correlation, r.tid)
        extras, kinds = r.extras, _KINDS
        order = self._order
        for first in range(0, len(order), self.CHUNK):
            chunk = order[first:first + self.CHUNK]
            if len(chunk) == 1:
                values = [[column[chunk[0]]] for column in columns]
            else:
                pick = itemgetter(*chunk)
                values = [pick(column) for column in columns]
            kind, cat, name, ts, dur, stream, device, correlation, tid = values
            for i, k, c, n, t, d, s, dev, corr, th in zip(chunk, kind, cat, name, ts, dur, stream, device,
                                                          correlation, tid):
                e = {"kind": kinds[k], "cat": c, "name": n, "ts": t, "dur": d, "end": t + d, "stream": s,
                     "device": dev, "correlation": corr, "tid": th}
                if extras:
                    x = extras.get(i)
                    if x is not None:
                        e.update(x)
                yield e

    def column_chunks(self, size: int = CHUNK) -> Iterator[tuple[list, ...]]:
        """The events in order, ``size`` at a time, as columns: ``(kind, cat, name, ts, dur,
        stream, device, correlation, tid, extras)``, each a list but ``extras`` (the rare fields,
        by position in the chunk). What the trace analysis is fed (``streams.traces.batch``)."""
        r = self._rows
        columns = (r.cat, r.name, r.ts, r.dur, r.stream, r.device, r.correlation, r.tid)
        extras, kinds, order = r.extras, _KINDS, self._order
        for first in range(0, len(order), size):
            chunk = order[first:first + size]
            if len(chunk) == 1:
                values = [[column[chunk[0]]] for column in columns]
            else:
                pick = itemgetter(*chunk)
                values = [list(pick(column)) for column in columns]
            kind = [kinds[k] for k in (map(r.kind.__getitem__, chunk))]
            chunk_extras = {}
            if extras:
                chunk_extras = {pos: extras[i] for pos, i in enumerate(chunk) if i in extras}
            yield (kind, *values, chunk_extras)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        one = EventList(self._rows, self._order[index:index + 1])
        return next(iter(one))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"EventList({len(self)} events)"


_INT64 = 1 << 63


def _tid(value: Any, tids: dict[Any, int]) -> int:
    """A thread as a number: the profiler's number, or the order in which a named thread
    (``"stream 7"``, ``"25738"`` as a string in older traces) was first seen, from 1 << 40."""
    if type(value) is int:
        return value
    if not isinstance(value, str | int | float):  # None, or what no profiler writes (a list, an object)
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
