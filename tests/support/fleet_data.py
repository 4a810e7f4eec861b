"""A simulated fleet's records, computed like the worker does and stored like the sink does,
with the totals the storage tests check ClickHouse against, computed here from the samples."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

from producers.simulate.fleet import build_fleet
from schemas.vocabulary import WASTE_BUCKETS, wasted_seconds
from sinks.clickhouse_ddl import (
    FINDINGS_TABLE,
    GPU_SAMPLES_TABLE,
    WORKFLOW_EVENTS_TABLE,
    WORKFLOW_WINDOWS_TABLE,
)
from sinks.write_clickhouse import ClickHouseWriter, Row
from streams.windows.batches import Incoming, WindowConfig
from streams.windows.utilization import WindowAggregator

INTERVAL_MS = 10_000
TICKS = 120  # 20 minutes
# Planted antipatterns: (workflow number, rule, GPU-seconds at stake).
SMALL_MEMORY = 4  # the workflow that uses a tenth of its GPUs' memory
PLANTED_FINDINGS = ((1, "input_pipeline_stall", 5400.0), (3, "launch_bound", 900.0))


@dataclass
class FleetData:
    fleet: object
    start_ms: int
    samples: list[dict]
    windows: list[dict]
    findings: list[dict]
    frameworks: dict[str, str]
    # cause -> workflow -> GPU-seconds, from the samples
    waste: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))


def build(seed: int = 11) -> FleetData:
    fleet = build_fleet(seed=seed, hosts=4, gpus_per_host=8, workflows=8)
    # Whole minutes, ending well before now: inside "--since 7d", outside "--since 1m".
    start_ms = (int(time.time() * 1000) - 3_600_000) // 60_000 * 60_000
    samples = [s for t in range(TICKS) for s in fleet.samples_at(t, start_ms, INTERVAL_MS)]
    # Planted: workflow 4 never holds more than a tenth of its GPUs' memory.
    small = fleet.workflows[SMALL_MEMORY].workflow_id
    samples = [{**s, "memory_used_bytes": s["memory_total_bytes"] // 10} if s["workflow_id"] == small else s
               for s in samples]
    # The sentinel closes every window: it is an hour ahead of now, the aggregator told it is not.
    agg = WindowAggregator(WindowConfig(size_ms=60_000, allowed_lateness_ms=0, retention_ms=3_600_000), {},
                           clock=lambda: start_ms + 7_200_000)
    sentinel = {**samples[0], "workflow_id": "wf-sentinel", "event_time": start_ms + 7_200_000}
    batch = [Incoming.row(i, s) for i, s in enumerate([*samples, sentinel])]
    windows = [w for w in agg.process(0, batch, closed_at=start_ms + 7_200_000).closed
               if w["workflow_id"] != "wf-sentinel"]
    wfs = fleet.workflows
    findings = [{
        "finding_id": f"f-{n}", "trace_id": f"trace-{n}", "workflow_id": wfs[n].workflow_id, "rank": 0,
        "rule": rule, "severity": "WARNING", "title": rule, "evidence": "planted", "gpu_seconds_at_stake": at_stake,
        "recommendation": "fix it", "detected_at": start_ms + 600_000,
    } for n, rule, at_stake in PLANTED_FINDINGS]
    frameworks = {w.workflow_id: ("torch 2.5.1" if i % 2 else "jax 0.4.35") for i, w in enumerate(wfs)}
    data = FleetData(fleet, start_ms, samples, windows, findings, frameworks)
    # The waste of a window is its waste buckets (schemas.vocabulary), which with the productive
    # bucket hold exactly the GPU-seconds its samples were allocated for.
    allocated = defaultdict(float)
    for s in samples:
        allocated[s["workflow_id"]] += s["interval_ms"] / 1000 * (s.get("share") or 1.0)
    bucketed = defaultdict(float)
    for w in windows:
        for b in WASTE_BUCKETS:
            data.waste[b][w["workflow_id"]] += w[f"{b}_gpu_seconds"]
        bucketed[w["workflow_id"]] += wasted_seconds(w) + w["productive_gpu_seconds"]
    assert bucketed.keys() == allocated.keys() and all(abs(bucketed[k] - allocated[k]) < 1e-6 for k in allocated)
    for f in findings:
        data.waste[f"antipattern:{f['rule']}"][f["workflow_id"]] += f["gpu_seconds_at_stake"]
    return data


def store(writer: ClickHouseWriter, data: FleetData) -> None:
    writer.ensure_tables()
    assert writer.insert(GPU_SAMPLES_TABLE, [Row(0, i, s) for i, s in enumerate(data.samples)]) == []
    assert writer.insert(WORKFLOW_WINDOWS_TABLE, [Row(0, i, w) for i, w in enumerate(data.windows)]) == []
    assert writer.insert(FINDINGS_TABLE, [Row(0, i, f) for i, f in enumerate(data.findings)]) == []
    events = []
    for w in data.fleet.workflows:
        framework, version = data.frameworks[w.workflow_id].split()
        for event, at in (("started", data.start_ms), ("heartbeat", data.start_ms + 60_000)):
            events.append({
                "workflow_id": w.workflow_id, "event": event, "event_time": at, "host": w.gpus[0].host,
                "owner": w.owner, "team": w.team, "gpu_uuids": [g.uuid for g in w.gpus], "pids": [100],
                "cmdline": "python train.py", "framework": framework if event == "heartbeat" else None,
                "framework_version": version if event == "heartbeat" else None,
                "scheduler_job_id": None, "attribution": "env", "model": f"model-{w.workflow_id[-1]}",
                "cluster": "east" if w.gpus[0].host < "gpu-host-002" else "west"})
    assert writer.insert(WORKFLOW_EVENTS_TABLE, [Row(0, i, e) for i, e in enumerate(events)]) == []


def started(w) -> dict:
    """The WorkflowEvent its agent sends when workflow ``w`` starts on its first host (now)."""
    now = int(time.time() * 1000)
    return {"workflow_id": w.workflow_id, "event": "STARTED", "event_time": now, "host": w.gpus[0].host,
            "owner": w.owner, "team": w.team, "gpu_uuids": [g.uuid for g in w.gpus], "pids": [100],
            "cmdline": "python train.py", "framework": None, "framework_version": None, "scheduler_job_id": "4242",
            "attribution": "env", "model": None, "cluster": None}
