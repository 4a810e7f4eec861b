"""A simulated serving deployment beside the simulated fleet (``gpufleet demo``): replicas of one
service on a host of their own, each a workflow of one GPU; the router sends the traffic to the
first ``active`` replicas only, so the others are planted idle and the deployment holds more
replicas than its peak needs. Each replica's traffic goes out as a ``ServingSample`` every
``every_ticks`` ticks, as an agent reading its engine's endpoint would send it (``--serving-
interval-s``). Everything is deterministic; ``planted`` says what the pipeline must find."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from producers.simulate.fleet import IDLE, SERVING, Fleet, Gpu, Workflow

SERVICE = "chat-llm"


@dataclass(frozen=True)
class ServingPlan:
    replicas: int = 6
    active: int = 2  # the replicas the router sends traffic to
    peak_per_s: float = 3.0  # the deployment's requests a second at its busiest
    every_ticks: int = 10


def with_serving(fleet: Fleet, plan: ServingPlan = ServingPlan()) -> Fleet:
    """``fleet`` and the deployment's replicas, on a host of their own."""
    replicas = tuple(Workflow(
        workflow_id=f"svc-{SERVICE}-{i}", owner="inference@example.com", team="llm",
        profile=SERVING if i < plan.active else IDLE, service=SERVICE,
        gpus=(Gpu("serve-host-000", i, f"GPU-5e7e-{i:04x}", "NVIDIA H100 80GB HBM3", 80 * 1024**3, 700.0, 1980),))
        for i in range(plan.replicas))
    return replace(fleet, workflows=(*fleet.workflows, *replicas))


def traffic_at(tick: int, ticks: int, plan: ServingPlan) -> float:
    """The deployment's requests a second at ``tick`` of ``ticks``: a day's curve, compressed."""
    return plan.peak_per_s * (0.3 + 0.7 * math.sin(math.pi * min(tick, ticks) / ticks) ** 2)


def share(i: int, plan: ServingPlan) -> float:
    """Replica ``i``'s share of the traffic: the router favours the first."""
    weights = [plan.active - k for k in range(plan.active)]
    return weights[i] / sum(weights) if i < plan.active else 0.0


def serving_samples_at(fleet: Fleet, tick: int, ticks: int, start_ms: int, interval_ms: int,
                       plan: ServingPlan = ServingPlan()) -> list[dict]:
    """The ``ServingSample``s of tick ``tick``: each replica's requests over the ticks since the last."""
    if tick % plan.every_ticks or tick == 0:
        return []
    out = []
    for w in (w for w in fleet.workflows if w.service):
        i = w.gpus[0].index
        requests = sum(traffic_at(t, ticks, plan) * share(i, plan) * interval_ms / 1000
                       for t in range(tick - plan.every_ticks, tick))
        out.append({
            "workflow_id": w.workflow_id, "host": w.gpus[0].host, "owner": w.owner, "team": w.team,
            "gpu_uuids": [w.gpus[0].uuid], "service": w.service, "engine": "vllm",
            "event_time": start_ms + tick * interval_ms, "interval_ms": plan.every_ticks * interval_ms,
            "requests": requests, "tokens": requests * 250, "running": None, "waiting": 0.0, "queue_time_ms": 40.0,
            "ttft_ms": 90.0, "kv_cache_usage": 0.3 if requests else 0.0, "batch_size": None})
    return out
