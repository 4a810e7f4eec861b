"""A serving replica judged by the traffic it serves: its ``ServingSample``s into the event-time
windows of its GPU samples, and each closed window judged.

A workflow is a serving replica once a ``ServingSample`` of it arrives; its state then holds
``serving`` (the dict below, in the workflow's entry of the window-state table). Each window of
the replica is, by its requests a second against the capacity the replica showed itself:

========== ================================================================================
BUSY       traffic within ``headroom_margin`` of the replica's capacity
HEADROOM   traffic below that: spare capacity a service keeps for its peaks, not waste
IDLE       no request in the window: GPU time held for no traffic
SATURATED  requests waited longer than ``queue_target_ms`` on average (or, where the engine
           reports no queue time, some request waited at every reading): too few replicas
========== ================================================================================

The capacity is the requests a second of the replica's busiest window so far that served
within the queue target, stated with the window it came from and how many windows it was learnt
from. The detectors ``idle_replica`` and ``saturated`` (``streams.alerts.detectors``) read the
figures ``close`` returns; the detectors of how a training job uses its GPUs stand aside for a
replica (``streams.alerts.raising``): a replica at 5 % that answers every request is doing its job.
"""

from __future__ import annotations

from dataclasses import dataclass

from streams.alerts.detectors import DetectorConfig

BUSY, HEADROOM, IDLE, SATURATED = "BUSY", "HEADROOM", "IDLE", "SATURATED"
WORKING = "WORKING"  # a declared replica whose engine tells nothing: its GPUs did some work


@dataclass(frozen=True)
class Declared:
    """The workflows a site declares serving replicas by what their scheduler says of them (a
    Slurm partition or QoS, a Kubernetes namespace: ``gpufleet worker --serving-partitions``,
    ``--serving-qos``), whether or not their engine's metrics are read: a replica like any other
    to the detectors of how GPUs are used, which stand aside. Where no reading of its engine comes,
    its windows are judged by its GPUs alone (``by_gpus``)."""

    partitions: frozenset[str] = frozenset()
    qos: frozenset[str] = frozenset()

    def says(self, partition: str | None, qos: str | None) -> bool:
        return (partition is not None and partition in self.partitions) or (qos is not None and qos in self.qos)


def declared(by: str) -> dict:
    """The traffic state of a replica declared by ``by`` (its partition or QoS), before any reading."""
    return {"service": by}


def read(serving: dict) -> bool:
    """Whether any reading of the replica's engine has come (else it is judged by its GPUs)."""
    return "last_time" in serving


def by_gpus(serving: dict, window: dict) -> dict:
    """The figures of a closed window of a declared replica whose engine's metrics do not come: its
    GPUs at 0 % the whole window served no request (an engine that answers one uses its GPU), any
    work at all counts as serving; idle time runs from the end of its last window that worked."""
    start, end = window["window_start"], window["window_end"]
    if window.get("sample_count", 1) > 0 and (window.get("utilization_max_pct") or 0.0) <= 0.0:
        state = IDLE
        serving["idle_since"] = serving.get("idle_since", serving.get("last_request_end", start))
    else:
        state = WORKING
        serving["last_request_end"] = end
        serving.pop("idle_since", None)
    return {"state": state, "service": serving.get("service", ""), "requests": None, "requests_per_s": None,
            "queue_time_ms": None, "waiting_max": None, "capacity_per_s": None, "judged_by": "gpus",
            "idle_since": serving.get("idle_since")}


def _empty() -> dict:
    return {"requests": 0.0, "tokens": None, "seconds": 0.0, "queue_w": 0.0, "queue_n": 0.0, "ttft_w": 0.0,
            "ttft_n": 0.0, "waiting_max": None, "waiting_min": None, "readings": 0}


def add(serving: dict, record: dict, offset: int, size_ms: int) -> str | None:
    """Add a checked ``ServingSample`` (at ``offset`` of its partition) to its window's figures.
    Returns why it cannot be (its window closed already), or None; a sample read again after a
    restart (at or before the last offset added) is skipped."""
    if offset <= serving.get("offset", -1):
        return None
    serving["offset"] = offset
    start = record["event_time"] // size_ms * size_ms
    if start <= serving.get("closed_through", -1):
        return (f"serving sample at {record['event_time']}: its window ({start}) had closed; the replica's "
                "samples must reach the worker with its GPU samples")
    last = serving.get("last_time")
    if last is not None and record["event_time"] - record["interval_ms"] > last:
        serving["resumed"] = start  # its readings stopped for a while: its idle time counts again from here
    serving["last_time"] = max(last if last is not None else -1, record["event_time"])
    serving["service"], serving["engine"] = record["service"], record["engine"]
    acc = serving.setdefault("windows", {}).setdefault(str(start), _empty())
    requests = record["requests"]
    acc["requests"] += requests
    acc["seconds"] += record["interval_ms"] / 1000
    acc["readings"] += 1
    if record.get("tokens") is not None:
        acc["tokens"] = (acc["tokens"] or 0.0) + record["tokens"]
    if record.get("queue_time_ms") is not None and requests > 0:
        acc["queue_w"] += record["queue_time_ms"] * requests
        acc["queue_n"] += requests
    if record.get("ttft_ms") is not None and requests > 0:
        acc["ttft_w"] += record["ttft_ms"] * requests
        acc["ttft_n"] += requests
    waiting = record.get("waiting")
    if waiting is not None:
        acc["waiting_max"] = max(acc["waiting_max"] or 0.0, waiting)
        acc["waiting_min"] = waiting if acc["waiting_min"] is None else min(acc["waiting_min"], waiting)
    return None


