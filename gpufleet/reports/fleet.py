"""``gpufleet report --html out.html``: the fleet on one self-contained page.

Charts are inline SVG drawn by matplotlib (no scripts, fonts or images fetched), so the file
can be mailed, attached to a ticket or opened offline. matplotlib rather than a JavaScript
grammar such as Vega-Lite: it renders SVG itself, offline, in-process and without a browser
engine (vl-convert carries one), and its constrained layout keeps every tick, value and legend
inside the drawing (the hand-drawn charts cut the value over the tallest bar). The charts: the
utilisation distribution of workflow windows, wasted GPU-hours over time by team, the goodput
waterfall (where the allocated GPU-hours went) by team and over time, the hardware MFU estimate
of the windows (tensor-core activity, where the GPUs report it), the top opportunities, and
alerts per detector.
"""

from __future__ import annotations

import html
import io
import math
from datetime import UTC, datetime, timedelta

from clickhouse_connect.driver.client import Client

from gpufleet.reports.opportunities import opportunities, parse_since
from schemas.goodput_buckets import BUCKETS
from schemas.vocabulary import (
    ALLOCATED,
    IDLE,
    JOBS,
    PRODUCTIVE,
    STARTUP,
    UNALLOCATED,
    UTILISATION,
    WASTED,
)

PALETTE = ("#3b6fb6", "#e07b39", "#4f9d69", "#c9453c", "#8c6bb1", "#b59b2b", "#3fa7b5", "#7f7f7f")


def _esc(value: object) -> str:
    return html.escape(str(value))


EMPTY = '<p class="empty">no data in this period</p>'
PX = 1 / 96  # a CSS pixel in inches: figures are sized in pixels, as the page lays them out
STYLE = {
    "svg.fonttype": "none",  # text stays text: selectable, searchable, small
    "svg.hashsalt": "gpufleet",  # the same numbers make the same file
    "font.family": "sans-serif", "font.size": 10,
    "axes.spines.top": False, "axes.spines.right": False,
}


def _figure(width: int, height: int):
    """A figure of ``width`` x ``height`` CSS pixels whose layout keeps every label inside it
    (matplotlib's constrained layout: axes shrink to make room for ticks, labels and legends)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width * PX, height * PX), dpi=96, layout="constrained")


def _svg(fig) -> str:
    """The figure as an inline ``<svg>`` element (no XML prolog, no creation date)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()[buf.getvalue().index("<svg"):]


def _rc():
    import matplotlib
    from cycler import cycler

    return matplotlib.rc_context({**STYLE, "axes.prop_cycle": cycler(color=PALETTE)})


def bar_chart(labels: list[str], values: list[float], unit: str, width: int = 640, height: int = 260) -> str:
    """Vertical bars with their values above them; an empty chart says so."""
    if not values or max(values) <= 0:
        return EMPTY
    with _rc():
        fig = _figure(width, height)
        ax = fig.add_subplot()
        bars = ax.bar(labels, values, color=PALETTE[0])
        ax.bar_label(bars, labels=[f"{v:,.4g}" for v in values], padding=2, fontsize=9)
        ax.margins(y=0.15)  # room above the tallest bar for its value
        ax.set_ylabel(unit)
        ax.tick_params(axis="x", labelsize=9)
        return _svg(fig)


def line_chart(series: dict[str, list[tuple[datetime, float]]], unit: str, width: int = 640,
               height: int = 260) -> str:
    """One line per series over time, with a legend beside the plot."""
    if not any(series.values()):
        return EMPTY
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

    with _rc():
        fig = _figure(width, height)
        ax = fig.add_subplot()
        for name, points in sorted(series.items()):
            points = sorted(points)
            ax.plot([t for t, _ in points], [v for _, v in points], label=name or "(no team)",
                    marker="o" if len(points) == 1 else None, linewidth=2)
        times = {t for points in series.values() for t, _ in points}
        if len(times) == 1:  # one hour of data: an axis of two hours around it, not of years
            (t,) = times
            ax.set_xlim(t - timedelta(hours=1), t + timedelta(hours=1))
        locator = AutoDateLocator()
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
        ax.set_ylim(bottom=0)
        ax.set_ylabel(unit)
        fig.legend(loc="outside right upper", frameon=False, fontsize=9)
        return _svg(fig)


def stacked_bars(labels: list[str], stacks: dict[str, list[float]], unit: str, width: int = 640,
                 height: int = 280) -> str:
    """One bar per label, made of a segment per stack (in the order given), with a legend."""
    totals = [sum(s[i] for s in stacks.values()) for i in range(len(labels))]
    if not labels or max(totals) <= 0:
        return EMPTY
    with _rc():
        fig = _figure(width, height)
        ax = fig.add_subplot()
        positions = range(len(labels))
        bottom = [0.0] * len(labels)
        for name, values in stacks.items():
            ax.bar(positions, values, bottom=bottom, label=name, width=0.8)
            bottom = [b + v for b, v in zip(bottom, values)]
        if len(labels) <= 16:
            ax.set_xticks(list(positions), labels, fontsize=9, rotation=30 if len(labels) > 6 else 0,
                          ha="right" if len(labels) > 6 else "center")
        else:  # an hour per bar: the first and last say when
            ax.set_xticks([0, len(labels) - 1], [labels[0], labels[-1]], fontsize=9)
        ax.set_ylabel(unit)
        fig.legend(loc="outside right upper", frameon=False, fontsize=9)
        return _svg(fig)


