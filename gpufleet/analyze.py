"""``gpufleet analyze TRACE...``: the trace analysis on files, printed for people or as JSON."""

from __future__ import annotations

import json
from pathlib import Path

from producers.read_trace import TraceError, read_trace
from streams.analyze_trace import analyze_events


def analyze_file(path: str | Path) -> dict:
    """Read and analyse one trace file; errors become part of the result, never an exception."""
    try:
        trace = read_trace(path)
    except TraceError as exc:
        return {"path": str(path), "ok": False, "error": str(exc)}
    result = analyze_events(trace.events)
    return {
        "path": str(path),
        "ok": True,
        "rank": trace.rank,
        "partial": trace.partial,
        "error": trace.error,
        "events_read": trace.events_seen,
        "last_step_dropped": trace.last_step_dropped,
        "rounded_to_us": trace.rounded,
        **result,
    }


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:6.2f} %"


def format_result(r: dict) -> str:
    if not r["ok"]:
        return f"{r['path']}: ERROR {r['error']}"
    t, o, launch = r["temporal"], r["overlap"], r["launch"]
    dropped = ", last profiler step dropped" if r["last_step_dropped"] else ""
    lines = [f"{r['path']} (rank {r['rank']}, {r['events_read']} events{dropped})"]
    if r["partial"]:
        lines.append(f"  PARTIAL: {r['error']}; the numbers cover what was read before the damage")
    lines += [
        f"  GPU kernel time   {t['kernel_time_us'] / 1e3:12.3f} ms",
        f"    idle            {_pct(t['idle_pct'])}",
        f"    compute         {_pct(t['compute_pct'])}",
        f"    non-compute     {_pct(t['non_compute_pct'])}",
        f"  comm/comp overlap {_pct(o['comp_comm_overlap_pct'])}",
    ]
    for stream, idle in r["idle_by_stream"].items():
        lines.append(f"  stream {stream} idle: host wait {idle['host_wait_us'] / 1e3:.3f} ms, "
                     f"kernel wait {idle['kernel_wait_us'] / 1e3:.3f} ms, other {idle['other_us'] / 1e3:.3f} ms")
    if launch["launches"]:
        lines.append(f"  launches {launch['launches']}: mean delay {launch['launch_delay_mean_us']:.1f} us, "
                     f"{launch['launch_delay_outliers']} over 100 us; {launch['short_kernels']} short kernels; "
                     f"{launch['runtime_outliers']} runtime calls over 50 us")
    return "\n".join(lines)


def run(paths: list[str], as_json: bool) -> tuple[str, int]:
    results = [analyze_file(p) for p in paths]
    text = json.dumps(results, indent=1, default=str) if as_json else "\n\n".join(map(format_result, results))
    return text, 0 if all(r["ok"] for r in results) else 1
