"""``gpufleet opportunities``: where the fleet loses the most GPU-hours, and to what.

Ranks the rows of the ``waste`` view (sinks/clickhouse_ddl.py) -- GPUs allocated at 0 %,
the rest of the wasted GPU-seconds of low utilisation, and each antipattern that trace
analysis found with the GPU-seconds it puts at stake -- summed across workflows, per cause
and optionally per team, owner, workflow, framework, model, cluster or GPU model, with the number of
workflows affected and the ones to look at first. ``--by regression``: the workflows whose latest
profiles got slower than their previous ones (``streams.stages.comparison_step``), by the GPU time lost.
``--by right-size``: the GPU-hours the ended workflows would have freed had they asked for what
``streams.windows.right_size`` recommends (fewer GPUs, a MIG slice, a smaller model), by kind.
"""

from __future__ import annotations

import re

from clickhouse_connect.driver.client import Client

# --by: the column of the joined rows that groups them.
DIMENSIONS = {
    "cause": "''",
    "team": "team",
    "owner": "owner",
    "workflow": "workflow_id",
    "framework": "framework",
    "model": "model",
    "cluster": "cluster",
    "gpu-model": "gpu_model",
    "antipattern": "''",
    "regression": "workflow_id",  # profiles slower than the workflow's previous one, per workflow
    "right-size": "''",  # what workflows should ask for next time (streams.windows.right_size), by kind
}
REGRESSION_CAUSE = "antipattern:profile_regression"
COLUMNS = ("key", "cause", "gpu_hours", "workflows", "top_workflows")  # what every opportunities_sql selects

_SINCE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str) -> float | None:
    """'7d', '12h', '30m', '90s' -> seconds; 'all' -> None (no limit)."""
    if text == "all":
        return None
    m = _SINCE.match(text.strip())
    if not m:
        raise ValueError(f"--since {text!r}: expected a number with s, m, h or d (e.g. 7d), or 'all'")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def opportunities_sql(database: str, by: str, since_s: float | None, examples: int = 3) -> str:
    if by not in DIMENSIONS:
        raise ValueError(f"--by {by!r}: one of {', '.join(DIMENSIONS)}")
    if by == "right-size":
        return right_size_sql(database, since_s, examples)
    key = DIMENSIONS[by]
    where = ["loss.gpu_seconds > 0"]
    if since_s is not None:
        where.append(f"loss.at >= now64(3) - toIntervalMillisecond({int(since_s * 1000)})")
    if by == "antipattern":
        where.append("startsWith(loss.cause, 'antipattern:')")
    if by == "regression":
        where.append(f"loss.cause = '{REGRESSION_CAUSE}'")
    return f"""
    SELECT {key} AS key, cause,
           round(sum(s) / 3600, 3) AS gpu_hours,
           count() AS workflows,
           arrayMap(x -> x.1, arraySlice(arraySort(x -> -x.2, groupArray((workflow_id, s))), 1, {examples}))
               AS top_workflows
    FROM (
        SELECT loss.workflow_id AS workflow_id, loss.cause AS cause, any(loss.team) AS team,
               any(loss.owner) AS owner, any(ifNull(meta.framework, '')) AS framework,
               any(ifNull(meta.model, '')) AS model, any(ifNull(meta.cluster, '')) AS cluster,
               any(ifNull(hw.gpu_model, '')) AS gpu_model, sum(loss.gpu_seconds) AS s
        FROM {database}.waste AS loss
        LEFT JOIN (
            SELECT workflow_id,
                   argMax(concat(ifNull(framework, ''),
                                 if(framework_version IS NULL, '', concat(' ', framework_version))),
                          event_time) AS framework,
                   argMax(model, event_time) AS model, argMax(cluster, event_time) AS cluster
            FROM {database}.workflows GROUP BY workflow_id
        ) AS meta ON meta.workflow_id = loss.workflow_id
        LEFT JOIN (
            SELECT workflow_id, argMax(gpu_model, gpu_seconds) AS gpu_model
            FROM {database}.gpu_hours_hourly GROUP BY workflow_id
        ) AS hw ON hw.workflow_id = loss.workflow_id
        WHERE {" AND ".join(where)}
        GROUP BY workflow_id, cause
    )
    GROUP BY key, cause
    ORDER BY gpu_hours DESC, key, cause
    """


def right_size_sql(database: str, since_s: float | None, examples: int = 3) -> str:
    """The GPU-hours the ended workflows' right-size recommendations would have freed, by kind,
    with the workflows that would free the most (and what each should ask for)."""
    since = ("" if since_s is None else
             f"AND last_window_end >= now64(3) - toIntervalMillisecond({int(since_s * 1000)})")
    return f"""
    SELECT '' AS key, concat('right_size:', r.kind) AS cause,
           round(sum(r.gpu_hours_freed), 3) AS gpu_hours,
           count() AS workflows,
           arrayMap(x -> concat(x.1, ': ', x.2), arraySlice(arraySort(x -> -x.3,
               groupArray((workflow_id, r.recommended, r.gpu_hours_freed))), 1, {examples})) AS top_workflows
    FROM {database}.workflow_summaries FINAL ARRAY JOIN right_size AS r
    WHERE r.gpu_hours_freed > 0 {since}
    GROUP BY cause
    ORDER BY gpu_hours DESC, cause
    """


def opportunities(client: Client, database: str, by: str = "cause", since: str = "7d",
                  limit: int = 20) -> tuple[list[str], list[tuple]]:
    """Column names and rows, the largest loss first."""
    sql = opportunities_sql(database, by, parse_since(since)) + f" LIMIT {int(limit)}"
    result = client.query(sql)
    columns = list(COLUMNS)  # chdb names no columns when no row comes back
    rows = [tuple(r) for r in result.result_rows]
    if by in ("cause", "antipattern", "right-size"):  # the key is empty: show the cause alone
        columns = columns[1:]
        rows = [r[1:] for r in rows]
    else:
        columns[0] = "workflow" if by == "regression" else by
    return columns, rows
