"""A serving owner's services on the owners' service: each service (the replicas of one model or
deployment) as ``gpufleet serving`` judges it (``gpufleet.reports.serving``, called here, not
copied), over the replicas the viewer may see (``Viewer.where``): its replicas held against the
replicas its busiest span needed, the GPU-hours held beyond them, and each replica's traffic.

An owner sees the replicas that are theirs or their teams'; an operator every one. Where a
service's replicas belong to several owners, an owner's view of it is their replicas alone, and
the page says so; a service with no replica the viewer may see is answered as one that does not
exist.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from gpufleet.reports.serving import COLUMNS, loads_of, peak_line, serving_sql
from gpufleet.web.access import Viewer
from gpufleet.web.data import MAX_POINTS, clean
from streams.serving.service import ServiceLoad

# As `gpufleet serving` judges by default: a service's busiest 10 minutes, +20 % headroom.
SPAN_S, MARGIN = 600, 0.2


def _windows(client, database: str, viewer: Viewer, since_s: float, service: str | None = None) -> list[tuple]:
    """The serving windows the viewer may see, ending in the last ``since_s`` before the newest
    one (the fleet's now, also for a replayed history), of one service or all."""
    visible, params = viewer.where()
    where = (f"{visible} AND window_end >= (SELECT max(window_end) FROM {database}.serving_windows)"
             " - toIntervalSecond(%(since)s)")
    if service is not None:
        where += " AND service = %(service)s"
        params["service"] = service
    return client.query(serving_sql(database, None, where), parameters={**params, "since": int(since_s)}).result_rows


def _said(s: ServiceLoad) -> dict:
    """``s`` as the JSON twins say it (``load_of`` reads it back)."""
    return {"service": s.service, "span_s": SPAN_S, "margin": MARGIN, "replicas": s.replicas, "gpu_hours": s.gpu_hours,
            "idle_gpu_hours": s.idle_gpu_hours, "peak_start": s.peak_start, "peak_per_s": s.peak_per_s,
            "replicas_at_peak": s.replicas_at_peak, "replicas_needed": s.replicas_needed,
            "held_beyond_needed_gpu_hours": s.freed_gpu_hours, "saturated_windows": s.saturated_windows,
            "idle_tails_s": {wf: ms / 1000 for wf, ms in sorted(s.idle_tails.items())},
            "said": peak_line(s, SPAN_S, MARGIN) if s.peak_per_s > 0 else
            f"No replica of {s.service} served a request in this period: all {s.replicas} held their GPUs idle."}


def services(client, database: str, viewer: Viewer, since_s: float) -> list[dict]:
    """The viewer's services, the one holding most GPU-hours beyond its need first."""
    return clean([_said(s) for s in loads_of(_windows(client, database, viewer, since_s), SPAN_S, MARGIN)])


def service(client, database: str, viewer: Viewer, name: str, since_s: float) -> dict | None:
    """One service as the viewer may see it: its load, each replica's traffic and how its windows
    were judged, and the service's requests a second and replicas over time (``chart``, in steps
    of a minute or more, at most ``MAX_POINTS``); None where the viewer sees no replica of it."""
    rows = _windows(client, database, viewer, since_s, name)
    if not rows:
        return None
    (load,) = loads_of(rows, SPAN_S, MARGIN)
    windows = [dict(zip(COLUMNS, r, strict=True)) for r in rows]
    replicas: dict[str, dict] = {}
    for w in windows:
        r = replicas.setdefault(w["workflow_id"], {"workflow_id": w["workflow_id"], "gpu_hours": 0.0, "requests": 0.0,
                                                   "states": Counter(), "capacity_per_s": None})
        r["gpu_hours"] += w["gpu_seconds"] / 3600
        r["requests"] += w["requests"]
        r["states"][w["state"]] += 1
        if w["capacity_per_s"] is not None:  # (the largest it had: what the replicas needed were counted with)
            r["capacity_per_s"] = max(r["capacity_per_s"] or 0.0, w["capacity_per_s"])
    listed = []
    for r in sorted(replicas.values(), key=lambda r: (-load.idle_tails[r["workflow_id"]], r["workflow_id"])):
        states = r.pop("states")
        listed.append({**r, "windows": sum(states.values()), **{s.lower(): states[s] for s in
                                                                ("BUSY", "HEADROOM", "SATURATED", "IDLE")},
                       "idle_tail_s": load.idle_tails[r["workflow_id"]] / 1000})
    return clean({**_said(load), "everyone": viewer.operator, "replica_list": listed, "chart": _chart(windows)})


def _chart(windows: list[dict]) -> dict:
    """Per step: the service's requests a second, the replicas that held GPUs for it and those that
    served a request."""
    first = min(w["window_start"] for w in windows)
    last = max(w["window_end"] for w in windows)
    step_ms = 1000 * max(60, math.ceil((last - first) / 1000 / MAX_POINTS / 60) * 60)
    steps: dict[int, list] = defaultdict(lambda: [0.0, set(), set(), None, None])  # requests, held, served, from, to
    for w in windows:
        s = steps[w["window_start"] // step_ms * step_ms]
        s[0] += w["requests"]
        s[1].add(w["workflow_id"])
        if w["requests"] > 0:
            s[2].add(w["workflow_id"])
        s[3] = w["window_start"] if s[3] is None else min(s[3], w["window_start"])
        s[4] = w["window_end"] if s[4] is None else max(s[4], w["window_end"])
    t = sorted(steps)
    return {"step_s": step_ms // 1000, "t": t,
            "requests_per_s": [steps[k][0] * 1000 / max(steps[k][4] - steps[k][3], 1) for k in t],
            "held": [len(steps[k][1]) for k in t], "served": [len(steps[k][2]) for k in t]}


def load_of(said: dict) -> ServiceLoad:
    """A service as ``_said`` says it, again as the ``ServiceLoad`` it was (``gpufleet serving
    --service`` prints it as the command does from the database)."""
    return ServiceLoad(said["service"], said["replicas"], said["gpu_hours"], said["idle_gpu_hours"], said["peak_start"],
                       said["peak_per_s"], said["replicas_at_peak"], said["replicas_needed"],
                       said["held_beyond_needed_gpu_hours"], said["saturated_windows"],
                       {wf: round(s * 1000) for wf, s in said["idle_tails_s"].items()})
