"""Checks a decoded ``GpuSample`` for values no GPU can report; returns the reason or None.

Part of the contract: the worker and the sink both refuse what fails it (to the dead-letter topic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from schemas.validate_ids import ids_error

# 2000-01-01T00:00:00Z: an event time before this is a clock or unit error (seconds, not ms).
MIN_EVENT_TIME_MS = 946_684_800_000
# 2299-12-31T23:59:59.999Z, the last millisecond ClickHouse's DateTime64(3) holds: a later one
# is stored, but no client can read it back as a time (a clock or unit error: microseconds).
MAX_EVENT_TIME_MS = 10_413_791_999_999
MAX_INTERVAL_MS = 3_600_000
# A sample more than this ahead of the time Kafka received its message comes from a host whose
# clock is wrong (or a unit error). The samples topic keeps the broker's time on every record
# (message.timestamp.type = LogAppendTime, schemas.topics), not the time the host's client
# stamped, so the judgement depends on nothing a host says of itself, and it is the same
# whenever and wherever a record is read again: the worker and the sink refuse exactly the
# same samples (schemas.sample_columns.blocks_of; the sink's SQL path by the same number).
MAX_AHEAD_OF_KAFKA_MS = 300_000

# The workflow ids of GPU samples that belong to no workflow: GPUs no scheduler allocated and
# no process holds (the fleet's free capacity; ``unallocated`` where the agent reads the
# scheduler's allocations, ``idle`` where it sees processes only), and GPUs whose memory is held
# by a process that names no workflow.
IDLE = "idle"
UNALLOCATED = "unallocated"
UNATTRIBUTED = "unattributed"
NOT_WORKFLOWS = frozenset({IDLE, UNALLOCATED, UNATTRIBUTED})
FREE_CAPACITY = frozenset({IDLE, UNALLOCATED})  # counted as capacity no job was given


@dataclass(frozen=True, slots=True)
class Bounds:
    """The values a numeric field may take: ``low`` (excluded when ``low_open``) .. ``high``;
    a value outside, NaN included, makes the sample unusable for the reason ``says``."""

    field: str
    low: float
    high: float
    says: str
    low_open: bool = False

    def allows(self, value) -> bool:
        if self.low_open:
            return self.low < value <= self.high  # False for NaN
        return self.low <= value <= self.high


# The rules on single values, in the order they are checked. ``validate_sample`` applies them to
# a sample, ``schemas.sample_columns`` to a whole column at once: one table, so the two agree.
BOUNDS = (
    Bounds("event_time", MIN_EVENT_TIME_MS, MAX_EVENT_TIME_MS,
           "is outside 2000-01-01..2299-12-31 (expected epoch milliseconds)"),
    Bounds("interval_ms", 0, MAX_INTERVAL_MS, f"is outside 1..{MAX_INTERVAL_MS}", low_open=True),
    Bounds("utilization_pct", 0.0, 100.0, "is outside 0..100"),
    Bounds("memory_utilization_pct", 0.0, 100.0, "is outside 0..100"),
    Bounds("memory_used_bytes", 0, math.inf, "is negative"),
    Bounds("power_watts", 0.0, math.inf, "is negative"),
    Bounds("share", 0.0, 1.0, "is outside (0, 1]", low_open=True),
    Bounds("model_tflops", 0.0, 100_000.0, "is outside 0..100000 (TFLOPS of one GPU)"),
    Bounds("allocator_peak_bytes", 0, 1 << 50, "is outside 0..1 PiB (the memory of one GPU)"),
    Bounds("allocator_reserved_bytes", 0, 1 << 50, "is outside 0..1 PiB (the memory of one GPU)"),
    Bounds("workflow_memory_bytes", 0, 1 << 60, "is outside 0..1 EiB"),
)


@dataclass(frozen=True, slots=True)
class AtMost:
    """A rule across two fields of a sample: ``field`` may not exceed ``limit``, where both are
    reported (memory in use cannot exceed the GPU's memory)."""

    field: str
    limit: str

    def says(self, value, limit) -> str:
        return f"{self.field} {value} exceeds {self.limit} {limit}"


# The rules across fields, after ``BOUNDS``: ``validate_sample`` applies them to a sample,
# ``schemas.sample_columns`` to a block's columns, and the sink's SQL path
# (``sinks.insert_sample_columns``) is made from them.
ACROSS = (AtMost("memory_used_bytes", "memory_total_bytes"),)


def _iso(ms: int) -> str:
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms"


def ahead_reason(count: int, block: dict, newest_ms: int, received_ms: int) -> str:
    """Why ``count`` samples of ``block`` (a host's samples of one workflow) are refused: the
    newest of them is ``newest_ms``, Kafka received their message at ``received_ms``."""
    ahead_s = (newest_ms - received_ms) / 1000
    return (f"{count} sample(s) of workflow {block['workflow_id']} from host {block['host']} are ahead of the time "
            f"Kafka received them ({_iso(received_ms)}) by up to {ahead_s:,.0f} s (at most "
            f"{MAX_AHEAD_OF_KAFKA_MS // 1000} s allowed; newest {_iso(newest_ms)}): the host's clock is wrong")


def ahead_error(what: str, newest_ms: int, received_ms: int | None) -> str | None:
    """Why a record of the samples topic other than GPU samples (``what`` names it: a serving
    sample, an end, an outage, the fleet's clock), whose latest time is ``newest_ms``, is refused,
    held to the samples' bound; None when it is not ahead (or Kafka's time is not known)."""
    if received_ms is None or received_ms <= 0 or newest_ms <= received_ms + MAX_AHEAD_OF_KAFKA_MS:
        return None
    return (f"{what} is ahead of the time Kafka received it ({_iso(received_ms)}) by "
            f"{(newest_ms - received_ms) / 1000:,.0f} s (at most {MAX_AHEAD_OF_KAFKA_MS // 1000} s allowed; its time "
            f"{_iso(newest_ms)}): the clock that stamped it is wrong")


def validate_sample(r: dict) -> str | None:
    """None when the sample is usable, else what is wrong with it, in words."""
    if not r["workflow_id"]:
        return "empty workflow_id: the sample cannot be attributed to a workflow"
    reason = ids_error(r)
    if reason:
        return reason
    for bounds in BOUNDS:
        value = r.get(bounds.field)
        if value is not None and not bounds.allows(value):
            return f"{bounds.field} {value} {bounds.says}"
    for rule in ACROSS:
        value, limit = r.get(rule.field), r.get(rule.limit)
        if value is not None and limit is not None and value > limit:
            return rule.says(value, limit)
    return None


def samples_of(name: str, record: dict) -> list[tuple[dict, str | None]]:
    """The samples a ``GpuSample`` or ``GpuSampleBatch`` message carries, each with the reason
    it is unusable (or None). A batch's sample must belong to the batch's workflow: the
    message key, and so the partition, is the batch's."""
    if name == "GpuSample":
        return [(record, validate_sample(record))]
    if not record["samples"]:
        return []
    out = []
    for i, s in enumerate(record["samples"]):
        if s["workflow_id"] != record["workflow_id"]:
            reason = (f"sample {i} of a batch for workflow {record['workflow_id']!r} belongs to "
                      f"{s['workflow_id']!r}")
        else:
            reason = validate_sample(s)
            if reason:
                reason = f"sample {i} of the batch: {reason}"
        out.append((s, reason))
    return out


# An agent reports a gap when it starts again; one longer than this is no agent's outage but a
# clock or unit error (the longest Slurm job a site allows is weeks, not months).
MAX_UNOBSERVED_MS = 31 * 86_400_000
MAX_GPUS_PER_HOST = 1024  # (MIG instances of 16 GPUs of 7 each, with room)


def unobserved_error(r: dict) -> str | None:
    """None when an ``UnobservedTime`` record can be used, else what is wrong with it: times
    outside the sample bounds or backwards, a span longer than ``MAX_UNOBSERVED_MS``, a count
    of GPUs no host has."""
    begin, end, gpus = r["from_time"], r["to_time"], r["gpus"]
    for name, value in (("from_time", begin), ("to_time", end)):
        if not MIN_EVENT_TIME_MS <= value <= MAX_EVENT_TIME_MS:
            return f"{name} {value} is outside 2000-01-01..2299-12-31 (expected epoch milliseconds)"
    if end < begin:
        return f"unobserved time ends ({end}) before it begins ({begin})"
    if end - begin > MAX_UNOBSERVED_MS:
        return f"unobserved time of {(end - begin) / 86_400_000:,.1f} days is longer than any job here (31 days)"
    if not 0.0 < gpus <= MAX_GPUS_PER_HOST:  # (False for NaN)
        return f"unobserved time of {gpus} GPUs: a host has 1 to {MAX_GPUS_PER_HOST}"
    return None


SERVING_FIGURES = ("requests", "tokens", "running", "waiting", "queue_time_ms", "ttft_ms", "batch_size")
MAX_SERVING_RATE = 1e9  # requests or tokens in one interval, a queue, a wait in ms: beyond any engine


def service_error(service: str | None) -> str | None:
    """None when ``service`` may name a serving service (or is None), else what is wrong with it."""
    if service is not None and (not service.strip() or len(service) > 256 or not service.isprintable()):
        return f"service {service[:80]!r} is not a printable name of 1 to 256 characters"
    return None


def serving_error(r: dict) -> str | None:
    """None when a ``ServingSample`` can be used, else what is wrong with it: an event time
    outside the bounds, an interval of none or over an hour, a figure that is negative, not a
    number or beyond any engine, a KV cache's use outside 0..1, an empty service."""
    if not MIN_EVENT_TIME_MS <= r["event_time"] <= MAX_EVENT_TIME_MS:
        return f"event_time {r['event_time']} is outside 2000-01-01..2299-12-31 (expected epoch milliseconds)"
    if not 0 < r["interval_ms"] <= MAX_INTERVAL_MS:
        return f"interval_ms {r['interval_ms']} is outside 1..{MAX_INTERVAL_MS}"
    reason = service_error(r["service"])
    if reason:
        return reason
    for name in SERVING_FIGURES:
        value = r.get(name)
        if value is not None and not 0.0 <= value <= MAX_SERVING_RATE:  # (False for NaN)
            return f"{name} {value} is outside 0..{MAX_SERVING_RATE:g}"
    usage = r.get("kv_cache_usage")
    if usage is not None and not 0.0 <= usage <= 1.0:
        return f"kv_cache_usage {usage} is outside 0..1"
    return None
