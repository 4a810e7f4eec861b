"""A run of one rank's trace events in start order, as columns: what every trace analysis is fed.

``gpufleet analyze`` cuts a whole trace into batches (``producers.traces.events.EventList.
column_chunks``); the worker's trace stage makes one of the kernel events a message batch
brings for a trace (``KernelEventColumns`` as they come, older ``KernelEvent`` records by
``of_records``). An analysis reads the columns it needs, a batch at a time, with no object per
event: the columns are Python lists, which a loop over ``zip`` reads faster than anything else
CPython offers for values that are looked at once or twice each.

Columns (one value per event): ``kind`` (the ``KernelEvent`` kinds), ``cat``, ``name``, ``ts``,
``end``, ``dur``, ``stream`` (-1 on the CPU side), ``device``, ``correlation``, ``tid``; the
rare fields (a copy's ``bytes``, ``bandwidth_gbps``, ``memcpy_kind``, ``trace_order``; an
operator's ``flops``, ``precision``, ``op_bytes``; a sync's wait) in ``extras``, by row.

The trace analysis (``TraceAnalyzer``) adds what it joins: the GPU-side rows (``gpu``), each
one's runtime call (``calls``: a ``Call`` or None) and kernel type (``bits``), and their values
of the columns the GPU-side analyses read (``g_ts``, ``g_end``, ``g_dur``, ``g_name``, ``g_cat``,
``g_kind``, ``g_stream``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from operator import add, itemgetter
from typing import Any

# The fields of a KernelEvent kept as columns, and the optional ones kept as extras (by row).
COLUMNS = ("kind", "cat", "name", "ts", "dur", "stream", "device", "correlation", "tid")
EXTRAS = ("bytes", "bandwidth_gbps", "memcpy_kind", "trace_order", "flops", "precision", "op_bytes",
          "wait_on_stream", "wait_on_record")


class EventBatch:
    __slots__ = (
        "bits",
        "calls",
        "cat",
        "correlation",
        "device",
        "dur",
        "end",
        "extras",
        "g_cat",
        "g_dur",
        "g_end",
        "g_kind",
        "g_name",
        "g_stream",
        "g_ts",
        "gpu",
        "kind",
        "labels",
        "name",
        "stream",
        "tid",
        "ts",
    )

    def __init__(self, kind: list[str], cat: list, name: list[str], ts: list, dur: list, stream: list[int],
                 device: list[int], correlation: list[int], tid: list[int], extras: dict[int, dict] | None = None,
                 ) -> None:
        self.kind, self.cat, self.name, self.ts, self.dur = kind, cat, name, ts, dur
        self.stream, self.device, self.correlation, self.tid = stream, device, correlation, tid
        self.end = list(map(add, ts, dur))
        self.extras = extras or {}
        self.labels: dict[str, dict[int, Any]] = {}  # what analyses say of runtime calls, by row (``Labels``)
        self.gpu: list[int] = []
        self.calls: list = []
        self.bits: list[int] = []
        self.g_ts = self.g_end = self.g_dur = self.g_name = self.g_cat = self.g_kind = self.g_stream = ()

    def __len__(self) -> int:
        return len(self.ts)

    @classmethod
    def of_records(cls, records: Iterable[dict]) -> EventBatch:
        """A batch of event dicts (``KernelEvent`` records, or ``EventList``'s dicts)."""
        records = list(records)
        columns = [_column(records, c) for c in COLUMNS]
        extras = {}
        for i, r in enumerate(records):
            x = {k: r[k] for k in EXTRAS if r.get(k) is not None}
            if x:
                extras[i] = x
        return cls(*columns, extras)

    @classmethod
    def of_columns(cls, record: dict, skip: int = 0) -> EventBatch:
        """The events of a ``KernelEventColumns`` record (``columns_error`` found nothing wrong
        with it), but the first ``skip``."""
        strings = record["strings"].__getitem__
        columns = [record[c][skip:] for c in COLUMNS]
        columns[1], columns[2] = list(map(strings, columns[1])), list(map(strings, columns[2]))
        extras = {x["row"] - skip: {k: v for k, v in x.items() if v is not None and k != "row"}
                  for x in record["extras"] if x["row"] >= skip}
        return cls(*columns, extras)

    def rows(self) -> Iterator[dict]:
        """Each event as a dict (``KernelEvent``'s fields, ``end`` too): the batch's events read
        back as records (no analysis reads them so: each reads the columns)."""
        extras = self.extras
        for i, values in enumerate(zip(self.kind, self.cat, self.name, self.ts, self.dur, self.end, self.stream,
                                       self.device, self.correlation, self.tid)):
            e = dict(zip(_ROW_KEYS, values))
            if extras:
                x = extras.get(i)
                if x is not None:
                    e.update(x)
            yield e

    def join(self, gpu: list[int], calls: list) -> None:
        """The GPU-side rows, their runtime calls, and their values of the columns the GPU-side
        analyses read (the analyzer sets their kernel types, ``bits``, from ``g_name``)."""
        self.gpu, self.calls = gpu, calls
        if not gpu:
            return
        if len(gpu) == 1:
            i = gpu[0]
            self.g_ts, self.g_end, self.g_dur, self.g_name = [self.ts[i]], [self.end[i]], [self.dur[i]], [self.name[i]]
            self.g_cat, self.g_kind, self.g_stream = [self.cat[i]], [self.kind[i]], [self.stream[i]]
            return
        pick = itemgetter(*gpu)
        self.g_ts, self.g_end, self.g_dur, self.g_name = pick(self.ts), pick(self.end), pick(self.dur), pick(self.name)
        self.g_cat, self.g_kind, self.g_stream = pick(self.cat), pick(self.kind), pick(self.stream)


def _column(records: list[dict], key: str) -> list:
    """Every record's ``key`` (-1 where a record has none: the device and thread of older records)."""
    try:
        return list(map(itemgetter(key), records))
    except KeyError:
        return [r.get(key, -1) for r in records]


def columns_error(record: dict) -> str | None:
    """What is wrong with a ``KernelEventColumns`` record that its schema cannot say, or None."""
    n = len(record["ts"])
    uneven = [c for c in COLUMNS if len(record[c]) != n]
    if uneven:
        return f"KernelEventColumns with {n} events but {len(record[uneven[0]])} values of {uneven[0]}"
    if n == 0:
        return "KernelEventColumns with no event"
    if record["first_seq"] < 0:
        return f"KernelEventColumns with first_seq {record['first_seq']} (seq counts from 0)"
    if reason := times_error("KernelEventColumns", min(record["ts"]), max(record["ts"]), min(record["dur"]),
                             max(record["dur"])):
        return reason
    strings = len(record["strings"])
    for column in ("cat", "name"):
        low, high = min(record[column]), max(record[column])
        if low < 0 or high >= strings:
            return f"KernelEventColumns refers to string {low if low < 0 else high} of {column}, of {strings} strings"
    rows = [x["row"] for x in record["extras"]]
    if rows and (min(rows) < 0 or max(rows) >= n):
        return f"KernelEventColumns has extras for row {min(rows) if min(rows) < 0 else max(rows)} of {n} events"
    return None


# A trace's times, in microseconds, are within this of 0 (what the trace reader accepts: every such
# time is exact as a double, and so is every sum of two of them the analyses make).
TIME_LIMIT = 2**53


def times_error(schema: str, first: int, last: int, shortest: int, longest: int) -> str | None:
    """What is wrong with the starts (``first`` .. ``last``) and durations of events, or None."""
    for what, value in (("start", first), ("start", last), ("duration", shortest), ("duration", longest)):
        if not -TIME_LIMIT < value < TIME_LIMIT:
            return (f"{schema} with a {what} of {value} us, beyond the ±2**53 us (285 years) a trace's times "
                    f"are read in")
    return None


def event_error(record: dict) -> str | None:
    """What is wrong with a ``KernelEvent`` record that its schema cannot say, or None."""
    return times_error("KernelEvent", record["ts"], record["ts"], record["dur"], record["dur"])


_ROW_KEYS = ("kind", "cat", "name", "ts", "dur", "end", "stream", "device", "correlation", "tid")
