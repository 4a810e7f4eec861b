"""``GpuSampleColumns``: GPU samples travelling column by column, and the checks on them.

A block is the record as decoded: ``host``, ``workflow_id``, ``owner``, ``team`` once, and one
list per ``GpuSample`` field (a *column*) with a value per sample, or ``None`` where no sample
of the block reports the field. The agents send blocks; the stream worker validates and
aggregates whole columns (``streams.windows.utilization``), so most of its work per sample runs
inside builtins such as ``sum`` and ``min`` instead of the interpreter. The older formats, a
``GpuSample`` per message or a ``GpuSampleBatch`` of them, are turned into blocks on arrival.
"""

from __future__ import annotations

import json
from itertools import compress
from math import isnan
from operator import gt

from schemas.codec import SCHEMA_DIR
from schemas.validate_ids import ids_error
from schemas.validate_sample import (
    ACROSS,
    BOUNDS,
    MAX_AHEAD_OF_KAFKA_MS,
    ahead_reason,
    samples_of,
    validate_sample,
)

NAME = "GpuSampleColumns"
CLOCK = "PartitionClock"  # also on the samples topic: the fleet's event time, no samples
# What else the samples topic carries that holds no sample: the fleet's event time, and a job's
# end from its scheduler (a WorkflowEvent, after the job's last samples from its host).
NO_SAMPLES = frozenset({CLOCK, "WorkflowEvent", "UnobservedTime", "ServingSample"})
SHARED = ("host", "workflow_id", "owner", "team")


def _columns() -> tuple[tuple[str, ...], tuple[str, ...]]:
    catalog = json.loads((SCHEMA_DIR / "catalog.json").read_text())["schemas"]
    newest = max((e for e in catalog if e["name"] == NAME), key=lambda e: e["version"])
    fields = json.loads((SCHEMA_DIR / newest["file"]).read_text())["fields"]
    columns = tuple(f["name"] for f in fields if f["name"] not in SHARED)
    nullable = tuple(f["name"] for f in fields if f["name"] not in SHARED and isinstance(f["type"], list))
    return columns, nullable


COLUMNS, NULLABLE = _columns()  # from the newest schema file, so that code and schema cannot drift apart
_DEFAULTS = {"xids": []}  # a field a sample may leave out that is not nullable


def columns_of(samples: list[dict], per_tick: bool = True, max_samples: int = 1000) -> list[dict]:
    """Group ``GpuSample`` dicts into blocks, in the order each group first appears: one per
    host, workflow, owner, team and set of reported fields, and with ``per_tick`` also per
    event time; at most ``max_samples`` samples each, so that a backlog does not make a
    message too large for the broker."""
    groups: dict[tuple, list[dict]] = {}
    for s in samples:
        reported = tuple(s.get(k) is not None for k in NULLABLE)
        key = (s["host"], s["workflow_id"], s.get("owner"), s.get("team"), reported,
               s["event_time"] if per_tick else None)
        groups.setdefault(key, []).append(s)
    blocks = []
    for (host, wf, owner, team, reported, _), members in groups.items():
        present = set(compress(NULLABLE, reported))
        for i in range(0, len(members), max_samples):
            part = members[i:i + max_samples]
            block = {"host": host, "workflow_id": wf, "owner": owner, "team": team}
            for k in COLUMNS:
                if k in NULLABLE and k not in present:
                    block[k] = None
                elif k in _DEFAULTS:
                    block[k] = [s.get(k) or _DEFAULTS[k] for s in part]
                else:
                    block[k] = [s[k] for s in part]
            blocks.append(block)
    return blocks


def size(block: dict) -> int:
    return len(block["event_time"])


def reported(block: dict) -> tuple[bool, ...]:
    """Which of the fields a sample may leave out the block's samples report."""
    return tuple(block[k] is not None for k in NULLABLE)


def _sliced(block: dict, start: int, stop: int) -> dict:
    out = {k: block[k] for k in SHARED}
    for k in COLUMNS:
        col = block[k]
        out[k] = None if col is None else col[start:stop]
    return out


def merged(blocks: list[dict], max_samples: int = 1000) -> list[dict]:
    """``blocks`` as few blocks as they allow, column by column, in the order each group first
    appears: blocks of the same host, workflow, owner, team and reported fields become one
    (their samples in order), of at most ``max_samples`` samples. The same blocks as
    ``columns_of(<their samples>, per_tick=False)``, without going through a dict per sample."""
    groups: dict[tuple, list[dict]] = {}
    for b in blocks:
        groups.setdefault((*(b[k] for k in SHARED), reported(b)), []).append(b)
    out = []
    for members in groups.values():
        whole = members[0] if len(members) == 1 else {k: members[0][k] for k in SHARED}
        if len(members) > 1:
            for k in COLUMNS:
                whole[k] = None if members[0][k] is None else [v for m in members for v in m[k]]
        n = size(whole)
        out += [whole] if n <= max_samples else [_sliced(whole, i, i + max_samples) for i in range(0, n, max_samples)]
    return out


