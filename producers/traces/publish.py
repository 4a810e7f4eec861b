"""Publishes a profiler trace file as ``KernelEventColumns`` messages (its events in start
order, up to ``EVENTS_PER_MESSAGE`` a message, column by column), then a ``TraceEnd`` marker.

A damaged file publishes what was valid before the damage, a ``TraceEnd`` saying the trace
is partial, and a dead-letter record with the reason; an unreadable file publishes the
dead letter and a ``TraceEnd`` with no events. Nothing raises for a bad trace.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from producers.publish_kafka import Publisher
from producers.traces.read import TraceError, TraceRead, read_trace
from schemas.dead_letter import dead_letter
from schemas.topics import DEAD_LETTERS, KERNEL_EVENTS, trace_id_for

STAGE = "trace-ingest"
# Where they are known (absent elsewhere): a copy's size and bandwidth; an operator's FLOPs, for the roofline.
_OPTIONAL_FIELDS = ("bytes", "bandwidth_gbps", "memcpy_kind", "flops", "precision", "op_bytes", "trace_order")
_EVENT_FIELDS = ("kind", "cat", "name", "stream", "device", "correlation", "tid")


def publish_trace(
    path: str | Path, workflow_id: str, publisher: Publisher, topic_prefix: str = "",
    trace_id: str | None = None, system: dict | None = None,
) -> dict:
    """Publish one trace file; return its ``TraceEnd`` record. ``system``: what the host saw
    while the trace was captured (``producers/profiling/context.py``), for a requested profile."""
    trace_id = trace_id or trace_id_for(path, workflow_id)
    topic = topic_prefix + KERNEL_EVENTS.name
    now = int(time.time() * 1000)
    try:
        trace = read_trace(path)
    except TraceError as exc:
        end = {"trace_id": trace_id, "workflow_id": workflow_id, "rank": 0, "events": 0, "events_read": 0,
               "source": str(path), "partial": True, "error": str(exc), "last_step_dropped": False,
               "memory_peak_bytes": None, "memory_total_bytes": None, "flops": None, "gpu_name": None,
               "published_at": now, "system": system}
        _dead_letter(publisher, topic_prefix, path, str(exc), now)
        publisher.publish(KERNEL_EVENTS, [end], topic=topic, schema="TraceEnd")
        return end

    publisher.publish(KERNEL_EVENTS, kernel_event_columns(trace, trace_id, workflow_id), topic=topic,
                      schema="KernelEventColumns")
    n = len(trace.events)
    end = {"trace_id": trace_id, "workflow_id": workflow_id, "rank": trace.rank, "events": n,
           "events_read": trace.events_seen, "source": str(path), "partial": trace.partial,
           "error": trace.error, "last_step_dropped": trace.last_step_dropped,
           "memory_peak_bytes": trace.memory_peak_bytes, "memory_total_bytes": trace.memory_total_bytes,
           "flops": trace.flops or None, "gpu_name": trace.gpu_name, "published_at": now, "system": system}
    if trace.partial:
        _dead_letter(publisher, topic_prefix, path, f"partial trace: {trace.error}", now)
    if trace.skipped:
        _dead_letter(publisher, topic_prefix, path, f"trace items skipped: {trace.skipped['says']}", now)
    publisher.publish(KERNEL_EVENTS, [end], topic=topic, schema="TraceEnd")
    return end


def kernel_event_records(trace: TraceRead, trace_id: str, workflow_id: str) -> Iterator[dict]:
    """The ``KernelEvent`` records of a trace read, in its events' (start) order, ``seq`` from 0."""
    for seq, e in enumerate(trace.events):
        record = {f: e[f] for f in _EVENT_FIELDS}
        record.update({f: e.get(f) for f in _OPTIONAL_FIELDS})
        record.update(trace_id=trace_id, workflow_id=workflow_id, rank=trace.rank, seq=seq,
                      ts=int(e["ts"]), dur=int(e["dur"]))
        yield record


EVENTS_PER_MESSAGE = 1000
# The names of a message's events (kernel names are C++ templates, up to kilobytes each) are kept
# under this, well within a broker's default largest message (1 MiB): a message holds fewer events
# where most have long names of their own.
STRING_BYTES_PER_MESSAGE = 256 * 1024


def kernel_event_columns(trace: TraceRead, trace_id: str, workflow_id: str,
                         size: int = EVENTS_PER_MESSAGE) -> Iterator[dict]:
    """The ``KernelEventColumns`` records of a trace read: its events in start order, ``size``
    at most a record, ``first_seq`` counting from 0."""
    seq = 0
    for kind, cat, name, ts, dur, stream, device, correlation, tid, extras in trace.events.column_chunks(size):
        for lo, hi in _within_string_budget(cat, name):
            strings: dict[str, int] = {}
            record = {
                "trace_id": trace_id, "workflow_id": workflow_id, "rank": trace.rank, "first_seq": seq,
                "kind": kind[lo:hi],
                "cat": [strings.setdefault(c or "", len(strings)) for c in cat[lo:hi]],
                "name": [strings.setdefault(n, len(strings)) for n in name[lo:hi]],
                "ts": list(map(int, ts[lo:hi])), "dur": list(map(int, dur[lo:hi])), "stream": stream[lo:hi],
                "device": device[lo:hi], "correlation": correlation[lo:hi], "tid": tid[lo:hi],
                "extras": [{"row": row - lo, **{f: x.get(f) for f in _OPTIONAL_FIELDS}}
                           for row, x in sorted(extras.items()) if lo <= row < hi],
            }
            record["strings"] = list(strings)
            seq += hi - lo
            yield record


def _within_string_budget(cat: list, name: list) -> Iterator[tuple[int, int]]:
    """``[lo, hi)`` ranges of a chunk whose distinct strings stay within ``STRING_BYTES_PER_MESSAGE``
    (one event a range at least, whatever its name's length)."""
    lo, seen, used = 0, set(), 0
    for i, (c, n) in enumerate(zip(cat, name)):
        new = sum(len(s.encode()) for s in {c or "", n} - seen)
        if used + new > STRING_BYTES_PER_MESSAGE and i > lo:
            yield lo, i
            lo, seen, used = i, set(), sum(len(s.encode()) for s in {c or "", n})
        else:
            used += new
        seen.update((c or "", n))
    if lo < len(name):
        yield lo, len(name)


def _dead_letter(publisher: Publisher, prefix: str, path: str | Path, reason: str, now: int) -> None:
    record = dead_letter(STAGE, reason, f"file:{path}", -1, -1, None, None, now)
    publisher.publish(DEAD_LETTERS, [record], topic=prefix + DEAD_LETTERS.name)
