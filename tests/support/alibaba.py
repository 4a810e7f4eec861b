"""Alibaba's public GenAI serving trace (``../shared/datasets/alibaba-genai-2026``, read from
there, never copied: its SOURCES.md) replayed through the window stage's step in process, in
event-time order, with the worker's default settings: each of its 143 containers a workflow of
one GPU, each duty-cycle sample (one every ~57 s) a GPU sample standing for the time to the next
one (at most 120 s); after the last sample the fleet's clock moves on an hour, as a quiet
partition follows the others', so every workflow ends by silence."""

from __future__ import annotations

import csv
import io
import tarfile
from collections import defaultdict
from pathlib import Path

from schemas.sample_columns import CLOCK, columns_of
from streams.settings import StreamSettings
from streams.stages.window_step import Decoded, WindowStep

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "datasets" / "alibaba-genai-2026"
MAX_INTERVAL_S = 120


def duty_cycles(hours: float | None) -> dict[str, list[tuple[int, float]]]:
    with tarfile.open(DATA / "pod_gpu_duty_cycle_anon.tar.gz") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".csv"))
        rows = csv.DictReader(io.TextIOWrapper(tar.extractfile(member)))
        series: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for r in rows:
            series[r["container_ip"]].append((int(float(r["timestamp_anon"])), float(r["value"])))
    first = min(t for s in series.values() for t, _ in s)
    out = {}
    for ip, points in series.items():
        points = sorted(p for p in points if hours is None or p[0] - first < hours * 3600)
        if points:
            out[ip] = points
    return out


def samples(series: dict[str, list[tuple[int, float]]]) -> dict[int, list[dict]]:
    by_time: dict[int, list[dict]] = defaultdict(list)
    for ip, points in series.items():
        for (t, util), nxt in zip(points, [*points[1:], None]):
            gap = MAX_INTERVAL_S if nxt is None else min(nxt[0] - t, MAX_INTERVAL_S)
            by_time[t].append({
                "event_time": t * 1000, "interval_ms": gap * 1000, "host": f"ali-{ip[:8]}", "gpu_index": 0,
                "gpu_uuid": f"GPU-{ip[:12]}", "gpu_model": "NVIDIA A10", "workflow_id": f"ali-{ip[:12]}",
                "owner": "serving", "team": "genai", "utilization_pct": min(100.0, max(0.0, util)),
                "memory_utilization_pct": None, "memory_used_bytes": None, "memory_total_bytes": None,
                "power_watts": None, "temperature_c": None, "sm_clock_mhz": None})
    return by_time


def replay(by_time: dict[int, list[dict]]) -> list[tuple]:
    last = max(by_time)
    # The worker's defaults; a replay's partition is quiet at once (no wall time passes in it).
    settings = StreamSettings(bootstrap="-", idle_partition_s=0.0)
    step = WindowStep(settings, {}, {}, clock=lambda: (last + 86_400) * 1000)
    sent, offset = [], 0
    for t in sorted(by_time):
        batch = [Decoded(i, "GpuSampleColumns", b, offset + i) for i, b in enumerate(columns_of(by_time[t]))]
        offset += len(batch)
        sent += step.samples(0, batch, t * 1000).records
    # The fleet's clock runs on past the last sample (a quiet partition follows the others' clock,
    # as a PartitionClock tells it): every workflow ends by silence, as the live worker ends them.
    later = (last + 3600) * 1000
    clock = Decoded(0, CLOCK, {"event_time": later, "worker": "replay", "sent_at": later}, offset)
    return sent + step.samples(0, [clock], later).records