def rows_of(block: dict) -> list[dict]:
    """The block's samples as ``GpuSample`` dicts (every field; null where not reported)."""
    shared = {k: block[k] for k in SHARED}
    present = [(k, block[k]) for k in COLUMNS if block[k] is not None]
    absent = dict.fromkeys(k for k in COLUMNS if block[k] is None)
    return [{**shared, **absent, **{k: col[i] for k, col in present}} for i in range(size(block))]


def take(block: dict, indices: list[int]) -> dict:
    """The samples of ``block`` at ``indices``, as a block."""
    out = {k: block[k] for k in SHARED}
    for k in COLUMNS:
        col = block[k]
        out[k] = None if col is None else [col[i] for i in indices]
    return out


def shape_error(block: dict) -> str | None:
    """What makes ``block`` unusable as a whole (its columns disagree on the number of
    samples, or it names no workflow), or None."""
    if not block["workflow_id"]:
        return "empty workflow_id: the samples cannot be attributed to a workflow"
    reason = ids_error(block)
    if reason:
        return reason
    n = size(block)
    for k in COLUMNS:
        col = block[k]
        if col is not None and len(col) != n:
            return f"column {k} has {len(col)} values, event_time has {n}: a block has one value per sample"
    return None


def _passes(block: dict) -> bool:
    """Whether every sample of the block passes ``validate_sample``, one column at a time (the
    same ``BOUNDS``: a column's least and greatest values are within them, and it holds no NaN,
    which makes its sum NaN); a block that does not is checked sample by sample to say which
    and why."""
    for bounds in BOUNDS:
        col = block[bounds.field]
        if col:
            least = min(col)
            if (least <= bounds.low if bounds.low_open else least < bounds.low) or max(col) > bounds.high:
                return False
            if isnan(sum(col)):
                return False
    for rule in ACROSS:
        values, limits = block[rule.field], block[rule.limit]
        if values is not None and limits is not None and any(map(gt, values, limits)):
            return False
    return True


def samples_checked(name: str, record: dict) -> list[tuple[dict | None, str | None]]:
    """Each sample of a ``GpuSample``, ``GpuSampleBatch`` or ``GpuSampleColumns`` message with
    the reason it is unusable (or None); a block whose shape is wrong is one ``(None, reason)``.
    A ``PartitionClock`` or a ``WorkflowEvent`` carries no sample."""
    if name in NO_SAMPLES:
        return []
    if name != NAME:
        return samples_of(name, record)
    reason = shape_error(record)
    if reason:
        return [(None, reason)]
    out = []
    for i, s in enumerate(rows_of(record)):
        reason = validate_sample(s)
        out.append((s, reason and f"sample {i} of the block: {reason}"))
    return out


def blocks_of(name: str, record: dict, received_ms: int | None = None) -> tuple[list[dict], list[str]]:
    """The usable blocks of a ``GpuSample``, ``GpuSampleBatch`` or ``GpuSampleColumns``
    message, and the reason for each sample (or the whole message) that is not usable
    (a ``PartitionClock`` or ``WorkflowEvent``: none of either). ``received_ms``: when Kafka
    received the message (its record's timestamp); samples more than ``MAX_AHEAD_OF_KAFKA_MS``
    ahead of it are refused, with one reason for them all. The one judgement of a sample: the
    worker and the sink both call this."""
    if name == NAME and shape_error(record) is None and (not size(record) or _passes(record)):
        blocks, reasons = ([record] if size(record) else []), []
    else:
        checked = samples_checked(name, record)
        good = [s for s, reason in checked if reason is None]
        blocks, reasons = columns_of(good, per_tick=False, max_samples=max(1, len(good))), [r for _, r in checked if r]
    if received_ms is None or received_ms <= 0 or not blocks:
        return blocks, reasons
    limit = received_ms + MAX_AHEAD_OF_KAFKA_MS
    if all(max(b["event_time"]) <= limit for b in blocks):
        return blocks, reasons
    kept, refused, newest = [], 0, 0
    for b in blocks:
        times = b["event_time"]
        keep = [i for i, t in enumerate(times) if t <= limit]
        refused += len(times) - len(keep)
        newest = max(newest, max(times))
        if len(keep) == len(times):
            kept.append(b)
        elif keep:
            kept.append(take(b, keep))
    return kept, [*reasons, ahead_reason(refused, blocks[0], newest, received_ms)]
