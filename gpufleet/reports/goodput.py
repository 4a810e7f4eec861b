"""``gpufleet goodput``: where the fleet's allocated GPU-hours went, per bucket and per team,
owner, workflow, framework, GPU model or cluster, with energy, carbon and cost; and beside
them the capacity no job held (the agents' ``unallocated`` GPUs, or ``idle`` where they see
processes only), so that capacity = unallocated + every allocated bucket.

The GPU-seconds and joules come from ClickHouse (the ``goodput_hourly`` view, and
``capacity_hourly`` for capacity no job held: ``sinks/ddl_workflows.py``), per GPU model,
cluster and hour, so that each hour's price and grid intensity apply
(``sinks.job_report.Rates``).
"""

from __future__ import annotations

from clickhouse_connect.driver.client import Client

from gpufleet.reports.opportunities import parse_since
from sinks.job_report import BUCKETS, Rates, Waterfall, energy_cells, energy_head

DIMENSIONS = {"fleet": "''", "team": "team", "owner": "owner", "workflow": "workflow_id", "framework": "framework",
              "gpu-model": "gpu_model", "cluster": "cluster"}


def goodput_sql(database: str, by: str, since_s: float | None) -> str:
    if by not in DIMENSIONS:
        raise ValueError(f"--by {by!r}: one of {', '.join(DIMENSIONS)}")
    where = "" if since_s is None else f"WHERE period >= now64(3) - toIntervalMillisecond({int(since_s * 1000)})"
    sums = ", ".join(f"sum({b}_gpu_seconds), sum({b}_joules)" for b in BUCKETS)
    # The jobs' windows, then capacity no job held (capacity_hourly), marked free.
    return "\n    UNION ALL".join(f"""
    SELECT {free} AS free, {DIMENSIONS[by]} AS key, gpu_model, cluster, period,
           sum(gpu_seconds), sum(unclassified_gpu_seconds), sum(energy_joules), {sums}
    FROM {database}.{view} {where}
    GROUP BY free, key, gpu_model, cluster, period""" for free, view in ((0, "goodput_hourly"), (1, "capacity_hourly")))


def waterfalls(rows: list[tuple], rates: Rates) -> tuple[Waterfall, list[Waterfall]]:
    """The fleet's waterfall and one per group, largest allocation first, from the rows of
    ``goodput_sql``. The energy of unclassified windows is what they measured in total."""
    fleet, groups = Waterfall("fleet"), {}
    for free, key, model, cluster, period, seconds, unclassified_s, energy_j, *pairs in rows:
        price, intensity = rates.price(model), rates.intensity(cluster, period)
        if free:  # capacity no job held: beside the waterfall, never in a group's
            fleet.unallocated.add(seconds, energy_j, price, intensity)
            continue
        group = groups.setdefault(key, Waterfall(key))
        classified_j = sum(pairs[1::2])
        for target in (fleet, group):
            for b, (seconds, joules) in zip(BUCKETS, zip(pairs[::2], pairs[1::2])):
                target.buckets[b].add(seconds, joules, price, intensity)
            target.buckets["unclassified"].add(
                unclassified_s, max(0.0, energy_j - classified_j) if unclassified_s else 0.0, price, intensity
            )
    return fleet, sorted(groups.values(), key=lambda w: -w.allocated.gpu_seconds)


def fleet_goodput(client: Client, database: str, by: str = "fleet", since: str = "7d",
                  rates: Rates | None = None) -> tuple[Waterfall, list[Waterfall]]:
    rows = client.query(goodput_sql(database, by, parse_since(since))).result_rows
    return waterfalls([tuple(r) for r in rows], rates or Rates())


def render_groups(groups: list[Waterfall], by: str, rates: Rates, limit: int = 20) -> str:
    """One row per group: GPU-hours, goodput %, the share of each other bucket, kWh, kg CO2e, cost."""
    names = [b for b in BUCKETS if b != "productive"]
    head = [f"{by:<24}", f"{'GPU-hours':>10}", f"{'goodput':>8}", *(f"{n:>11}" for n in names), *energy_head(rates)]
    lines = ["  ".join(head), "  ".join("-" * len(h) for h in head)]
    for w in groups[:limit]:
        total = w.allocated
        seconds = total.gpu_seconds or 1.0
        cells = [f"{(w.key or '(none)')[:24]:<24}", f"{total.gpu_seconds / 3600:>10,.2f}", f"{w.goodput_pct:>7.1f}%",
                 *(f"{100.0 * w.buckets[n].gpu_seconds / seconds:>10.1f}%" for n in names),
                 *energy_cells(total, rates)]
        lines.append("  ".join(cells))
    if len(groups) > limit:
        lines.append(f"... and {len(groups) - limit} more")
    return "\n".join(lines)
