"""``gpufleet analyze TRACE...``: the trace analysis on files, printed for people or as JSON.

Prints the same ``TraceAnalysis`` records the stream worker publishes for the same file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from producers.traces.read import TraceError, no_cycle_collection, read_trace
from schemas.topics import trace_id_for
from streams.alerts.detectors import DEFAULTS, DetectorConfig
from streams.traces.analyze import TraceAnalyzer, findings_records, trace_analysis_record
from streams.traces.batch import EventBatch
from streams.traces.collectives import stragglers
from streams.traces.kernel_breakdown import KernelBreakdown
from streams.traces.kernel_type import short_kernel_name


def analyze_file(path: str | Path, workflow_id: str = "", trace_id: str | None = None,
                 critical_path: bool = False, kernel_sequences: list[str] | None = None) -> dict:
    """The ``TraceAnalysis`` record of one file, or ``{"source", "error"}`` if it cannot be read."""
    return analyze_file_with_findings(path, workflow_id, trace_id, critical_path, kernel_sequences)[0]


def analyze_file_with_findings(
    path: str | Path, workflow_id: str = "", trace_id: str | None = None, critical_path: bool = False,
    kernel_sequences: list[str] | None = None, thresholds: DetectorConfig = DEFAULTS.default,
) -> tuple[dict, list[dict]]:
    """The ``TraceAnalysis`` and ``Finding`` records of one file, as the worker makes them;
    with ``critical_path``, the record also holds the steps' critical paths (``critical_path``,
    not a field of the wire record) and the findings what they show; with ``kernel_sequences``
    (operator names), their frequent kernel sequences (``kernel_sequences``, likewise); the
    input-bound rules on ``thresholds`` (the worker's default, as ``--thresholds`` gives it)."""
    record, findings, _ = _analyze(path, workflow_id, trace_id, critical_path, kernel_sequences, thresholds)
    return record, findings


def _analyze(path: str | Path, workflow_id: str = "", trace_id: str | None = None, critical_path: bool = False,
             kernel_sequences: list[str] | None = None,
             thresholds: DetectorConfig = DEFAULTS.default) -> tuple[dict, list[dict], TraceAnalyzer | None]:
    try:
        trace = read_trace(path, cpu_ops=critical_path or bool(kernel_sequences))
    except TraceError as exc:
        return {"source": str(path), "error": str(exc), "unreadable": True}, [], None
    now = int(time.time() * 1000)
    analyzer = TraceAnalyzer(critical_path=critical_path, infer_syncs=trace.sync_events == 0,
                             kernel_sequences=kernel_sequences)
    with no_cycle_collection():
        for columns in trace.events.column_chunks():
            analyzer.add_batch(EventBatch(*columns))
        result = analyzer.result(trace.gpu_name)
    record = trace_analysis_record(
        result, trace_id=trace_id or trace_id_for(path, workflow_id),
        workflow_id=workflow_id, rank=trace.rank, source=str(path),
        partial=trace.partial, error=trace.error, analyzed_at=now, flops=trace.flops, gpu_name=trace.gpu_name,
    )
    findings = findings_records(result, record, trace.memory(), now, thresholds)
    if trace.skipped:
        record["skipped"] = trace.skipped  # (not a field of the wire record: the agent dead-letters it)
    if critical_path:
        record["critical_path"] = result["critical_path"]
    if kernel_sequences:
        record["kernel_sequences"] = result["kernel_sequences"]
    return record, findings, analyzer


def trace_files(path: str | Path) -> list[Path]:
    """``path`` if a file, else the traces in the directory (``*.json``, ``*.json.gz``)."""
    path = Path(path)
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.name.endswith((".json", ".json.gz")))
    return [path]


def analyze_profile(paths: list[str | Path]) -> tuple[list[dict], dict[tuple[str, str], list[float]]]:
    """The records of a profile's rank traces, and every kernel's launches and time over them:
    (kernel type, name) -> [launches, time_us]. Raises TraceError for a file that cannot be read."""
    records, kernels = [], {}
    for path in paths:
        record, _, analyzer = _analyze(path)
        if analyzer is None:
            raise TraceError(record["error"])
        records.append(record)
        for (kind, name), (launches, time_us) in analyzer.analyses[KernelBreakdown].per_kernel().items():
            row = kernels.setdefault((kind, name), [0, 0.0])
            row[0] += launches
            row[1] += time_us
    return records, kernels


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:6.2f} %"


