"""The efficiency part of a workflow window: where its GPU-seconds went.

Accumulated alongside ``streams.windows.utilization`` (same windows, same weights: a sample counts
for its interval times the workflow's share of the GPU) and emitted in ``WorkflowWindow``:
active, wasted and 0 %-utilisation GPU-seconds, the utilisation's median and 95th
percentile (exact: NVML reports whole percents, kept as a histogram of 101 values), SM and
tensor activity where the GPU reports them (GPM), memory peak and mean fraction, mean
power, per-GPU balance, time under power or thermal clock limits, hardware faults, and the
workflow's CPU on its hosts with their I/O wait (from the agent, on each GPU sample), and
the model FLOPs utilisation of what the job reports of its own throughput (``model_tflops``,
against each GPU's bf16 dense peak: ``schemas/gpu_peaks.json``).
"""

from __future__ import annotations

from collections import Counter
from functools import cache
from itertools import compress
from operator import mul, not_, truediv

from schemas.gpu_peaks import peak_tflops

# NVML clock-event reasons that mean "slowed down by power or heat" (nvmlClocksEventReason*).
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # SW power cap, HW slowdown, SW/HW thermal, power brake


def new_efficiency() -> dict:
    return {
        "active_ms": 0.0, "wasted_ms": 0.0, "zero_ms": 0.0, "hist": {}, "sm": [0.0, 0.0], "tensor": [0.0, 0.0],
        "mem_peak": None, "mem_frac": [0.0, 0.0], "power": [0.0, 0.0], "per_gpu": {}, "throttled_ms": 0.0,
        "xids": 0, "ecc": None, "cpu": [0.0, 0.0], "iowait": [0.0, 0.0],
        "model": [0.0, 0.0],  # sum(reported TFLOPS x weight), sum(peak TFLOPS x weight)
    }


@cache
def _bf16_peak(gpu_model: str) -> float | None:
    return peak_tflops(gpu_model, "bf16")


_BUCKETS = tuple(str(i) for i in range(101))  # histogram keys (strings: the state is JSON)
# Accumulated as sum(value x weight) and sum(weight) where the sample has them.
_WEIGHTED_MEANS = (("sm", "sm_active_pct"), ("tensor", "tensor_active_pct"), ("power", "power_watts"),
                   ("cpu", "workflow_cpu_pct"), ("iowait", "host_iowait_pct"))


def add_efficiency(e: dict, c: dict, w: list[float], total: float) -> None:
    """The samples of block ``c`` (``schemas.sample_columns``), weighing ``w`` each (interval x
    share, in ms; ``total`` is their sum). Column at a time: most of the work is in builtins,
    and there is no allocation where the state already has the entry."""
    util = c["utilization_pct"]
    e["active_ms"] += sum(compress(w, util))
    e["zero_ms"] += sum(compress(w, map(not_, util)))
    e["wasted_ms"] += sum([wi * (1.0 - u / 100.0) for wi, u in zip(w, util)])
    hist = e["hist"]
    get = hist.get
    for u, wi in zip(util, w):
        rounded = round(u)
        bucket = _BUCKETS[rounded] if 0 <= rounded <= 100 else str(rounded)
        hist[bucket] = get(bucket, 0.0) + wi
    for key, name in _WEIGHTED_MEANS:
        col = c[name]
        if col is not None:
            pair = e[key]
            pair[0] += sum(map(mul, col, w))
            pair[1] += total
    _add_memory(e, c, w)
    # With where the GPU is and whose rank runs there, so an imbalance can name the straggler.
    per_gpu = e["per_gpu"]
    ranks = c["rank"]
    for i, (uuid, u, wi) in enumerate(zip(c["gpu_uuid"], util, w)):
        gpu = per_gpu.get(uuid)
        if gpu is None:
            where = f'{c["host"]}/gpu{c["gpu_index"][i]}' + ("" if ranks is None else f" (rank {ranks[i]})")
            gpu = per_gpu[uuid] = [0.0, 0.0, where]
        gpu[0] += u * wi
        gpu[1] += wi
    reasons = c["clock_event_reasons"]
    if reasons is not None:
        e["throttled_ms"] += sum(compress(w, [r & THROTTLE_MASK for r in reasons]))
    e["xids"] += sum(map(len, c["xids"]))
    reported = c["model_tflops"]
    if reported is not None:  # the job reports its throughput (the profiling hook's report_throughput)
        pair = e.setdefault("model", [0.0, 0.0])
        for tflops, model, wi in zip(reported, c["gpu_model"], w):
            peak = _bf16_peak(model)
            if peak:
                pair[0] += tflops * wi
                pair[1] += peak * wi
    ecc = c["ecc_uncorrected_volatile"]
    if ecc is not None and (e["ecc"] is None or max(ecc) > e["ecc"]):
        e["ecc"] = max(ecc)
    _add_processes(e, c)


def _add_processes(e: dict, c: dict) -> None:
    """Whether a process ever opened each GPU (where the agent counts processes: a GPU the
    scheduler allocated can have none), and the other workflows whose processes ran on GPUs
    allocated to this one."""
    counts = c["process_count"]
    if counts is not None:
        touched = e.setdefault("touched", {})
        if min(counts) > 0:  # the common case: every sample has a process
            touched.update(dict.fromkeys(c["gpu_uuid"], True))
        else:
            for uuid, n in zip(c["gpu_uuid"], counts):
                touched[uuid] = touched.get(uuid, False) or n > 0
    foreign = c.get("foreign_workflow_id")
    if foreign is not None:
        seen = e.setdefault("foreign", {})
        for wf in foreign:
            seen[wf] = seen.get(wf, 0) + 1