def unmatched(serving: dict, windows: dict, watermark: int | None, size_ms: int) -> list[int]:
    """The starts of the replica's windows of traffic that the watermark has passed with no GPU
    window of theirs open (``windows``: the workflow's open GPU windows): their GPU samples did not
    come, or came too late to be judged with them. Judged by traffic alone (``close`` with a
    window of no GPU), so what the replica served is never dropped unseen."""
    if watermark is None:
        return []
    return sorted(int(k) for k in serving.get("windows", {}) if int(k) + size_ms <= watermark and k not in windows)


def without_gpus(workflow_id: str, owner: str | None, team: str | None, start: int, size_ms: int) -> dict:
    """The window ``close`` judges a window of traffic by where no GPU window came: no GPU, no
    GPU-second (0 % as a window of unobserved time only has)."""
    return {"workflow_id": workflow_id, "owner": owner, "team": team, "window_start": start,
            "window_end": start + size_ms, "gpu_count": 0, "gpu_seconds": 0.0, "utilization_mean_pct": 0.0}


def before(serving: dict, start: int) -> list[int]:
    """The starts of the replica's windows of traffic before ``start``, still to judge: a GPU window
    after them is closing, so none of theirs will (judge each alone, ``without_gpus``, first)."""
    return sorted(int(k) for k in serving.get("windows", {}) if int(k) < start)


def close(serving: dict, window: dict, config: DetectorConfig, now_ms: int) -> tuple[dict, dict]:
    """A closed window of the replica: (the figures its detectors judge, its ``ServingWindow``).
    The windows of traffic before it are judged first (``before``, ``unmatched``)."""
    start, end = window["window_start"], window["window_end"]
    acc = serving.setdefault("windows", {}).pop(str(start), None) or _empty()
    serving["closed_through"] = max(serving.get("closed_through", -1), start)
    span_s = max(1e-9, (end - start) / 1000)
    rps = acc["requests"] / span_s
    queue_ms = acc["queue_w"] / acc["queue_n"] if acc["queue_n"] else None
    saturated = (queue_ms > config.queue_target_ms if queue_ms is not None
                 else (acc["waiting_min"] or 0) > 0 and acc["requests"] > 0)
    if acc["requests"] > 0 and not saturated:
        serving["capacity_windows"] = serving.get("capacity_windows", 0) + 1
        if rps > serving.get("capacity", 0.0):
            serving["capacity"], serving["capacity_at"] = rps, start
    capacity = serving.get("capacity")
    resumed = serving.pop("resumed") if serving.get("resumed", end) < end else None
    if acc["requests"] <= 0:
        state = IDLE
        since = serving.get("idle_since", serving.get("last_request_end", start))
        serving["idle_since"] = since if resumed is None else max(since, resumed)
    else:
        serving["last_request_end"] = end
        serving.pop("idle_since", None)
        state = SATURATED if saturated else BUSY if capacity and rps >= (1 - config.headroom_margin) * capacity \
            else HEADROOM
    figures = {"state": state, "service": serving.get("service", ""), "requests": acc["requests"],
               "requests_per_s": rps, "queue_time_ms": queue_ms, "waiting_max": acc["waiting_max"],
               "capacity_per_s": capacity, "idle_since": serving.get("idle_since")}
    record = {
        "workflow_id": window["workflow_id"], "owner": window.get("owner"), "team": window.get("team"),
        "service": figures["service"], "engine": serving.get("engine", ""), "window_start": start,
        "window_end": end, "gpu_count": window["gpu_count"], "gpu_seconds": window["gpu_seconds"],
        "utilization_mean_pct": window["utilization_mean_pct"], "requests": acc["requests"],
        "requests_per_s": rps, "tokens_per_s": None if acc["tokens"] is None else acc["tokens"] / span_s,
        "queue_time_ms": queue_ms, "ttft_ms": acc["ttft_w"] / acc["ttft_n"] if acc["ttft_n"] else None,
        "waiting_max": acc["waiting_max"], "capacity_per_s": capacity,
        "capacity_window_start": serving.get("capacity_at"), "capacity_windows": serving.get("capacity_windows", 0),
        "state": state, "idle_since": figures["idle_since"] if state == IDLE else None, "closed_at": now_ms,
    }
    return figures, record
