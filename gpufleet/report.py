"""``gpufleet report --html out.html``: the fleet on one self-contained page.

Charts are inline SVG drawn here (no scripts, fonts or images fetched), so the file can be
mailed, attached to a ticket or opened offline: the utilisation distribution of workflow
windows, wasted GPU-hours over time by team, the goodput waterfall (where the allocated
GPU-hours went) by team and over time, the hardware MFU estimate of the windows (tensor-core
activity, where the GPUs report it), the top opportunities, and alerts per detector.
"""

from __future__ import annotations

import html
from datetime import UTC, datetime

from clickhouse_connect.driver.client import Client

from gpufleet.opportunities import opportunities, parse_since
from schemas.goodput_buckets import BUCKETS

PALETTE = ("#3b6fb6", "#e07b39", "#4f9d69", "#c9453c", "#8c6bb1", "#b59b2b", "#3fa7b5", "#7f7f7f")


def _esc(value: object) -> str:
    return html.escape(str(value))


def bar_chart(labels: list[str], values: list[float], unit: str, width: int = 640, height: int = 260) -> str:
    """Vertical bars with their values; an empty chart says so."""
    if not values or max(values) <= 0:
        return '<p class="empty">no data in this period</p>'
    top = max(values)
    left, bottom, pad = 50, 40, 10
    inner_w, inner_h = width - left - pad, height - bottom - pad
    step = inner_w / len(values)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
             f'<line x1="{left}" y1="{pad + inner_h}" x2="{width - pad}" y2="{pad + inner_h}" stroke="#999"/>']
    for i, (label, value) in enumerate(zip(labels, values)):
        h = inner_h * value / top
        x = left + i * step + step * 0.1
        y = pad + inner_h - h
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{step * 0.8:.1f}" height="{h:.1f}" fill="{PALETTE[0]}">'
                     f'<title>{_esc(label)}: {value:,.2f} {_esc(unit)}</title></rect>')
        parts.append(f'<text x="{x + step * 0.4:.1f}" y="{y - 3:.1f}" font-size="11" text-anchor="middle">'
                     f'{value:,.4g}</text>')
        parts.append(f'<text x="{x + step * 0.4:.1f}" y="{pad + inner_h + 15}" font-size="11" '
                     f'text-anchor="middle">{_esc(label)}</text>')
    parts.append(f'<text x="4" y="{pad + 10}" font-size="11">{_esc(unit)}</text></svg>')
    return "".join(parts)


def line_chart(series: dict[str, list[tuple[datetime, float]]], unit: str, width: int = 640,
               height: int = 260) -> str:
    """One line per series over time, with a legend."""
    points = [p for s in series.values() for p in s]
    if not points:
        return '<p class="empty">no data in this period</p>'
    t0 = min(t for t, _ in points).timestamp()
    t1 = max(t for t, _ in points).timestamp()
    top = max(v for _, v in points) or 1.0
    left, bottom, pad, legend = 50, 30, 24, 130
    inner_w, inner_h = width - left - pad - legend, height - bottom - pad

    def xy(t: datetime, v: float) -> str:
        x = left + (inner_w * (t.timestamp() - t0) / (t1 - t0) if t1 > t0 else inner_w / 2)
        return f"{x:.1f},{pad + inner_h - inner_h * v / top:.1f}"

    first = datetime.fromtimestamp(t0, UTC).strftime("%Y-%m-%d %H:%M")
    last = datetime.fromtimestamp(t1, UTC).strftime("%Y-%m-%d %H:%M")
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
             f'<line x1="{left}" y1="{pad + inner_h}" x2="{left + inner_w}" y2="{pad + inner_h}" stroke="#999"/>',
             f'<text x="4" y="12" font-size="11">{_esc(unit)}</text>',
             f'<text x="{left}" y="{height - 8}" font-size="11">{first}</text>',
             f'<text x="{left + inner_w}" y="{height - 8}" font-size="11" text-anchor="end">{last}</text>',
             f'<text x="{left - 4}" y="{pad + 4}" font-size="11" text-anchor="end">{top:,.3g}</text>']
    for i, (name, pts) in enumerate(sorted(series.items())):
        color = PALETTE[i % len(PALETTE)]
        path = " ".join(xy(t, v) for t, v in sorted(pts))
        shape = (f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"/>' if len(pts) > 1 else
                 f'<circle cx="{path.split(",")[0]}" cy="{path.split(",")[1]}" r="4" fill="{color}"/>')
        parts.append(shape)
        ly = pad + 14 * i + 10
        parts.append(f'<rect x="{width - legend + 4}" y="{ly - 9}" width="10" height="10" fill="{color}"/>'
                     f'<text x="{width - legend + 18}" y="{ly}" font-size="11">{_esc(name or "(no team)")}</text>')
    parts.append("</svg>")
    return "".join(parts)


