"""Alibaba's public GenAI serving trace (``../shared/datasets/alibaba-genai-2026``, read from
there, never copied: its SOURCES.md) replayed through the window stage's step in process, in
event-time order, with the worker's default settings: each of its 143 containers a workflow of
one GPU, each duty-cycle sample (one every ~57 s) a GPU sample standing for the time to the next
one (at most 120 s); after the last sample the fleet's clock moves on an hour, as a quiet
partition follows the others', so every workflow ends by silence.

With ``traffic``, each sample has its ``ServingSample`` beside it, as an agent reading the
replica's engine would send: the requests the container served in the sample's interval, from
``qps.csv`` (its ``Generative Requests`` per container, one row every ``QPS_PERIOD_S`` that had
requests: a period with no row served none). A row counts at the first reading at or after
its time (two of its 23,513 rows fall between a container's duty-cycle samples).
A serving reading stands for the time since the reading before (as an engine's counters read
at each tick do); a GPU sample, for the time to the next."""

from __future__ import annotations

import bisect
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
QPS_PERIOD_S = 57  # qps.csv's rows are this far apart: a row's requests are its rate over this


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


def qps() -> dict[str, dict[int, float]]:
    """Each container's requests a second, by sample time (the times of its duty-cycle samples)."""
    with tarfile.open(DATA / "qps.tar.gz") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".csv"))
        out: dict[str, dict[int, float]] = defaultdict(dict)
        for r in csv.DictReader(io.TextIOWrapper(tar.extractfile(member))):
            if r["container_ip"] and r["request_type"] == "Generative Requests":
                out[r["container_ip"]][int(float(r["timestamp_anon"]))] = float(r["value"])
    return out


def gaps(points: list[tuple[int, float]]) -> list[int]:
    """The seconds each sample stands for: to the next one, at most ``MAX_INTERVAL_S``."""
    return [MAX_INTERVAL_S if nxt is None else min(nxt[0] - t, MAX_INTERVAL_S)
            for (t, _), nxt in zip(points, [*points[1:], None])]


def requests_of(points: list[tuple[int, float]], rates: dict[int, float]) -> list[float]:
    """The requests each reading counts, as an engine's counter read at each sample would: each
    qps row's rate over ``QPS_PERIOD_S``, counted at the first sample at or after it (rows after
    the last sample were never read)."""
    times = [t for t, _ in points]
    out = [0.0] * len(points)
    for t, rate in rates.items():
        i = bisect.bisect_left(times, t)
        if i < len(out):
            out[i] += rate * QPS_PERIOD_S
    return out


def since_last(points: list[tuple[int, float]]) -> list[int]:
    """The seconds each reading stands for: since the one before, at most ``MAX_INTERVAL_S``
    (the first: ``QPS_PERIOD_S``)."""
    return [QPS_PERIOD_S if prev is None else min(t - prev[0], MAX_INTERVAL_S)
            for (t, _), prev in zip(points, [None, *points[:-1]])]


def traffic(series: dict[str, list[tuple[int, float]]], rates: dict[str, dict[int, float]]) -> dict[int, list[dict]]:
    """The ``ServingSample`` of every duty-cycle sample, by time: the requests since the reading
    before (``requests_of``), over the time since it (``since_last``)."""
    by_time: dict[int, list[dict]] = defaultdict(list)
    for ip, points in series.items():
        for (t, _), gap, requests in zip(points, since_last(points), requests_of(points, rates.get(ip, {}))):
            by_time[t].append({
                "workflow_id": f"ali-{ip[:12]}", "host": f"ali-{ip[:8]}", "owner": "serving", "team": "genai",
                "gpu_uuids": [f"GPU-{ip[:12]}"], "service": "stable-diffusion", "engine": "recorded",
                "event_time": t * 1000, "interval_ms": gap * 1000, "requests": requests,
                "tokens": None, "running": None, "waiting": None, "queue_time_ms": None, "ttft_ms": None,
                "kv_cache_usage": None, "batch_size": None})
    return by_time


def samples(series: dict[str, list[tuple[int, float]]]) -> dict[int, list[dict]]:
    by_time: dict[int, list[dict]] = defaultdict(list)
    for ip, points in series.items():
        for (t, util), gap in zip(points, gaps(points)):
            by_time[t].append({
                "event_time": t * 1000, "interval_ms": gap * 1000, "host": f"ali-{ip[:8]}", "gpu_index": 0,
                "gpu_uuid": f"GPU-{ip[:12]}", "gpu_model": "NVIDIA A10", "workflow_id": f"ali-{ip[:12]}",
                "owner": "serving", "team": "genai", "utilization_pct": min(100.0, max(0.0, util)),
                "memory_utilization_pct": None, "memory_used_bytes": None, "memory_total_bytes": None,
                "power_watts": None, "temperature_c": None, "sm_clock_mhz": None})
    return by_time


def replay(by_time: dict[int, list[dict]], serving: dict[int, list[dict]] | None = None) -> list[tuple]:
    last = max(by_time)
    # The worker's defaults; a replay's partition is quiet at once (no wall time passes in it).
    settings = StreamSettings(bootstrap="-", idle_partition_s=0.0)
    step = WindowStep(settings, {}, {}, clock=lambda: (last + 86_400) * 1000)
    sent, offset = [], 0
    for t in sorted(by_time):
        records = [("ServingSample", r) for r in (serving or {}).get(t, [])]
        records += [("GpuSampleColumns", b) for b in columns_of(by_time[t])]
        batch = [Decoded(i, name, r, offset + i) for i, (name, r) in enumerate(records)]
        offset += len(batch)
        sent += step.samples(0, batch, t * 1000).records
    # The fleet's clock runs on past the last sample (a quiet partition follows the others' clock,
    # as a PartitionClock tells it): every workflow ends by silence, as the live worker ends them.
    later = (last + 3600) * 1000
    clock = Decoded(0, CLOCK, {"event_time": later, "worker": "replay", "sent_at": later}, offset)
    return sent + step.samples(0, [clock], later).records


