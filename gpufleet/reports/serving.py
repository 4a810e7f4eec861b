"""``gpufleet serving``: each service (the replicas of one model or deployment) judged by the
traffic it served: its replicas and GPU-hours, the GPU-hours of replicas that served no request,
its busiest span, the replicas that span needed (``streams.serving.service``) and the GPU-hours
held beyond them, and the replicas that served no request for their last hours, from the
``serving_windows`` table (``sinks/ddl_serving.py``)."""

from __future__ import annotations

import math

from clickhouse_connect.driver.client import Client

from gpufleet.reports.opportunities import parse_since
from streams.serving.service import Replica, ServiceLoad, Span, of_parts

# A replica's window as the worker judged it (``ServingWindow.state``, the wire's values).
STATES = ("BUSY", "HEADROOM", "SATURATED", "IDLE")

def service_parts(client: Client, database: str, where: str = "1", parameters: dict | None = None,
                  span_s: float = 600, key: str = "''") -> dict[tuple[str, str], tuple[list[Span], list[Replica]]]:
    """Per ``key`` (an expression of a window: its owner, its team; one group by default) and
    service, the spans and the replicas of the windows ``where`` keeps, each summed by
    ClickHouse: a week of a fleet's windows never comes into Python."""
    span_ms = int(span_s * 1000)
    out: dict[tuple[str, str], tuple[list[Span], list[Replica]]] = {}
    for k, service, start, requests, replicas, gpu_s in client.query(f"""
            SELECT {key} AS k, service, intDiv(toUnixTimestamp64Milli(window_start), {span_ms}) * {span_ms} AS start,
                   sum(requests), uniqExact(workflow_id), sum(gpu_seconds)
            FROM {database}.serving_windows FINAL WHERE {where}
            GROUP BY k, service, start ORDER BY k, service, start""", parameters=parameters or {}).result_rows:
        out.setdefault((k, service), ([], []))[0].append(Span(start, requests, replicas, gpu_s))
    for k, service, wf, first, last, served_end, gpu_s, idle_s, capacity, requests, *states in client.query(f"""
            SELECT {key} AS k, service, workflow_id, toUnixTimestamp64Milli(min(window_start)),
                   toUnixTimestamp64Milli(max(window_end)),
                   if(countIf(requests > 0) > 0, toUnixTimestamp64Milli(maxIf(window_end, requests > 0)), NULL),
                   sum(gpu_seconds), sumIf(gpu_seconds, state = 'IDLE'), max(capacity_per_s), sum(requests),
                   {", ".join(f"countIf(state = '{state}')" for state in STATES)}
            FROM {database}.serving_windows FINAL WHERE {where}
            GROUP BY k, service, workflow_id ORDER BY k, service, workflow_id""",
            parameters=parameters or {}).result_rows:
        out[(k, service)][1].append(Replica(wf, first, last, served_end, gpu_s, idle_s, capacity, requests,
                                            dict(zip(STATES, states, strict=True))))
    return out


def service_loads(client: Client, database: str, where: str = "1", parameters: dict | None = None,
                  span_s: float = 600, margin: float = 0.2, key: str = "''") -> dict[str, list[ServiceLoad]]:
    """Per ``key``, each service's load over the windows ``where`` keeps, the one with most
    GPU-hours held beyond its need first."""
    out: dict[str, list[ServiceLoad]] = {}
    for (k, service), (spans, replicas) in service_parts(client, database, where, parameters, span_s, key).items():
        out.setdefault(k, []).append(of_parts(service, spans, replicas, int(span_s * 1000), margin))
    return {k: sorted(loads, key=lambda s: (-s.freed_gpu_hours, s.service)) for k, loads in out.items()}


def services(client: Client, database: str, since: str, span_s: float, margin: float) -> list[ServiceLoad]:
    """Each service's load over ``since``."""
    since_s = parse_since(since)
    where = "1" if since_s is None else f"window_start >= now64(3) - toIntervalMillisecond({int(since_s * 1000)})"
    return service_loads(client, database, where, None, span_s, margin).get("", [])


def duration(seconds: float) -> str:
    """``seconds`` as minutes, or hours from one on."""
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def idle_line(s: ServiceLoad, idle_for_s: float) -> str | None:
    """"3 of 8 replicas of sd-xl served no request for their last 2 h: ..." (the longest first)."""
    idle = sorted(((ms, wf) for wf, ms in s.idle_tails.items() if ms >= idle_for_s * 1000), reverse=True)
    if not idle:
        return None
    named = ", ".join(f"{wf} ({duration(ms / 1000)})" for ms, wf in idle[:5]) + (" ..." if len(idle) > 5 else "")
    return (f"{len(idle)} of {s.replicas} replicas of {s.service} served no request for their last "
            f"{duration(idle_for_s)} or more: {named}")