def _mfu(r: dict) -> str:
    if r.get("model_flops") is None:
        return "n/a (the trace counts no FLOPs: profile with with_flops=True, as gpufleet profile does)"
    flops = f"{r['model_flops'] / 1e12:.3f} TFLOP at {r['model_flops_precision']}"
    if r.get("mfu_pct") is None:
        return f"n/a ({flops}; no peak known for {r.get('gpu_name') or 'this GPU'} at that precision)"
    return f"{r['mfu_pct']:6.2f} % ({flops} against {r['peak_tflops']:g} TFLOPS of {r['gpu_name']})"


def format_record(r: dict) -> str:
    if r.get("unreadable"):
        return f"{r['source']}: ERROR {r['error']}"
    lines = [f"{r['source']} (rank {r['rank']}, {r['events']} events analysed, {r['gpu_events']} on the GPU)"]
    if r["partial"]:
        lines.append(f"  PARTIAL: {r['error']}; the numbers cover what was read before the damage")
    if r.get("skipped"):
        lines.append(f"  SKIPPED: {r['skipped']['says']}; the numbers cover the other events")
    if not r["gpu_events"]:
        lines.append("  no GPU activity was read before the damage: nothing can be said about the GPU" if r["partial"]
                     else "  no GPU activity in this trace: nothing can be said about the GPU (was the profiler "
                          "run with ProfilerActivity.CUDA?)")
        return "\n".join(lines)
    lines += [
        f"  GPU kernel time   {r['kernel_time_us'] / 1e3:12.3f} ms",
        f"    idle            {_pct(r['idle_pct'])}",
        f"    compute         {_pct(r['compute_pct'])}",
        f"    non-compute     {_pct(r['non_compute_pct'])}",
        f"  comm/comp overlap {_pct(r['comp_comm_overlap_pct'])}",
        f"  MFU               {_mfu(r)}",
    ]
    for s in r["idle_by_stream"]:
        lines.append(f"  stream {s['stream']} idle: host wait {s['host_wait_us'] / 1e3:.3f} ms, "
                     f"kernel wait {s['kernel_wait_us'] / 1e3:.3f} ms, other {s['other_us'] / 1e3:.3f} ms")
    if r["launches"]:
        lines.append(f"  launches {r['launches']}: mean delay {r['launch_delay_mean_us']:.1f} us, "
                     f"{r['launch_delay_outliers']} over 100 us; {r['short_kernels']} short kernels; "
                     f"{r['runtime_outliers']} runtime calls over 50 us")
    return "\n".join(lines + _kernel_lines(r))


def _kernel_lines(r: dict) -> list[str]:
    """The breakdowns after the headline figures: a section each (its field, heading and the
    line of one row), left out when empty."""
    lines = _kernel_types(r)
    for field, heading, row in SECTIONS:
        if r.get(field):
            lines.append(f"  {heading}")
            lines += [f"    {row(x)}" for x in r[field][:SECTION_ROWS]]
            if len(r[field]) > SECTION_ROWS:
                lines.append(f"    ... {len(r[field]) - SECTION_ROWS} more (--json has them all)")
    return lines


def _kernel_types(r: dict) -> list[str]:
    if not r.get("kernel_types"):
        return []
    return ["  GPU time by kernel type"] + [
        f"    {k['kernel_type']:<58} {k['time_us'] / 1e3:10.3f} ms {k['pct']:6.1f} %" for k in r["kernel_types"]]


def _top_kernel(k: dict) -> str:
    name = f"others ({k['kernels']} kernels)" if k["name"] == "others" else short_kernel_name(k["name"])
    return f"{k['kernel_type'][:4]} {k['launches']:>7} {k['time_us'] / 1e3:10.3f} ms {k['mean_us']:9.1f} us  {name}"


