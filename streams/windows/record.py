"""One workflow window's accumulator and the ``WorkflowWindow`` record it becomes: what a
window adds up from blocks of samples (``schemas.sample_columns``: a few builtin calls per
column, not a step per sample), with its efficiency (``streams.windows.efficiency``) and goodput
(``streams.windows.goodput``) parts. ``streams.windows.utilization`` decides which window a block goes
to and when a window closes."""

from __future__ import annotations

from operator import mul

from schemas.sample_columns import take
from streams.alerts.detectors import DetectorConfig
from streams.windows.efficiency import add_efficiency, efficiency_fields, new_efficiency
from streams.windows.goodput import GoodputConfig, add_goodput, goodput_fields, new_goodput
from streams.windows.workflow_state import WorkflowState

Record = dict
DEFAULT_GOODPUT = GoodputConfig()


def window_start(event_time_ms: int, size_ms: int) -> int:
    return event_time_ms - event_time_ms % size_ms


def new_acc() -> dict:
    return {
        "n": 0, "interval_ms": 0, "util_weighted": 0.0,
        "util_min": None, "util_max": None, "mem_sum": 0.0, "mem_n": 0,
        "energy_j": 0.0, "energy_n": 0, "eff": new_efficiency(), "goodput": new_goodput(), "model": None,
    }


def add_block(acc: dict, c: Record, state: WorkflowState, goodput: GoodputConfig, thresholds: DetectorConfig) -> None:
    """The samples of block ``c`` (``schemas.sample_columns``), all in this accumulator's window,
    of the workflow whose state is ``state``."""
    # A GPU shared by several workflows counts for each in proportion to its share.
    share = c["share"]
    w = c["interval_ms"] if share is None else list(map(mul, c["interval_ms"], share))
    total = sum(w)
    util = c["utilization_pct"]
    acc["n"] += len(util)
    acc["interval_ms"] += total
    acc["util_weighted"] += sum(map(mul, util, w))
    low, high = min(util), max(util)
    if acc["util_min"] is None or low < acc["util_min"]:
        acc["util_min"] = low
    if acc["util_max"] is None or high > acc["util_max"]:
        acc["util_max"] = high
    used = c["memory_used_bytes"]
    if used is not None:
        acc["mem_sum"] += sum(used)
        acc["mem_n"] += len(used)
    power = c["power_watts"]
    if power is not None:
        acc["energy_j"] += sum(map(mul, power, w)) / 1000.0
        acc["energy_n"] += len(power)
    add_efficiency(acc["eff"], c, w, total)
    if "goodput" not in acc:  # a window opened by a release before goodput: from here on
        acc["goodput"], acc["model"] = new_goodput(), None
    add_goodput(acc["goodput"], c, w, state, goodput, thresholds)
    if acc["model"] is None:
        acc["model"] = c["gpu_model"][0]


def by_window(c: Record, size_ms: int) -> list[tuple[int, Record]]:
    """``(window start, the block's samples in that window)``: the whole block when it falls in
    one window, as it mostly does."""
    times = c["event_time"]
    start = window_start(times[0], size_ms)
    if start <= min(times) and max(times) < start + size_ms:
        return [(start, c)]
    starts: dict[int, list[int]] = {}
    for i, t in enumerate(times):
        starts.setdefault(window_start(t, size_ms), []).append(i)
    return [(s, take(c, indices)) for s, indices in starts.items()]


def to_window(workflow_id: str, state: WorkflowState, start: int, acc: dict, size_ms: int, closed_at: int,
              version: int, goodput: GoodputConfig, thresholds: DetectorConfig) -> Record:
    """The ``WorkflowWindow`` record of one accumulator. Its GPU-seconds are the observed and the
    unobserved ones; its utilisation is of the observed alone (a window of unobserved time only
    has none: 0, and no sample)."""
    interval = acc["interval_ms"]
    buckets = acc.get("goodput")
    unobserved = buckets.get("unobserved_ms", 0.0) if buckets else 0.0
    energy = acc["energy_j"] if acc["energy_n"] else None
    if buckets is not None and buckets["metered"]:  # the counters' measure where the GPUs have one
        energy = sum(buckets["j"]) + sum(v for entry in buckets["quiet"].values() for v in entry[1::2])
    window = {
        "workflow_id": workflow_id,
        "version": version,
        "owner": state.owner,
        "team": state.team,
        "window_start": start,
        "window_end": start + size_ms,
        "sample_count": acc["n"],
        "gpu_count": len(acc["eff"]["per_gpu"]),  # every GPU a sample came from
        "gpu_seconds": (interval + unobserved) / 1000.0,
        "utilization_mean_pct": acc["util_weighted"] / interval if interval else 0.0,
        "utilization_min_pct": float(acc["util_min"] or 0.0),
        "utilization_max_pct": float(acc["util_max"] or 0.0),
        "memory_used_mean_bytes": acc["mem_sum"] / acc["mem_n"] if acc["mem_n"] else None,
        "energy_joules": energy,
        **efficiency_fields(acc["eff"]),
        "gpu_model": acc.get("model"),
        "closed_at": closed_at,
    }
    return {**window, **goodput_fields(buckets or new_goodput(), window, state, goodput, thresholds)}
