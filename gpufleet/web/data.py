"""What the owners' service shows, from ClickHouse: each function takes the viewer and keeps
every query to the rows they may see (``Viewer.where``); a job they may not see is None, as
one that does not exist.

A job's figures are the ones ``gpufleet workflow`` prints (``gpufleet.reports.workflows`` and
``sinks.job_report``, called here, not copied); its GPUs over time come from the per-minute
rollup ``gpu_minutes``, at most ``MAX_POINTS`` points per GPU (a 7-day job is drawn from
10-minute steps, never from its raw samples).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from gpufleet.web.access import Viewer
from schemas.goodput_buckets import BUCKETS
from schemas.vocabulary import JOBS, WASTE_BUCKETS
from sinks.job_report import JOULES_PER_KWH, LABELS, Rates, Waterfall, job_report, right_size_of, summary_waterfall

MAX_POINTS = 600
STATES = ("all", "running", "ended")
SORTS = {"wasted": "wasted_gpu_hours DESC", "gpu_hours": "gpu_hours DESC", "recent": "last_window_end DESC",
         "goodput": "goodput_pct ASC"}
_SECONDS = ", ".join(f"sum(w.{b}_gpu_seconds) AS {b}_gpu_seconds" for b in BUCKETS)


_PLAIN = (str, int, bool, type(None))


def clean(value):
    """``value`` as JSON can carry it: no NaN or infinity (None), times as ISO 8601 in UTC."""
    if type(value) in _PLAIN:  # most values of a long job's timeline: said first
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z") if value.tzinfo else \
            value.isoformat() + "Z"
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def waterfall_rows(w: Waterfall, rates: Rates) -> list[dict]:
    total = max(w.allocated.gpu_seconds, 1e-9)
    return [{"bucket": b, "label": LABELS[b], "gpu_hours": v.gpu_seconds / 3600,
             "share_pct": 100 * v.gpu_seconds / total, "kwh": v.joules / JOULES_PER_KWH,
             "kg_co2e": v.grams / 1000 if rates.carbon else None, "cost": v.cost if rates.costed else None}
            for b, v in w.buckets.items() if v.gpu_seconds > 0]


def _largest_loss(row: dict) -> tuple[str | None, float]:
    losses = [(row[f"{b}_gpu_seconds"], b) for b in WASTE_BUCKETS if row[f"{b}_gpu_seconds"] > 0]
    if not losses:
        return None, 0.0
    seconds, bucket = max(losses)
    return bucket, seconds / 3600


def jobs(client, database: str, viewer: Viewer, since_s: float = 7 * 86400, state: str = "all",
         owner: str | None = None, team: str | None = None, sort: str = "wasted", limit: int = 500) -> list[dict]:
    """The viewer's jobs (theirs, their teams', or all for an operator) with a window in the last
    ``since_s`` before the newest one (the fleet's now, also for a replayed history)."""
    if state not in STATES or sort not in SORTS:
        raise ValueError(f"state is one of {', '.join(STATES)}; sort one of {', '.join(SORTS)}")
    visible, params = viewer.where("w.owner", "w.team")
    filters = []
    if owner:
        filters.append("ifNull(w.owner, '') = %(owner)s")
        params["owner"] = owner
    if team:
        filters.append("ifNull(w.team, '') = %(team)s")
        params["team"] = team
    ended = {"running": "AND s.workflow_id = ''", "ended": "AND s.workflow_id != ''"}.get(state, "")
    rows = client.query(f"""
        WITH firing AS (
            SELECT workflow_id, arraySort(groupUniqArray(detector)) AS detectors
            FROM {database}.alerts FINAL WHERE status = 'FIRING' GROUP BY workflow_id
        ),
        jobs AS (
            SELECT w.workflow_id AS workflow_id, any(w.owner) AS owner, any(w.team) AS team,
                   max(w.gpu_count) AS gpus, min(w.window_start) AS first_window_start,
                   max(w.window_end) AS last_window_end, sum(w.gpu_seconds) AS gpu_seconds, {_SECONDS}
            FROM {database}.judged_windows AS w
            WHERE w.{JOBS} AND {visible} {''.join(f' AND {f}' for f in filters)}
                  AND w.window_end >= (SELECT max(window_end) FROM {database}.workflow_windows)
                                      - toIntervalSecond(%(since)s)
            GROUP BY w.workflow_id
        )
        SELECT j.workflow_id AS workflow_id, j.owner AS owner, j.team AS team, j.gpus AS gpus,
               j.first_window_start AS first_window_start, j.last_window_end AS last_window_end,
               j.gpu_seconds AS gpu_seconds, {", ".join(f"j.{b}_gpu_seconds AS {b}_gpu_seconds" for b in BUCKETS)},
               ifNull(s.end_state, s.end_reason) AS ended, f.detectors AS firing
        FROM jobs AS j
        LEFT JOIN (SELECT * FROM {database}.workflow_summaries FINAL) AS s ON s.workflow_id = j.workflow_id
        LEFT JOIN firing AS f ON f.workflow_id = j.workflow_id
        WHERE 1 {ended}
        LIMIT %(limit)s""", parameters={**params, "since": int(since_s), "limit": int(limit)})
    out = []
    for values in rows.result_rows:
        row = dict(zip(rows.column_names, values))
        w = Waterfall(row["workflow_id"])
        for b in BUCKETS:
            w.buckets[b].gpu_seconds = row[f"{b}_gpu_seconds"]
        w.buckets["unclassified"].gpu_seconds = max(0.0, row["gpu_seconds"] - sum(row[f"{b}_gpu_seconds"]
                                                                                   for b in BUCKETS))
        loss, loss_hours = _largest_loss(row)
        out.append({
            "workflow_id": row["workflow_id"], "owner": row["owner"], "team": row["team"], "gpus": row["gpus"],
            "first_window_start": row["first_window_start"], "last_window_end": row["last_window_end"],
            "state": row["ended"] or "running", "gpu_hours": row["gpu_seconds"] / 3600,
            "goodput_pct": w.goodput_pct,
            "wasted_gpu_hours": sum(row[f"{b}_gpu_seconds"] for b in WASTE_BUCKETS) / 3600,
            "largest_loss": LABELS[loss] if loss else None, "largest_loss_gpu_hours": loss_hours,
            "firing_alerts": list(row["firing"] or []),
        })
    key = {"wasted": lambda j: -j["wasted_gpu_hours"], "gpu_hours": lambda j: -j["gpu_hours"],
           "recent": lambda j: -j["last_window_end"].timestamp(), "goodput": lambda j: j["goodput_pct"]}[sort]
    return clean(sorted(out, key=lambda j: (key(j), j["workflow_id"])))


# Every table a job's page reads, with the time of each of its rows: what ``versions`` watches.
_PAGE_TABLES = (("workflow_windows", "window_end"), ("alert_transitions", "window_end"), ("owner_actions", "at"),
                ("findings", "detected_at"), ("profile_requests", "requested_at"), ("profile_statuses", "at"),
                ("workflow_summaries", "summarized_at"), ("serving_windows", "window_end"))


def versions(client, database: str, workflow_ids: list[str]) -> dict[str, tuple]:
    """Per workflow, what changes whenever anything its page shows does (rows and their newest
    time, over every table the page reads): one query for many jobs, so that a page is read
    again only when it changed."""
    if not workflow_ids:
        return {}
    union = " UNION ALL ".join(f"SELECT workflow_id, toDateTime64({at}, 3) AS at FROM {database}.{table} "
                               "WHERE workflow_id IN %(wfs)s" for table, at in _PAGE_TABLES)
    rows = client.query(f"SELECT workflow_id, count(), max(at) FROM ({union}) GROUP BY workflow_id",
                        parameters={"wfs": list(workflow_ids)}).result_rows
    return {wf: (n, str(at)) for wf, n, at in rows}


def owner_of(client, database: str, workflow_id: str) -> tuple[str | None, str | None] | None:
    """The workflow's owner and team as its windows (else its events) were charged, or None if unknown."""
    for table in ("workflow_windows", "workflow_events"):
        rows = client.query(f"SELECT any(owner), any(team), count() FROM {database}.{table} "
                            "WHERE workflow_id = %(wf)s", parameters={"wf": workflow_id}).result_rows
        if rows and rows[0][2]:
            return rows[0][0], rows[0][1]
    return None


def job(client, database: str, viewer: Viewer, workflow_id: str, rates: Rates | None = None) -> dict | None:
    """Everything the job page shows, or None where the job is unknown or not the viewer's to see."""
    from gpufleet.reports.serving import replica_served
    from gpufleet.reports.workflows import workflow_summary, workflow_timeline

    known = owner_of(client, database, workflow_id)
    if known is None or not viewer.sees(*known):
        return None
    rates = rates or Rates()
    columns, timeline = workflow_timeline(client, database, workflow_id)
    if not timeline:
        return None
    summary, cluster = workflow_summary(client, database, workflow_id)
    w = summary_waterfall(summary, rates, cluster)
    report, _ = job_report(summary, rates, cluster)
    scalars = {k: v for k, v in summary.items() if not isinstance(v, dict | list | tuple)}
    return clean({
        "workflow_id": workflow_id, "owner": known[0], "team": known[1], "cluster": cluster,
        "state": "running" if summary["end_reason"] == "still running" else
        (summary.get("end_state") or summary["end_reason"]),
        "goodput_pct": w.goodput_pct, "gpu_hours": w.allocated.gpu_seconds / 3600,
        "waterfall": waterfall_rows(w, rates), "report": report, "summary": scalars,
        "right_size": right_size_of(summary), "profile_split": summary.get("profile_split"),
        "timeline": {"columns": columns, "rows": [list(r) for r in timeline]},
        "alerts": alerts(client, database, workflow_id), "findings": findings(client, database, workflow_id),
        "profiles": profiles(client, database, workflow_id),
        "actions": owner_actions(client, database, workflow_id),
        "serving": replica_served(client, database, workflow_id, MAX_POINTS),
    })


def alerts(client, database: str, workflow_id: str) -> list[dict]:
    """Each alert episode of the workflow with its life cycle (every transition, in order)."""
    rows = client.query(f"""
        SELECT alert_id, detector, severity, status, window_end, message, root_cause
        FROM {database}.alert_transitions FINAL WHERE workflow_id = %(wf)s
        ORDER BY alert_id, window_end, status""", parameters={"wf": workflow_id}).result_rows
    episodes: dict[str, dict] = {}
    for alert_id, detector, severity, status, at, message, root_cause in rows:
        e = episodes.setdefault(alert_id, {"alert_id": alert_id, "detector": detector, "severity": severity,
                                           "transitions": []})
        e.update(status=status, message=message, root_cause=root_cause)
        e["transitions"].append({"status": status, "at": at})
    return sorted(episodes.values(), key=lambda e: e["transitions"][0]["at"])


def owner_actions(client, database: str, workflow_id: str) -> list[dict]:
    """What people did about the job on the owners' service (``gpufleet.web.actions``), in order;
    an exemption request with how it was decided (``decision``: None while it waits)."""
    result = client.query(f"""
        SELECT action_id, kind, alert_id, actor, role, reason, until, request_id, at
        FROM {database}.owner_actions FINAL WHERE workflow_id = %(wf)s ORDER BY at, action_id""",
        parameters={"wf": workflow_id})
    actions = [dict(zip(result.column_names, r)) for r in result.result_rows]
    decided = {a["request_id"]: a for a in actions if a["kind"] in ("EXEMPTION_APPROVED", "EXEMPTION_REFUSED")}
    for a in actions:
        if a["kind"] == "EXEMPTION_REQUESTED":
            d = decided.get(a["action_id"])
            a["decision"] = None if d is None else {"kind": d["kind"], "actor": d["actor"], "reason": d["reason"]}
    return actions


def findings(client, database: str, workflow_id: str) -> list[dict]:
    result = client.query(f"""
        SELECT rule, severity, title, evidence, gpu_seconds_at_stake / 3600 AS gpu_hours_at_stake, recommendation,
               rank, trace_id, detected_at
        FROM {database}.findings FINAL WHERE workflow_id = %(wf)s
        ORDER BY gpu_seconds_at_stake DESC, rule, rank""", parameters={"wf": workflow_id})
    return [dict(zip(result.column_names, r)) for r in result.result_rows]


def profiles(client, database: str, workflow_id: str) -> list[dict]:
    """The workflow's profile requests, each with its latest state per host and rank."""
    result = client.query(f"""
        SELECT r.request_id, r.reason, r.requester, r.requested_at, s.state, s.host, s.rank, s.reason, s.trace_id
        FROM {database}.profile_requests AS r FINAL
        LEFT JOIN (SELECT request_id, host, rank, argMax(state, at) AS state, argMax(reason, at) AS reason,
                          argMax(trace_id, at) AS trace_id
                   FROM {database}.profile_statuses GROUP BY request_id, host, rank) AS s
               ON s.request_id = r.request_id
        WHERE r.workflow_id = %(wf)s ORDER BY r.requested_at, s.host, s.rank""", parameters={"wf": workflow_id})
    out: dict[str, dict] = {}
    for request_id, reason, requester, at, state, host, rank, why, trace in result.result_rows:
        p = out.setdefault(request_id, {"request_id": request_id, "reason": reason, "requester": requester,
                                        "requested_at": at, "ranks": []})
        if state:
            p["ranks"].append({"host": host, "rank": rank, "state": state, "reason": why, "trace_id": trace})
    return list(out.values())


_SERIES = {"util": "utilization_pct", "memory_pct": "memory_pct", "power_w": "power_watts",
           "tensor_pct": "tensor_active_pct"}  # the query's column: the series' name


def gpu_series(client, database: str, workflow_id: str) -> dict:
    """Per GPU of the workflow: utilisation, memory, power and tensor activity over its life, from
    ``gpu_minutes`` in steps of a minute or more (at most ``MAX_POINTS`` per GPU); times in epoch
    ms. One row per GPU, its points as arrays (a 64-GPU job is 64 rows, not 38,400; a point not
    measured is NaN there, since groupArray skips NULLs, and None here)."""
    (first, last), = client.query(f"""
        SELECT toUnixTimestamp(min(minute)), toUnixTimestamp(max(minute)) FROM {database}.gpu_minutes
        WHERE workflow_id = %(wf)s""", parameters={"wf": workflow_id}).result_rows
    step = max(60, math.ceil(((last or 0) - (first or 0) + 60) / MAX_POINTS / 60) * 60)
    rows = client.query(f"""
        SELECT host, gpu_index, arraySort(groupArray(t)) AS times,
               {", ".join(f"arraySort((v, k) -> k, groupArray(ifNull({c}, nan)), groupArray(t)) AS {c}s"
                          for c in _SERIES)}
        FROM (
            SELECT host, gpu_index, toUnixTimestamp(toStartOfInterval(minute, toIntervalSecond({step}))) * 1000 AS t,
                   sum(utilization_seconds) / sum(seconds) AS util,
                   100 * max(memory_used_max) / nullIf(max(memory_total_max), 0) AS memory_pct,
                   sum(power_watt_seconds) / nullIf(sum(power_seconds), 0) AS power_w,
                   sum(tensor_active_seconds) / nullIf(sum(tensor_seconds), 0) AS tensor_pct
            FROM {database}.gpu_minutes WHERE workflow_id = %(wf)s
            GROUP BY host, gpu_index, t)
        GROUP BY host, gpu_index ORDER BY host, gpu_index""", parameters={"wf": workflow_id}).result_rows
    gpus = []
    for host, index, t, *columns in rows:
        gpus.append({"gpu": f"{host}:{index}", "t": list(t), **{
            key: [None if v is None or not math.isfinite(v) else v for v in values]
            for key, values in zip(_SERIES.values(), columns, strict=True)}})
    return {"step_s": step, "gpus": gpus}


def group_totals(client, database: str, viewer: Viewer, since_s: float, team: str | None = None) -> dict | None:
    """A team's (or, for an operator with no team, the fleet's) totals and waterfall over ``since_s``;
    None where the viewer may not see it."""
    if team is None and not viewer.operator:
        return None
    if team is not None and not (viewer.operator or team in viewer.teams):
        return None
    where, params = ("ifNull(team, '') = %(team)s", {"team": team}) if team is not None else ("1", {})
    result = client.query(f"""
        SELECT sum(gpu_seconds) AS gpu_seconds, sum(unclassified_gpu_seconds) AS unclassified_gpu_seconds,
               {", ".join(f"sum({b}_gpu_seconds) AS {b}_gpu_seconds, sum({b}_joules) AS {b}_joules"
                          for b in BUCKETS)},
               uniqExact(workflow_id) AS workflows, uniqExact(owner) AS owners
        FROM {database}.goodput_hourly
        WHERE {where} AND {JOBS}
              AND period >= (SELECT max(period) FROM {database}.goodput_hourly) - toIntervalSecond(%(since)s)""",
        parameters={**params, "since": int(since_s)})
    row = dict(zip(result.column_names, result.result_rows[0]))
    w = Waterfall(team or "fleet")
    for b in BUCKETS:
        w.buckets[b].gpu_seconds, w.buckets[b].joules = row[f"{b}_gpu_seconds"] or 0.0, row[f"{b}_joules"] or 0.0
    w.buckets["unclassified"].gpu_seconds = row["unclassified_gpu_seconds"] or 0.0
    return clean({"team": team, "workflows": row["workflows"], "owners": row["owners"],
                  "gpu_hours": w.allocated.gpu_seconds / 3600, "goodput_pct": w.goodput_pct,
                  "waterfall": waterfall_rows(w, Rates())})