def table(columns: list[str], rows: list[tuple]) -> str:
    if not rows:
        return '<p class="empty">nothing in this period</p>'
    head = "".join(f"<th>{_esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(
        f"<td>{_esc(', '.join(v) if isinstance(v, list) else v)}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _since_clause(column: str, since_s: float | None) -> str:
    return "1" if since_s is None else f"{column} >= now64(3) - toIntervalMillisecond({int(since_s * 1000)})"


def gather(client: Client, database: str, since: str) -> dict:
    """The numbers behind the report, from ClickHouse: every total in the words of
    ``schemas.vocabulary``, over the closed windows of jobs (capacity no job held beside them),
    as ``gpufleet goodput`` and ``opportunities`` sum them."""
    since_s = parse_since(since)
    db = database
    q = client.query
    in_period = _since_clause("period", since_s)
    windows_in_period = _since_clause("toStartOfHour(window_start)", since_s)  # the goodput views' period
    totals = q(f"""SELECT {ALLOCATED.sql} / 3600, {WASTED.sql} / 3600, {STARTUP.sql} / 3600, {IDLE.sql} / 3600,
                          {PRODUCTIVE.sql} / 3600, sum(unclassified_gpu_seconds) / 3600, uniqExact(workflow_id)
                   FROM {db}.goodput_hourly WHERE {JOBS} AND {in_period}""").result_rows[0]
    unallocated = q(f"SELECT {UNALLOCATED.sql} / 3600 FROM {db}.capacity_hourly WHERE {in_period}"
                    ).result_rows[0][0]
    (utilisation,) = q(f"""SELECT {UTILISATION.sql} FROM {db}.workflow_windows FINAL
                           WHERE {JOBS} AND {windows_in_period}""").result_rows[0]
    buckets = q(f"""SELECT least(floor(utilization_mean_pct / 10), 9) AS b, count()
                    FROM {db}.workflow_windows FINAL WHERE {JOBS} AND {windows_in_period}
                    GROUP BY b ORDER BY b""").result_rows
    wasted = q(f"""SELECT period, team, {WASTED.sql} / 3600
                   FROM {db}.goodput_hourly WHERE {JOBS} AND {in_period}
                   GROUP BY period, team ORDER BY period""").result_rows
    alerts = q(f"""SELECT detector, countIf(status = 'FIRING'), count()
                   FROM {db}.alerts FINAL WHERE {_since_clause('window_end', since_s)}
                   GROUP BY detector ORDER BY count() DESC""").result_rows
    sums = ", ".join(f"sum({b}_gpu_seconds) / 3600" for b in BUCKETS)
    by_team = q(f"""SELECT team, {sums} FROM {db}.goodput_hourly WHERE {JOBS} AND {in_period}
                    GROUP BY team ORDER BY sum(gpu_seconds) DESC LIMIT 12""").result_rows
    by_hour = q(f"""SELECT period, {sums} FROM {db}.goodput_hourly WHERE {JOBS} AND {in_period}
                    GROUP BY period ORDER BY period""").result_rows
    mfu = q(f"""SELECT least(floor(tensor_active_mean_pct / 10), 9) AS b, count()
                FROM {db}.workflow_windows FINAL
                WHERE {JOBS} AND {windows_in_period} AND tensor_active_mean_pct IS NOT NULL
                GROUP BY b ORDER BY b""").result_rows
    no_gpm = q(f"""SELECT countIf(tensor_active_mean_pct IS NULL), count() FROM {db}.workflow_windows FINAL
                   WHERE {JOBS} AND {windows_in_period}""").result_rows[0]
    series: dict[str, list] = {}
    for hour, team, hours in wasted:
        series.setdefault(team, []).append((hour.replace(tzinfo=UTC) if hour.tzinfo is None else hour,
                                            float(hours)))
    counts = {int(b): n for b, n in buckets}
    mfu_counts = {int(b): n for b, n in mfu}
    allocated, wasted_h, startup, idle, productive, unclassified, workflows = (float(v or 0) for v in totals)
    return {
        "goodput_by_team": [(team or "(no team)", [float(v) for v in values]) for team, *values in by_team],
        "goodput_by_hour": [
            (period.strftime("%m-%d %H:%M"), [float(v) for v in values]) for period, *values in by_hour
        ],
        "mfu_distribution": [mfu_counts.get(b, 0) for b in range(10)],
        "windows_without_gpm": int(no_gpm[0] or 0),
        "windows": int(no_gpm[1] or 0),
        "since": since,
        "allocated_gpu_hours": allocated,
        "wasted_gpu_hours": wasted_h,
        "startup_gpu_hours": startup,
        "idle_gpu_hours": idle,
        "productive_gpu_hours": productive,
        "unallocated_gpu_hours": float(unallocated or 0),
        "goodput_pct": 100 * productive / (allocated - unclassified) if allocated - unclassified > 0 else 0.0,
        "utilisation_pct": float(utilisation) if utilisation is not None and math.isfinite(utilisation) else 0.0,
        "workflows": int(workflows),
        "distribution": [counts.get(b, 0) for b in range(10)],
        "wasted_by_team": series,
        "opportunities": opportunities(client, database, "cause", since, limit=10),
        "alerts": [(d, int(f), int(n)) for d, f, n in alerts],
    }


def render(numbers: dict, title: str = "gpufleet fleet report") -> str:
    distribution = bar_chart([f"{10 * b}-{10 * b + 10}%" for b in range(10)], numbers["distribution"],
                             "workflow-minutes")
    alert_chart = bar_chart([d.replace("_", " ") for d, _, _ in numbers["alerts"]],
                            [n for _, _, n in numbers["alerts"]], "alerts")
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")

    def goodput(rows: list[tuple[str, list[float]]]) -> str:
        return stacked_bars([label for label, _ in rows],
                            {b.replace("_", " "): [values[i] for _, values in rows] for i, b in enumerate(BUCKETS)},
                            "GPU-hours")

    mfu_chart = bar_chart([f"{10 * b}-{10 * b + 10}%" for b in range(10)], numbers["mfu_distribution"],
                          "workflow-minutes")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1400px; }}