def _add_memory(e: dict, c: dict, w: list[float]) -> None:
    """The block's memory: NVML's used fraction (peak and weighted mean), and where the agent
    has them, the workflow's resident memory on the host and the framework allocator's peak."""
    used, capacity = c["memory_used_bytes"], c["memory_total_bytes"]
    if used is not None and capacity is not None:
        known = list(map(bool, capacity))
        fractions = list(map(truediv, compress(used, known), compress(capacity, known)))
        if fractions:
            peak = max(fractions)
            if e["mem_peak"] is None or peak > e["mem_peak"]:
                e["mem_peak"] = peak
            weights = list(compress(w, known))
            pair = e["mem_frac"]
            pair[0] += sum(map(mul, fractions, weights))
            pair[1] += sum(weights)
        rss = c["workflow_memory_bytes"]  # the workflow's processes on this host (the same on each GPU)
        if rss is not None:
            peaks = e.setdefault("host_rss", {})
            peaks[c["host"]] = max(peaks.get(c["host"], 0), max(r for r in rss if r is not None))
        allocated = c["allocator_peak_bytes"]  # the framework's own peak, where the job reports it
        if allocated is not None:
            reported = [a / m for a, m in zip(allocated, capacity) if a is not None and m]
            if reported and max(reported) > (e.get("alloc_peak") or 0.0):
                e["alloc_peak"] = max(reported)


def _percentile(hist: dict[str, float], q: float) -> float | None:
    total = sum(hist.values())
    if total <= 0:
        return None
    seen = 0.0
    for value in sorted(hist, key=int):
        seen += hist[value]
        if seen >= q * total:
            return float(value)
    return float(max(hist, key=int))


def _mean(pair: list[float]) -> float | None:
    return pair[0] / pair[1] if pair[1] > 0 else None


def _host_memory_per_gpu(e: dict) -> float | None:
    """The most resident memory the workflow's processes held on one host, per GPU of it there."""
    peaks = e.get("host_rss")
    if not peaks:
        return None
    gpus = Counter(str((g[2:] or ["?"])[0]).split("/")[0] for g in e["per_gpu"].values())
    return max(rss / max(1, gpus[host]) for host, rss in peaks.items())


def efficiency_fields(e: dict) -> dict:
    means = {uuid: g[0] / g[1] for uuid, g in e["per_gpu"].items() if g[1] > 0}
    per_gpu = list(means.values())
    slowest = min(means, key=means.get) if means else None
    return {
        "active_gpu_seconds": e["active_ms"] / 1000.0,
        "wasted_gpu_seconds": e["wasted_ms"] / 1000.0,
        "zero_util_gpu_seconds": e["zero_ms"] / 1000.0,
        "utilization_p50_pct": _percentile(e["hist"], 0.5),
        "utilization_p95_pct": _percentile(e["hist"], 0.95),
        "sm_active_mean_pct": _mean(e["sm"]),
        "tensor_active_mean_pct": _mean(e["tensor"]),
        "memory_peak_fraction": e["mem_peak"],
        "memory_mean_fraction": _mean(e["mem_frac"]),
        # Not in the schema: the job's totals take it (right-sizing judges memory by it where reported).
        "allocator_peak_fraction": e.get("alloc_peak"),
        "host_memory_per_gpu_bytes": _host_memory_per_gpu(e),
        "power_mean_watts": _mean(e["power"]),
        "gpu_imbalance_pct": (max(per_gpu) - min(per_gpu)) if per_gpu else None,
        "idle_gpus": sum(1 for u in per_gpu if u == 0),
        # Not in the WorkflowWindow schema: for the detectors' evidence only. Where each GPU at
        # 0 % is (host/gpuN, and its rank where the agent knows it), in the order they came.
        "idle_gpu_names": [(e["per_gpu"][uuid][2:] or [uuid])[0] for uuid, u in means.items() if u == 0],
        # Likewise: the GPUs no process opened in the whole window (allocated by the scheduler,
        # never touched), and other workflows whose processes ran on this one's GPUs.
        "untouched_gpu_names": [(e["per_gpu"][uuid][2:] or [uuid])[0] for uuid, t in e.get("touched", {}).items()
                                if not t and uuid in e["per_gpu"]],
        "opened_gpu_names": [(e["per_gpu"][uuid][2:] or [uuid])[0] for uuid, t in e.get("touched", {}).items()
                             if t and uuid in e["per_gpu"]],
        "foreign_workflows": sorted(e.get("foreign", {})),
        "hosts": sorted({str((g[2:] or ["?"])[0]).split("/")[0] for g in e["per_gpu"].values()}),
        "slowest_gpu": None if slowest is None else (e["per_gpu"][slowest][2:] or [slowest])[0],
        "slowest_gpu_pct": None if slowest is None else means[slowest],
        "throttled_gpu_seconds": e["throttled_ms"] / 1000.0,
        "xid_count": e["xids"],
        "ecc_uncorrected_max": e["ecc"],
        "workflow_cpu_mean_pct": _mean(e.get("cpu", [0.0, 0.0])),
        "host_iowait_mean_pct": _mean(e.get("iowait", [0.0, 0.0])),
        "model_mfu_pct": None if _mean(e.get("model", [0.0, 0.0])) is None else 100.0 * _mean(e["model"]),
    }
