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

from gpufleet.reports.serving import STATES, peak_line, service_loads, service_parts
from gpufleet.web.access import Viewer
from gpufleet.web.data import MAX_POINTS, clean
from streams.serving.service import ServiceLoad, of_parts

# As `gpufleet serving` judges by default: a service's busiest 10 minutes, +20 % headroom.
SPAN_S, MARGIN = 600, 0.2


def _where(database: str, viewer: Viewer, since_s: float, service: str | None = None,
           team: str | None = None) -> tuple[str, dict]:
    """The serving windows the viewer may see, ending in the last ``since_s`` before the newest
    one (the fleet's now, also for a replayed history), of one service or all, one team's or all."""
    visible, params = viewer.where()
    where = (f"{visible} AND window_end >= (SELECT max(window_end) FROM {database}.serving_windows)"
             " - toIntervalSecond(%(since)s)")
    if service is not None:
        where += " AND service = %(service)s"
        params["service"] = service
    if team is not None:
        where += " AND ifNull(team, '') = %(team)s"
        params["team"] = team
    return where, {**params, "since": int(since_s)}


def _said(s: ServiceLoad) -> dict:
    """``s`` as the JSON twins say it (``load_of`` reads it back)."""
    return {"service": s.service, "span_s": SPAN_S, "margin": MARGIN, "replicas": s.replicas, "gpu_hours": s.gpu_hours,
            "idle_gpu_hours": s.idle_gpu_hours, "peak_start": s.peak_start, "peak_per_s": s.peak_per_s,
            "replicas_at_peak": s.replicas_at_peak, "replicas_needed": s.replicas_needed,
            "held_beyond_needed_gpu_hours": s.freed_gpu_hours, "saturated_windows": s.saturated_windows,
            "idle_tails_s": {wf: ms / 1000 for wf, ms in sorted(s.idle_tails.items())},
            "said": peak_line(s, SPAN_S, MARGIN) if s.peak_per_s > 0 else
            f"No replica of {s.service} served a request in this period: all {s.replicas} held their GPUs idle."}


def services(client, database: str, viewer: Viewer, since_s: float, team: str | None = None) -> list[dict]:
    """The viewer's services (of ``team``'s replicas only, where given), the one holding most
    GPU-hours beyond its need first."""
    where, params = _where(database, viewer, since_s, team=team)
    return clean([_said(s) for s in service_loads(client, database, where, params, SPAN_S, MARGIN).get("", [])])


def service(client, database: str, viewer: Viewer, name: str, since_s: float) -> dict | None:
    """One service as the viewer may see it: its load, each replica's traffic and how its windows
    were judged, and the service's requests a second and replicas over time (``chart``, in steps
    of a minute or more, at most ``MAX_POINTS``); None where the viewer sees no replica of it."""
    where, params = _where(database, viewer, since_s, name)
    parts = service_parts(client, database, where, params, SPAN_S).get(("", name))
    if parts is None:
        return None
    spans, replicas = parts
    load = of_parts(name, spans, replicas, SPAN_S * 1000, MARGIN)
    listed = [{"workflow_id": r.workflow_id, "gpu_hours": r.gpu_seconds / 3600, "requests": r.requests,
               "windows": sum(r.states.values()), **{state.lower(): r.states[state] for state in STATES},
               "capacity_per_s": r.capacity_per_s, "idle_tail_s": r.idle_tail_ms / 1000}
              for r in sorted(replicas, key=lambda r: (-r.idle_tail_ms, r.workflow_id))]
    first, last = min(r.first_start for r in replicas), max(r.last_end for r in replicas)
    return clean({**_said(load), "everyone": viewer.operator, "replica_list": listed,
                  "chart": _chart(client, database, where, params, first, last)})


def _chart(client, database: str, where: str, params: dict, first: int, last: int) -> dict:
    """Per step: the service's requests a second (over the time its windows cover), the replicas
    that held GPUs for it and those that served a request."""
    step_ms = 1000 * max(60, math.ceil((last - first) / 1000 / MAX_POINTS / 60) * 60)
    rows = client.query(f"""
        SELECT intDiv(toUnixTimestamp64Milli(window_start), {step_ms}) * {step_ms} AS t, sum(requests),
               toUnixTimestamp64Milli(max(window_end)) - toUnixTimestamp64Milli(min(window_start)),
               uniqExact(workflow_id), uniqExactIf(workflow_id, requests > 0)
        FROM {database}.serving_windows FINAL WHERE {where} GROUP BY t ORDER BY t""", parameters=params).result_rows
    return {"step_s": step_ms // 1000, "t": [r[0] for r in rows],
            "requests_per_s": [r[1] * 1000 / max(r[2], 1) for r in rows],
            "held": [r[3] for r in rows], "served": [r[4] for r in rows]}


def load_of(said: dict) -> ServiceLoad:
    """A service as ``_said`` says it, again as the ``ServiceLoad`` it was (``gpufleet serving
    --url`` prints it as the command does from the database)."""
    return ServiceLoad(said["service"], said["replicas"], said["gpu_hours"], said["idle_gpu_hours"], said["peak_start"],
                       said["peak_per_s"], said["replicas_at_peak"], said["replicas_needed"],
                       said["held_beyond_needed_gpu_hours"], said["saturated_windows"],
                       {wf: round(s * 1000) for wf, s in said["idle_tails_s"].items()})
