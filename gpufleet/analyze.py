"""``gpufleet analyze TRACE...``: the trace analysis on files, printed for people or as JSON.

Prints the same ``TraceAnalysis`` records the stream worker publishes for the same file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from producers.publish_trace import trace_id_for
from producers.read_trace import TraceError, read_trace
from streams.analyze_trace import analyze_events, trace_analysis_record


def analyze_file(path: str | Path, workflow_id: str = "", trace_id: str | None = None) -> dict:
    """The ``TraceAnalysis`` record of one file, or ``{"source", "error"}`` if it cannot be read."""
    try:
        trace = read_trace(path)
    except TraceError as exc:
        return {"source": str(path), "error": str(exc), "unreadable": True}
    return trace_analysis_record(
        analyze_events(trace.events),
        trace_id=trace_id or trace_id_for(path, workflow_id),
        workflow_id=workflow_id, rank=trace.rank, source=str(path),
        partial=trace.partial, error=trace.error, analyzed_at=int(time.time() * 1000),
    )


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:6.2f} %"


def format_record(r: dict) -> str:
    if r.get("unreadable"):
        return f"{r['source']}: ERROR {r['error']}"
    lines = [f"{r['source']} (rank {r['rank']}, {r['events']} events analysed, {r['gpu_events']} on the GPU)"]
    if r["partial"]:
        lines.append(f"  PARTIAL: {r['error']}; the numbers cover what was read before the damage")
    lines += [
        f"  GPU kernel time   {r['kernel_time_us'] / 1e3:12.3f} ms",
        f"    idle            {_pct(r['idle_pct'])}",
        f"    compute         {_pct(r['compute_pct'])}",
        f"    non-compute     {_pct(r['non_compute_pct'])}",
        f"  comm/comp overlap {_pct(r['comp_comm_overlap_pct'])}",
    ]
    for s in r["idle_by_stream"]:
        lines.append(f"  stream {s['stream']} idle: host wait {s['host_wait_us'] / 1e3:.3f} ms, "
                     f"kernel wait {s['kernel_wait_us'] / 1e3:.3f} ms, other {s['other_us'] / 1e3:.3f} ms")
    if r["launches"]:
        lines.append(f"  launches {r['launches']}: mean delay {r['launch_delay_mean_us']:.1f} us, "
                     f"{r['launch_delay_outliers']} over 100 us; {r['short_kernels']} short kernels; "
                     f"{r['runtime_outliers']} runtime calls over 50 us")
    return "\n".join(lines)


def run(paths: list[str], as_json: bool, workflow_id: str = "") -> tuple[str, int]:
    records = [analyze_file(p, workflow_id) for p in paths]
    text = json.dumps(records, indent=1) if as_json else "\n\n".join(map(format_record, records))
    return text, 1 if any(r.get("unreadable") for r in records) else 0