def stacked_bars(labels: list[str], stacks: dict[str, list[float]], unit: str, width: int = 640,
                 height: int = 280) -> str:
    """One bar per label, made of a segment per stack (in the order given), with a legend."""
    totals = [sum(s[i] for s in stacks.values()) for i in range(len(labels))]
    if not labels or max(totals) <= 0:
        return '<p class="empty">no data in this period</p>'
    top = max(totals)
    left, bottom, pad, legend = 50, 40, 10, 130
    inner_w, inner_h = width - left - pad - legend, height - bottom - pad
    step = inner_w / len(labels)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
             f'<line x1="{left}" y1="{pad + inner_h}" x2="{left + inner_w}" y2="{pad + inner_h}" stroke="#999"/>',
             f'<text x="4" y="{pad + 10}" font-size="11">{_esc(unit)}</text>',
             f'<text x="{left - 4}" y="{pad + 24}" font-size="11" text-anchor="end">{top:,.3g}</text>']
    for i, label in enumerate(labels):
        x, y = left + i * step + step * 0.1, pad + inner_h
        for k, (name, values) in enumerate(stacks.items()):
            h = inner_h * values[i] / top
            y -= h
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{step * 0.8:.1f}" height="{h:.1f}" '
                         f'fill="{PALETTE[k % len(PALETTE)]}"><title>{_esc(label)}, {_esc(name)}: '
                         f'{values[i]:,.2f} {_esc(unit)}</title></rect>')
        if len(labels) <= 16:
            parts.append(f'<text x="{x + step * 0.4:.1f}" y="{pad + inner_h + 15}" font-size="11" '
                         f'text-anchor="middle">{_esc(label)}</text>')
    for k, name in enumerate(stacks):
        ly = pad + 14 * k + 10
        parts.append(f'<rect x="{width - legend + 4}" y="{ly - 9}" width="10" height="10" '
                     f'fill="{PALETTE[k % len(PALETTE)]}"/><text x="{width - legend + 18}" y="{ly}" '
                     f'font-size="11">{_esc(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


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
    """The numbers behind the report, from ClickHouse."""
    since_s = parse_since(since)
    db = database
    q = client.query
    totals = q(f"""SELECT sum(gpu_seconds) / 3600, sum(busy_gpu_seconds) / 3600, sum(zero_util_gpu_seconds) / 3600,
                          uniqExact(workflow_id)
                   FROM {db}.gpu_hours_hourly WHERE {_since_clause('hour', since_s)}""").result_rows[0]
    buckets = q(f"""SELECT least(floor(utilization_mean_pct / 10), 9) AS b, count()
                    FROM {db}.workflow_windows FINAL WHERE {_since_clause('window_end', since_s)}
                    GROUP BY b ORDER BY b""").result_rows
    wasted = q(f"""SELECT hour, team, (sum(gpu_seconds) - sum(busy_gpu_seconds)) / 3600
                   FROM {db}.gpu_hours_hourly WHERE {_since_clause('hour', since_s)}
                   GROUP BY hour, team ORDER BY hour""").result_rows
    alerts = q(f"""SELECT detector, countIf(status = 'FIRING'), count()
                   FROM {db}.alerts FINAL WHERE {_since_clause('window_end', since_s)}
                   GROUP BY detector ORDER BY count() DESC""").result_rows
    sums = ", ".join(f"sum({b}_gpu_seconds) / 3600" for b in BUCKETS)
    by_team = q(f"""SELECT team, {sums} FROM {db}.goodput_hourly WHERE {_since_clause('period', since_s)}
                    GROUP BY team ORDER BY sum(gpu_seconds) DESC LIMIT 12""").result_rows
    by_hour = q(f"""SELECT period, {sums} FROM {db}.goodput_hourly WHERE {_since_clause('period', since_s)}
                    GROUP BY period ORDER BY period""").result_rows
    mfu = q(f"""SELECT least(floor(tensor_active_mean_pct / 10), 9) AS b, count()
                FROM {db}.workflow_windows FINAL
                WHERE {_since_clause('window_end', since_s)} AND tensor_active_mean_pct IS NOT NULL
                GROUP BY b ORDER BY b""").result_rows
    no_gpm = q(f"""SELECT countIf(tensor_active_mean_pct IS NULL), count() FROM {db}.workflow_windows FINAL
                   WHERE {_since_clause('window_end', since_s)}""").result_rows[0]
    series: dict[str, list] = {}
    for hour, team, hours in wasted:
        series.setdefault(team, []).append((hour.replace(tzinfo=UTC) if hour.tzinfo is None else hour,
                                            float(hours)))
    counts = {int(b): n for b, n in buckets}
    mfu_counts = {int(b): n for b, n in mfu}
    return {
        "goodput_by_team": [(team or "(no team)", [float(v) for v in values]) for team, *values in by_team],
        "goodput_by_hour": [(period.strftime("%m-%d %H:%M"), [float(v) for v in values]) for period, *values in by_hour],
        "mfu_distribution": [mfu_counts.get(b, 0) for b in range(10)],
        "windows_without_gpm": int(no_gpm[0] or 0), "windows": int(no_gpm[1] or 0),
        "since": since,
        "gpu_hours": float(totals[0] or 0), "busy_gpu_hours": float(totals[1] or 0),
        "idle_gpu_hours": float(totals[2] or 0), "workflows": int(totals[3] or 0),
        "distribution": [counts.get(b, 0) for b in range(10)],
        "wasted_by_team": series,
        "opportunities": opportunities(client, database, "cause", since, limit=10),
        "alerts": [(d, int(f), int(n)) for d, f, n in alerts],
    }


def render(numbers: dict, title: str = "gpufleet fleet report") -> str:
    gpu_h, busy_h = numbers["gpu_hours"], numbers["busy_gpu_hours"]
    utilisation = 100 * busy_h / gpu_h if gpu_h else 0.0
    distribution = bar_chart([f"{10 * b}-{10 * b + 10}%" for b in range(10)], numbers["distribution"],
                             "workflow-minutes")
    alert_chart = bar_chart([d.replace("_", " ") for d, _, _ in numbers["alerts"]],
                            [n for _, _, n in numbers["alerts"]], "alerts")
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")

    def goodput(rows: list[tuple[str, list[float]]]) -> str:
        return stacked_bars([label for label, _ in rows],
                            {b.replace("_", " "): [values[i] for _, values in rows] for i, b in enumerate(BUCKETS)},
                            "GPU-hours")

    productive = sum(v[-1] for _, v in numbers["goodput_by_team"])
    classified = sum(sum(v) for _, v in numbers["goodput_by_team"])
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
table {{ border-collapse: collapse; font-size: 0.9em; }} th, td {{ border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: left; }}
.empty {{ color: #888; font-style: italic; }}
</style></head><body>
<h1>{_esc(title)}</h1>
<p>Period: last {_esc(numbers["since"])} &middot; generated {generated}</p>
<div class="tiles">
<div class="tile">GPU-hours allocated<b>{gpu_h:,.1f}</b></div>
<div class="tile">Mean utilisation<b>{utilisation:.1f}%</b></div>
<div class="tile">Wasted GPU-hours<b>{gpu_h - busy_h:,.1f}</b></div>
<div class="tile">Idle at 0 %<b>{numbers["idle_gpu_hours"]:,.1f} GPU-h</b></div>
<div class="tile">Workflows<b>{numbers["workflows"]}</b></div>
<div class="tile">Goodput<b>{100 * productive / classified if classified else 0:.1f}%</b></div>
</div>
<div class="grid">
<section><h2>Utilisation distribution</h2><p>Workflow windows by mean GPU utilisation.</p>{distribution}</section>
<section><h2>Wasted GPU-hours by team</h2><p>Allocated GPU-hours not spent busy, per hour.</p>
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
