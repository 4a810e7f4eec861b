"""``gpufleet serving``: each service (the replicas of one model or deployment) judged by the
traffic it served: its replicas and GPU-hours, the GPU-hours of replicas that served no request,
its busiest span, the replicas that span needed (``streams.serving.service``) and the GPU-hours
held beyond them, from the ``serving_windows`` table (``sinks/ddl_serving.py``)."""

from __future__ import annotations

from clickhouse_connect.driver.client import Client

from gpufleet.reports.opportunities import parse_since
from streams.serving.service import ServiceLoad, load

COLUMNS = ("workflow_id", "service", "window_start", "requests", "gpu_seconds", "state", "capacity_per_s")


def serving_sql(database: str, since_s: float | None) -> str:
    where = "" if since_s is None else f"WHERE window_start >= now64(3) - toIntervalMillisecond({int(since_s * 1000)})"
    return f"""
    SELECT workflow_id, service, toUnixTimestamp64Milli(window_start), requests, gpu_seconds, state, capacity_per_s
    FROM {database}.serving_windows FINAL {where}
    ORDER BY service, workflow_id, window_start
    """


def services(client: Client, database: str, since: str, span_s: float, margin: float) -> list[ServiceLoad]:
    """Each service's load over ``since``, the busiest first."""
    rows = client.query(serving_sql(database, parse_since(since))).result_rows
    by_service: dict[str, list[dict]] = {}
    for row in rows:
        w = dict(zip(COLUMNS, row, strict=True))
        by_service.setdefault(w["service"], []).append(w)
    loads = [load(name, windows, int(span_s * 1000), margin) for name, windows in by_service.items()]
    return sorted(loads, key=lambda s: (-s.freed_gpu_hours, s.service))


def render(loads: list[ServiceLoad], span_s: float, margin: float) -> str:
    head = (f"{'service':<28} {'replicas':>8} {'GPU-h':>9} {'idle GPU-h':>10} {'peak req/s':>10} {'at peak':>7} "
            f"{'needed':>6} {'freed GPU-h':>11}")
    title = (f"Serving: replicas held against those each service's busiest {span_s / 60:g} min needed "
             f"(+{margin:.0%} headroom)")
    lines = [title, head, "-" * len(head)]
    for s in loads:
        lines.append(f"{s.service[:28]:<28} {s.replicas:>8} {s.gpu_hours:>9.1f} {s.idle_gpu_hours:>10.1f} "
                     f"{s.peak_per_s:>10.2f} {s.replicas_at_peak:>7} {s.replicas_needed:>6} {s.freed_gpu_hours:>11.1f}")
    unsaturated = [s.service for s in loads if not s.saturated_windows]
    if unsaturated:
        lines.append("")
        lines.append(f"No replica of {', '.join(unsaturated[:5])}{' and others' if len(unsaturated) > 5 else ''} "
                     "ever saturated: the replicas needed are an upper bound (none showed all it could serve).")
    return "\n".join(lines) + "\n"