def peak_line(s: ServiceLoad, span_s: float, margin: float) -> str:
    """"The busiest 10 min of sd-xl (5.30 requests/s) needed 5 replicas with +20 % headroom: 11 held." """
    line = (f"The busiest {span_s / 60:g} min of {s.service} ({s.peak_per_s:.2f} requests/s) needed "
            f"{s.replicas_needed} replica{'s' if s.replicas_needed != 1 else ''} with +{margin:.0%} headroom: "
            f"{s.replicas_at_peak} held")
    if s.freed_gpu_hours > 0:
        line += f"; {s.freed_gpu_hours:,.1f} of its {s.gpu_hours:,.1f} GPU-hours were held beyond the replicas needed"
    return line + "."


def render(loads: list[ServiceLoad], span_s: float, margin: float, idle_for_s: float = 7200) -> str:
    head = (f"{'service':<28} {'replicas':>8} {'GPU-h':>9} {'idle GPU-h':>10} {'peak req/s':>10} {'at peak':>7} "
            f"{'needed':>6} {'freed GPU-h':>11}")
    title = (f"Serving: replicas held against those each service's busiest {span_s / 60:g} min needed "
             f"(+{margin:.0%} headroom)")
    lines = [title, head, "-" * len(head)]
    for s in loads:
        lines.append(f"{s.service[:28]:<28} {s.replicas:>8} {s.gpu_hours:>9.1f} {s.idle_gpu_hours:>10.1f} "
                     f"{s.peak_per_s:>10.2f} {s.replicas_at_peak:>7} {s.replicas_needed:>6} {s.freed_gpu_hours:>11.1f}")
    lines += ["", *(peak_line(s, span_s, margin) for s in loads if s.peak_per_s > 0)]
    idle = [line for s in loads if (line := idle_line(s, idle_for_s))]
    if idle:
        lines += ["", *idle]
    unsaturated = [s.service for s in loads if not s.saturated_windows]
    if unsaturated:
        lines.append("")
        lines.append(f"No replica of {', '.join(unsaturated[:5])}{' and others' if len(unsaturated) > 5 else ''} "
                     "ever saturated: the replicas needed are an upper bound (none showed all it could serve).")
    return "\n".join(lines) + "\n"


def replica_served(client: Client, database: str, workflow_id: str, max_points: int = 600) -> dict | None:
    """What a serving replica served, as the worker judged its windows by its traffic: its service
    and engine, its requests, its windows by state, the capacity it last had and the window that
    was learnt from (``said``: all that in a sentence), and its requests a second over its life in
    steps of a minute or more (at most ``max_points``, each step with its windows' most frequent
    state); None for a workflow no window of which was judged so."""
    result = client.query(f"""
        SELECT argMax(service, window_start) AS service, argMax(engine, window_start) AS engine,
               count() AS windows, sum(requests) AS requests,
               {", ".join(f"countIf(state = '{state}') AS {state.lower()}" for state in STATES)},
               argMax(capacity_per_s, window_start) AS capacity_per_s,
               argMax(capacity_window_start, window_start) AS capacity_window_start,
               argMax(capacity_windows, window_start) AS capacity_windows,
               toUnixTimestamp(min(window_start)) AS first, toUnixTimestamp(max(window_start)) AS last
        FROM {database}.serving_windows FINAL WHERE workflow_id = %(wf)s""", parameters={"wf": workflow_id})
    summary = dict(zip(result.column_names, result.result_rows[0]))
    if not summary["windows"]:
        return None
    first, last = summary.pop("first"), summary.pop("last")
    step = max(60, math.ceil((last - first + 60) / max_points / 60) * 60)
    steps = client.query(f"""
        SELECT t, sum(requests) / sum(seconds), argMax(state, n), max(queue_ms)
        FROM (SELECT toUnixTimestamp(toStartOfInterval(window_start, toIntervalSecond({step}))) * 1000 AS t, state,
                     sum(requests) AS requests, count() AS n, max(queue_time_ms) AS queue_ms,
                     sum(dateDiff('millisecond', window_start, window_end)) / 1000 AS seconds
              FROM {database}.serving_windows FINAL WHERE workflow_id = %(wf)s GROUP BY t, state)
        GROUP BY t ORDER BY t""", parameters={"wf": workflow_id}).result_rows
    return {**summary, "said": served_line(summary), "step_s": step, "t": [r[0] for r in steps],
            "requests_per_s": [r[1] for r in steps], "state": [r[2] for r in steps],
            "queue_time_ms": [r[3] for r in steps]}


def served_line(s: dict) -> str:
    """"A replica of sd-xl (vllm), judged by its traffic: 3,114 requests in its 40 windows; ..." """
    engine = f" ({s['engine']})" if s["engine"] else ""
    line = (f"A replica of {s['service']}{engine}, judged by its traffic: {s['requests']:,.0f} requests in its "
            f"{s['windows']} windows; busy in {s['busy']}, below its capacity in {s['headroom']}, saturated in "
            f"{s['saturated']}, no request in {s['idle']}.")
    if not s["capacity_per_s"]:
        return line + " No capacity learnt yet: no window of it stayed within the queue target with traffic."
    return line + (f" Its capacity, {s['capacity_per_s']:.2f} requests/s, was learnt from its window at "
                   f"{s['capacity_window_start']:%Y-%m-%d %H:%M} UTC ({s['capacity_windows']} windows seen).")