def _copy(m: dict) -> str:
    achieved = "n/a" if m["achieved_gbps"] is None else f"{m['achieved_gbps']:.2f} GB/s"
    concurrent = "" if not m["bw_samples"] else f"; {m['bw_mean_gbps']:.2f} / {m['bw_max_gbps']:.2f} GB/s"
    return (f"{m['kind']:<15} {m['copies']:>7} {m['bytes'] / 1e6:10.1f} MB {m['time_us'] / 1e3:10.3f} ms "
            f"{achieved}{concurrent}")


def _annotation(a: dict) -> str:
    name = f"others ({a['kernels']} names)" if a["name"] == "others" and a["kernels"] > 1 else a["name"]
    return f"{a['launches']:>7} {a['time_us'] / 1e3:10.3f} ms {a['mean_us']:10.1f} us  {name[:70]}"


def _queue(q: dict) -> str:
    return (f"stream {q['stream']:<5} {q['mean']:8.1f} {q['p50']:8.1f} {q['max']:8.0f}   "
            f"{q['blocked_us'] / 1e3:.3f} ms at 1024")


def _operator(o: dict) -> str:
    roof = "no peak known" if o["roof_pct"] is None else f"{o['roof_pct']:5.1f} % of {o['roof_tflops']:.1f}"
    return (f"{o['name']:<24} {o['gpu_time_us'] / 1e3:9.3f} ms {o['achieved_tflops']:9.2f} TFLOP/s "
            f"{o['precision']:<5} {roof:<22} {o['bound'] or '':<8} {o['at_stake_us'] / 1e3:8.3f} ms")


def _step(x: dict) -> str:
    return (f"{x['step']:<18} {x['cpu_us'] / 1e3:9.3f} {x['gpu_span_us'] / 1e3:9.3f} {x['gpu_busy_us'] / 1e3:9.3f} "
            f"{x['gpu_idle_us'] / 1e3:9.3f} {x['compute_us'] / 1e3:9.3f}")


SECTION_ROWS = 40
SECTIONS = (
    ("top_kernels", "top kernels (launches, GPU time, mean per launch)", _top_kernel),
    ("memory_copies", "memory copies (count, bytes, GPU time, achieved bandwidth; concurrent bandwidth mean / max)",
     _copy),
    ("gpu_annotations", "annotations on the GPU (record_function ranges: count, GPU time, mean)", _annotation),
    ("steps", "per step, ms (CPU step, GPU span, busy, idle, compute)", _step),
    ("queue_lengths", "launch queue per stream (operations launched, not started: mean, median, max; time full)",
     _queue),
    ("operators", ("roofline of the operators that count their FLOPs (GPU time, achieved, % of roof, bound, "
                   "at stake below 70 %)"), _operator),
)


def format_critical_path(cp: dict) -> str:
    """The steps' critical paths: per step the path's length and what it ran on, then the
    operators and kernels that take most of it over all steps."""
    lines = [("  critical path per step, ms (span of the step, path, and on it: CPU, GPU compute, "
              "communication, launch delay, gaps between kernels)")]
    rows = cp["steps"] + ([{**cp["total"], "step": "all steps", "span_us": None}] if len(cp["steps"]) > 1 else [])
    for x in rows[:SECTION_ROWS]:
        span = "" if x["span_us"] is None else f"{x['span_us'] / 1e3:9.3f}"
        lines.append(f"    {x['step']:<18} {span:>9} {x['path_us'] / 1e3:9.3f} | {x['cpu_us'] / 1e3:9.3f} "
                     f"{x['gpu_compute_us'] / 1e3:9.3f} {x['communication_us'] / 1e3:9.3f} "
                     f"{x['launch_overhead_us'] / 1e3:9.3f} {x['kernel_gap_us'] / 1e3:9.3f}")
    if cp["top"]:
        lines.append("  most time on the critical path")
        lines += [f"    {t['on']:<3} {t['time_us'] / 1e3:9.3f} ms  {t['short_name']}" for t in cp["top"]]
    lines += [f"  not found for {s}" for s in cp["skipped"]]
    if not cp["steps"]:
        lines.append("  no step with CPU operators: was the trace read with every CPU operator?")
    return "\n".join(lines)


