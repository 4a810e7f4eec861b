"""Publishes a profiler trace file as ``KernelEvent`` records, then a ``TraceEnd`` marker.

A damaged file publishes what was valid before the damage, a ``TraceEnd`` saying the trace
is partial, and a dead-letter record with the reason; an unreadable file publishes the
dead letter and a ``TraceEnd`` with no events. Nothing raises for a bad trace.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from producers.publish_kafka import Publisher
from producers.read_trace import TraceError, TraceRead, read_trace
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
    while the trace was captured (``producers/profile_context.py``), for a requested profile."""
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

    n = publisher.publish(KERNEL_EVENTS, kernel_event_records(trace, trace_id, workflow_id), topic=topic)
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


def _dead_letter(publisher: Publisher, prefix: str, path: str | Path, reason: str, now: int) -> None:
    record = dead_letter(STAGE, reason, f"file:{path}", -1, -1, None, None, now)
    publisher.publish(DEAD_LETTERS, [record], topic=prefix + DEAD_LETTERS.name)
