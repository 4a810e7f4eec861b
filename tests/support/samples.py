"""Builders of valid records for tests; override any field by keyword."""

BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z, a minute boundary


def sample(**overrides) -> dict:
    record = {
        "event_time": BASE_MS,
        "interval_ms": 1000,
        "host": "gpu-host-000",
        "gpu_index": 0,
        "gpu_uuid": "GPU-0",
        "gpu_model": "NVIDIA A100-SXM4-80GB",
        "workflow_id": "wf-a",
        "owner": "alice@example.com",
        "team": "vision",
        "utilization_pct": 50.0,
        "memory_utilization_pct": 30.0,
        "memory_used_bytes": 10 * 1024**3,
        "memory_total_bytes": 80 * 1024**3,
        "power_watts": 250.0,
        "temperature_c": 60.0,
        "sm_clock_mhz": 1410,
    }
    record.update(overrides)
    return record


def window(**overrides) -> dict:
    record = {
        "workflow_id": "wf-a",
        "version": 1,
        "owner": "alice@example.com",
        "team": "vision",
        "window_start": BASE_MS,
        "window_end": BASE_MS + 60_000,
        "sample_count": 120,
        "gpu_count": 2,
        "gpu_seconds": 120.0,
        "utilization_mean_pct": 50.0,
        "utilization_min_pct": 10.0,
        "utilization_max_pct": 90.0,
        "memory_used_mean_bytes": 1.0e10,
        "energy_joules": 30000.0,
        "active_gpu_seconds": 120.0,
        "wasted_gpu_seconds": 60.0,
        "zero_util_gpu_seconds": 0.0,
        "utilization_p50_pct": 50.0,
        "utilization_p95_pct": 88.0,
        "sm_active_mean_pct": None,
        "tensor_active_mean_pct": None,
        "memory_peak_fraction": 0.2,
        "memory_mean_fraction": 0.15,
        "power_mean_watts": 250.0,
        "gpu_imbalance_pct": 5.0,
        "idle_gpus": 0,
        "throttled_gpu_seconds": 0.0,
        "xid_count": 0,
        "ecc_uncorrected_max": None,
        "gpu_model": "NVIDIA H100 80GB HBM3",
        # goodput: half the GPU-seconds under the low-utilisation threshold, half productive
        **dict.fromkeys(("unhealthy_gpu_seconds", "startup_gpu_seconds", "idle_gpu_seconds",
                         "input_bound_gpu_seconds"), 0.0),
        "low_util_gpu_seconds": 60.0, "productive_gpu_seconds": 60.0,
        **dict.fromkeys(("unhealthy_joules", "startup_joules", "idle_joules", "input_bound_joules"), 0.0),
        "low_util_joules": 9000.0, "productive_joules": 21000.0,
        "unobserved_gpu_seconds": 0.0, "unobserved_joules": 0.0,
        "closed_at": BASE_MS + 75_000,
    }
    record.update(overrides)
    return record


def expected_windows(samples, size_ms: int = 60_000) -> dict[tuple[str, int], dict]:
    """Reference aggregation, written independently of streams.windows.utilization:
    (workflow, window start) -> the fields a WorkflowWindow must carry."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for s in samples:
        start = s["event_time"] // size_ms * size_ms
        groups.setdefault((s["workflow_id"], start), []).append(s)
    out = {}
    for (wf, start), rows in groups.items():
        def weighted_ms(r):
            return r["interval_ms"] * (1.0 if r.get("share") is None else r["share"])
        seconds = sum(weighted_ms(r) for r in rows) / 1000
        mem = [r["memory_used_bytes"] for r in rows if r["memory_used_bytes"] is not None]
        power = [(r["power_watts"], weighted_ms(r)) for r in rows if r["power_watts"] is not None]
        out[(wf, start)] = {
            "workflow_id": wf,
            "window_start": start,
            "window_end": start + size_ms,
            "sample_count": len(rows),
            "gpu_count": len({r["gpu_uuid"] for r in rows}),
            "gpu_seconds": seconds,
            "utilization_mean_pct": sum(r["utilization_pct"] * weighted_ms(r) for r in rows) / 1000 / seconds,
            "utilization_min_pct": min(r["utilization_pct"] for r in rows),
            "utilization_max_pct": max(r["utilization_pct"] for r in rows),
            "memory_used_mean_bytes": sum(mem) / len(mem) if mem else None,
            "energy_joules": sum(p * i / 1000 for p, i in power) if power else None,
        }
    return out


def assert_window_matches(actual: dict, expected: dict, rel: float = 1e-6) -> None:
    import pytest

    for field, value in expected.items():
        if isinstance(value, float):
            assert actual[field] == pytest.approx(value, rel=rel), field
        else:
            assert actual[field] == value, field


def batch_samples(samples: list[dict], per_tick: bool = True, max_samples: int = 1000) -> list[dict]:
    """Group samples into ``GpuSampleBatch`` records, in the order each group first appears:
    one per (host, workflow, event time), or with ``per_tick=False`` one per (host, workflow)
    over several ticks (its ``event_time`` is its first sample's), at most ``max_samples``
    samples each so that a backlog does not make a message too large for the broker."""
    groups: dict[tuple, list[dict]] = {}
    for s in samples:
        key = (s["host"], s["workflow_id"], s["event_time"] if per_tick else None)
        groups.setdefault(key, []).append(s)
    return [{"host": host, "workflow_id": wf, "event_time": members[i]["event_time"],
             "samples": members[i:i + max_samples]}
            for (host, wf, _), members in groups.items() for i in range(0, len(members), max_samples)]