.tiles {{ display: flex; gap: 1em; flex-wrap: wrap; }}
.tile {{ background: #f3f5f9; border-radius: 6px; padding: 0.8em 1.2em; min-width: 10em; }}
.tile b {{ display: block; font-size: 1.6em; }}
.grid {{ display: grid; grid-template-columns: repeat(auto-fit, minmax(600px, 1fr)); gap: 1.5em; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: left; }}
.empty {{ color: #888; font-style: italic; }}
</style></head><body>
<h1>{_esc(title)}</h1>
<p>Period: last {_esc(numbers["since"])} &middot; generated {generated}</p>
<div class="tiles">
<div class="tile">GPU-hours allocated<b>{numbers["allocated_gpu_hours"]:,.2f}</b></div>
<div class="tile">Goodput<b>{numbers["goodput_pct"]:.1f}%</b></div>
<div class="tile">Wasted GPU-hours<b>{numbers["wasted_gpu_hours"]:,.2f}</b></div>
<div class="tile">of which start-up<b>{numbers["startup_gpu_hours"]:,.2f} GPU-h</b></div>
<div class="tile">of which idle<b>{numbers["idle_gpu_hours"]:,.2f} GPU-h</b></div>
<div class="tile">Mean utilisation<b>{numbers["utilisation_pct"]:.1f}%</b></div>
<div class="tile">Workflows<b>{numbers["workflows"]}</b></div>
<div class="tile">Unallocated (no job held them)<b>{numbers["unallocated_gpu_hours"]:,.2f} GPU-h</b></div>
</div>
<p>The words as <code>gpufleet goodput</code>, <code>opportunities</code> and <code>workflows</code> use them
(<code>docs/vocabulary.md</code>): allocated = the GPU-hours jobs held in closed windows; wasted = those
that did no productive work (unhealthy, start-up, idle, input-bound, low utilisation); idle = at 0 %
after start-up.</p>
<div class="grid">
<section><h2>Utilisation distribution</h2><p>Workflow windows by mean GPU utilisation.</p>{distribution}</section>
<section><h2>Wasted GPU-hours by team</h2><p>Allocated GPU-hours that did no productive work, per hour.</p>
{line_chart(numbers["wasted_by_team"], "GPU-hours")}</section>
<section><h2>Goodput by team</h2><p>Where each team's allocated GPU-hours went, one bucket per
GPU-second (<code>gpufleet goodput --by team</code>).</p>{goodput(numbers["goodput_by_team"])}</section>
<section><h2>Goodput over time</h2><p>The fleet's allocated GPU-hours per hour, by bucket.</p>
{goodput(numbers["goodput_by_hour"])}</section>
<section><h2>Hardware MFU estimate</h2><p>Workflow windows by mean tensor-core activity (GPM, Hopper and
later): the share of time the tensor pipes were busy, an upper bound on model FLOPs utilisation.
{numbers["windows_without_gpm"]} of {numbers["windows"]} windows came from GPUs that report no tensor
activity (older GPUs, or an agent without GPM) and are not shown.</p>{mfu_chart}</section>
<section><h2>Top opportunities</h2><p>Where the most GPU-hours are lost, and the workflows to look at first.</p>
{table(*numbers["opportunities"])}</section>
<section><h2>Alerts per detector</h2>{alert_chart}
{table(["detector", "firing now", "episodes"], numbers["alerts"])}</section>
</div>
</body></html>
"""