def format_kernel_sequences(sequences: dict) -> str:
    """Per operator name, its most frequent kernel sequences."""
    lines = []
    for name, x in sequences.items():
        if not x["sequences"]:
            lines.append(f"  kernel sequences of {name}: none of 3 or more GPU operations"
                         + (" (no operator of that name)" if x["depth"] is None else ""))
            continue
        lines.append(f"  kernel sequences of {name}: {x['sequences']} distinct (count, GPU time, CPU time; "
                     "the operator, then what it launched)")
        for s in x["top"]:
            kernels = " | ".join(short_kernel_name(k, 40) for k in s["sequence"][1:])
            lines.append(f"    {s['count']:>6} {s['gpu_us'] / 1e3:9.3f} ms {s['cpu_us'] / 1e3:9.3f} ms  "
                         f"{s['sequence'][0]}: {kernels}")
    return "\n".join(lines)


def format_findings(findings: list[dict]) -> str:
    if not findings:
        return "  no antipattern found"
    lines = []
    for f in sorted(findings, key=lambda f: -f["gpu_seconds_at_stake"]):
        lines.append(f"  [{f['severity']}] {f['title']} ({f['gpu_seconds_at_stake']:.3f} GPU-s at stake)")
        lines.append(f"      {f['evidence']}")
        lines.append(f"      try: {f['recommendation']}")
    return "\n".join(lines)


def job_analysis(records: list[dict]) -> dict | None:
    """The ranks of a job side by side and who came last to the collectives, for the readable
    ``records`` of two or more ranks (None otherwise)."""
    usable = {r["rank"]: r for r in records if not r.get("unreadable") and r["gpu_events"]}
    if len(usable) < 2:
        return None
    s = stragglers({rank: r.get("collectives", []) for rank, r in usable.items()})
    waits = {row["rank"]: row for row in s["ranks"]}
    ranks = []
    for rank, r in sorted(usable.items()):
        steps = r.get("profiler_steps") or 0
        ranks.append({"rank": rank, "source": r["source"], "steps": steps,
                      "gpu_time_per_step_us": r["kernel_time_us"] / steps if steps else None,
                      "idle_pct": r["idle_pct"], "compute_pct": r["compute_pct"],
                      "communication_us": r["communication_time_us"], "overlap_pct": r["comp_comm_overlap_pct"],
                      "launch_delay_mean_us": r["launch_delay_mean_us"],
                      "collectives": waits[rank]["collectives"], "came_last": waits[rank]["last"],
                      "waited_us": waits[rank]["waited_us"], "others_waited_us": waits[rank]["caused_us"],
                      "critical_path": _path_shares(r.get("critical_path"))})
    return {"ranks": ranks, "collectives": s["collectives"], "straggler": s["straggler"]}


def _path_shares(cp: dict | None) -> dict | None:
    """A rank's critical path per step and what it ran on, as shares of it (None without one)."""
    if not cp or not cp["steps"] or not cp["total"]["path_us"]:
        return None
    total = cp["total"]
    path = total["path_us"]
    return {"path_per_step_us": path / len(cp["steps"]), "cpu_pct": 100 * total["cpu_us"] / path,
            "gpu_compute_pct": 100 * total["gpu_compute_us"] / path,
            "communication_pct": 100 * total["communication_us"] / path,
            "waiting_pct": 100 * (total["launch_overhead_us"] + total["kernel_gap_us"]) / path}


