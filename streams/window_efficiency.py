"""The efficiency part of a workflow window: where its GPU-seconds went.

Accumulated alongside ``window_utilization`` (same windows, same weights: a sample counts
for its interval times the workflow's share of the GPU) and emitted in ``WorkflowWindow``:
active, wasted and 0 %-utilisation GPU-seconds, the utilisation's median and 95th
percentile (exact: NVML reports whole percents, kept as a histogram of 101 values), SM and
tensor activity where the GPU reports them (GPM), memory peak and mean fraction, mean
power, per-GPU balance, time under power or thermal clock limits, hardware faults, and the
workflow's CPU on its hosts with their I/O wait (from the agent, on each GPU sample).
"""

from __future__ import annotations

# NVML clock-event reasons that mean "slowed down by power or heat" (nvmlClocksEventReason*).
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # SW power cap, HW slowdown, SW/HW thermal, power brake


def new_efficiency() -> dict:
    return {
        "active_ms": 0.0, "wasted_ms": 0.0, "zero_ms": 0.0, "hist": {}, "sm": [0.0, 0.0], "tensor": [0.0, 0.0],
        "mem_peak": None, "mem_frac": [0.0, 0.0], "power": [0.0, 0.0], "per_gpu": {}, "throttled_ms": 0.0,
        "xids": 0, "ecc": None, "cpu": [0.0, 0.0], "iowait": [0.0, 0.0],
    }


def add_efficiency(e: dict, r: dict, w: float) -> None:
    """One sample of weight ``w`` (interval x share, in ms)."""
    util = r["utilization_pct"]
    if util > 0:
        e["active_ms"] += w
    else:
        e["zero_ms"] += w
    e["wasted_ms"] += w * (1.0 - util / 100.0)
    bucket = str(round(util))
    e["hist"][bucket] = e["hist"].get(bucket, 0.0) + w
    for key, field in (("sm", "sm_active_pct"), ("tensor", "tensor_active_pct"), ("power", "power_watts"),
                       ("cpu", "workflow_cpu_pct"), ("iowait", "host_iowait_pct")):
        value = r.get(field)
        if value is not None:
            e[key][0] += value * w
            e[key][1] += w
    used, total = r.get("memory_used_bytes"), r.get("memory_total_bytes")
    if used is not None and total:
        fraction = used / total
        e["mem_peak"] = fraction if e["mem_peak"] is None else max(e["mem_peak"], fraction)
        e["mem_frac"][0] += fraction * w
        e["mem_frac"][1] += w
    # With where the GPU is, so an imbalance can name the straggler (a rank's host and GPU).
    gpu = e["per_gpu"].setdefault(r["gpu_uuid"], [0.0, 0.0, f'{r.get("host")}/gpu{r.get("gpu_index")}'])
    gpu[0] += util * w
    gpu[1] += w
    if (r.get("clock_event_reasons") or 0) & THROTTLE_MASK:
        e["throttled_ms"] += w
    e["xids"] += len(r.get("xids") or ())
    ecc = r.get("ecc_uncorrected_volatile")
    if ecc is not None:
        e["ecc"] = ecc if e["ecc"] is None else max(e["ecc"], ecc)


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
        "power_mean_watts": _mean(e["power"]),
        "gpu_imbalance_pct": (max(per_gpu) - min(per_gpu)) if per_gpu else None,
        "idle_gpus": sum(1 for u in per_gpu if u == 0),
        # Not in the WorkflowWindow schema: for the detectors' evidence only.
        "slowest_gpu": None if slowest is None else (e["per_gpu"][slowest][2:] or [slowest])[0],
        "slowest_gpu_pct": None if slowest is None else means[slowest],
        "throttled_gpu_seconds": e["throttled_ms"] / 1000.0,
        "xid_count": e["xids"],
        "ecc_uncorrected_max": e["ecc"],
        "workflow_cpu_mean_pct": _mean(e.get("cpu", [0.0, 0.0])),
        "host_iowait_mean_pct": _mean(e.get("iowait", [0.0, 0.0])),
    }