def format_job(job: dict) -> str:
    lines = [f"job: {len(job['ranks'])} ranks side by side; {job['collectives']} collectives matched across them",
             (f"  {'rank':>5} {'GPU ms/step':>12} {'idle %':>7} {'comp %':>7} {'comm ms':>9} {'overlap %':>9} "
              f"{'came last':>9} {'waited ms':>10} {'others waited ms':>16}")]

    def num(v, fmt):
        return "n/a" if v is None else format(v, fmt)

    for r in job["ranks"]:
        lines.append(
            f"  {r['rank']:>5} {num(r['gpu_time_per_step_us'] and r['gpu_time_per_step_us'] / 1e3, '.3f'):>12} "
            f"{num(r['idle_pct'], '.1f'):>7} {num(r['compute_pct'], '.1f'):>7} "
            f"{r['communication_us'] / 1e3:>9.3f} {num(r['overlap_pct'], '.1f'):>9} "
            f"{r['came_last']:>9} {r['waited_us'] / 1e3:>10.3f} {r['others_waited_us'] / 1e3:>16.3f}"
        )
    paths = [(r["rank"], r["critical_path"]) for r in job["ranks"] if r.get("critical_path")]
    if paths:
        lines.append(f"  critical path per rank: {'rank':>5} {'ms/step':>9} {'CPU %':>6} {'GPU %':>6} {'comm %':>6} "
                     f"{'waiting %':>9}")
        lines += [f"  {'':22} {rank:>5} {p['path_per_step_us'] / 1e3:>9.3f} {p['cpu_pct']:>6.1f} "
                  f"{p['gpu_compute_pct']:>6.1f} {p['communication_pct']:>6.1f} {p['waiting_pct']:>9.1f}"
                  for rank, p in paths]
    s = job["straggler"]
    if s is None:
        lines.append("  no straggler: no rank came last to most collectives" if job["collectives"]
                     else "  no collective seen on two ranks: arrival order unknown")
    else:
        lines.append(f"  STRAGGLER: rank {s['rank']} came last to {100 * s['last_share']:.0f} % of the collectives; "
                     f"the other ranks waited {s['caused_us'] / 1e6:.3f} GPU-s for it. Look at what it does before "
                     "them: its input pipeline, its host (CPU, throttled GPU) or an uneven share of the work.")
    return "\n".join(lines)


def run(paths: list[str], as_json: bool, workflow_id: str = "", critical_path: bool = False,
        kernel_sequences: list[str] | None = None) -> tuple[str, int]:
    """``analyze_paths``'s text and the exit status: 2 if a file could not be read (it is no
    trace, or nothing in it is usable: the user's to fix), 1 if one was damaged or had items
    that were skipped (its figures then cover only what was read and usable), else 0."""
    text, records = analyze_paths(paths, as_json, workflow_id, critical_path, kernel_sequences)
    return text, status_of(records)


def status_of(records: list[dict]) -> int:
    if any(r.get("unreadable") for r in records):
        return 2
    return 1 if any(r["partial"] or r.get("skipped") for r in records) else 0


def analyze_paths(paths: list[str], as_json: bool, workflow_id: str = "", critical_path: bool = False,
                  kernel_sequences: list[str] | None = None,
                  thresholds: DetectorConfig = DEFAULTS.default) -> tuple[str, list[dict]]:
    """The analyses of ``paths`` as text (or JSON), the job's ranks side by side when they are
    several, and each file's record (``unreadable``: it could not be read; ``partial``: it was
    damaged, its figures cover what was read). ``critical_path``: each step's critical path
    too; ``kernel_sequences``: operator names whose frequent kernel sequences to find."""
    results = [analyze_file_with_findings(p, workflow_id, critical_path=critical_path,
                                          kernel_sequences=kernel_sequences, thresholds=thresholds) for p in paths]
    job = job_analysis([a for a, _ in results])
    if as_json:
        text = json.dumps({"traces": [{"analysis": a, "findings": f} for a, f in results], "job": job}, indent=1)
    else:
        text = "\n\n".join(
            format_record(a)
            + ("\n" + format_critical_path(a["critical_path"]) if "critical_path" in a and a["gpu_events"] else "")
            + ("\n" + format_kernel_sequences(a["kernel_sequences"])
               if "kernel_sequences" in a and a["gpu_events"] else "")
            + ("" if a.get("unreadable") or not a["gpu_events"] else "\n  findings:\n" + format_findings(f))
            for a, f in results
        )
        if job is not None:
            text += "\n\n" + format_job(job)
    return text, [a for a, _ in results]
