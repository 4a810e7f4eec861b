"""What changed between two profiles of a workflow: ``gpufleet diff`` and the worker's
regression findings.

A profile is the ``TraceAnalysis`` records of its ranks. Two profiles rarely cover the same
number of steps, so every figure is per profiler step (a rank's total over the steps its
analysis covers), averaged over the ranks; a profile without profiler steps is compared on
its totals, which is only fair for captures of equal length (the diff says so).

Compared: the GPU timeline of a step and its split (idle, compute, non-compute), the time of
each kernel type and overlap, communication/computation overlap, launches and launch delay,
and each kernel's launches and time. Kernels are those of the records' top kernels (plus
"others"), or every kernel where the caller has them (``gpufleet diff`` reads the files).
Rows are ranked by how much GPU time per step they changed.
"""

from __future__ import annotations

import statistics

import msgspec

from streams.traces.kernel_type import short_kernel_name

RULE = "profile_regression"


class RegressionConfig(msgspec.Struct, frozen=True):
    """When a new profile of a workflow is a regression: its step took at least ``min_pct``
    % and ``min_us`` longer on the GPU than in the previous profile of the same rank."""

    min_pct: float = 10.0
    min_us: float = 100.0


def profile_figures(analyses: list[dict], kernels: dict[tuple[str, str], list[float]] | None = None) -> dict:
    """Per-step figures of a profile (``analyses``: one ``TraceAnalysis`` record per rank).
    ``kernels``: (kernel type, name) -> [launches, time_us] summed over the ranks, where the
    caller has every kernel; otherwise the records' top kernels are used."""
    usable = [a for a in analyses if a.get("gpu_events")]
    per_step = bool(usable) and all(a.get("profiler_steps") for a in usable)

    def scale(a: dict) -> float:
        return 1.0 / a["profiler_steps"] if per_step else 1.0

    def mean(values: list[float]) -> float | None:
        return statistics.fmean(values) if values else None

    ranks = len(usable)
    figures = {
        "ranks": ranks,
        "per_step": per_step,
        "steps": sum(a.get("profiler_steps", 0) for a in usable),
        "partial": any(a.get("partial") for a in analyses),
        "gpu_time_us": mean([a["kernel_time_us"] * scale(a) for a in usable]),
        "idle_us": mean([a["idle_time_us"] * scale(a) for a in usable]),
        "compute_us": mean([a["compute_time_us"] * scale(a) for a in usable]),
        "non_compute_us": mean([a["non_compute_time_us"] * scale(a) for a in usable]),
        "overlap_pct": mean([a["comp_comm_overlap_pct"] for a in usable if a.get("comp_comm_overlap_pct") is not None]),
        "launches": mean([a["launches"] * scale(a) for a in usable]),
        "launch_delay_mean_us": mean([a["launch_delay_mean_us"] for a in usable
                                      if a.get("launch_delay_mean_us") is not None]),
        "kernel_types": {},
        "kernels": {},
    }
    for a in usable:
        for k in a.get("kernel_types", []):
            figures["kernel_types"][k["kernel_type"]] = figures["kernel_types"].get(k["kernel_type"], 0.0) \
                + k["time_us"] * scale(a) / ranks
    if kernels is not None:
        total_scale = (1.0 / statistics.fmean([a["profiler_steps"] for a in usable]) if per_step else 1.0) / max(
            ranks, 1
        )
        figures["kernels"] = {key: [n * total_scale, t * total_scale] for key, (n, t) in kernels.items()}
    else:
        for a in usable:
            for k in a.get("top_kernels", []):
                row = figures["kernels"].setdefault((k["kernel_type"], k["name"]), [0.0, 0.0])
                row[0] += k["launches"] * scale(a) / ranks
                row[1] += k["time_us"] * scale(a) / ranks
    return figures


def diff_profiles(base: dict, cand: dict) -> dict:
    """What changed from ``base`` to ``cand`` (both from :func:`profile_figures`)."""

    def change(key: str) -> dict:
        b, c = base[key], cand[key]
        delta = None if b is None or c is None else c - b
        return {"metric": key, "base": b, "cand": c, "delta": delta,
                "delta_pct": None if delta is None or not b else 100.0 * delta / b}

    summary = [change(k) for k in ("gpu_time_us", "idle_us", "compute_us", "non_compute_us", "overlap_pct",
                                   "launches", "launch_delay_mean_us")]
    types = []
    for t in sorted(set(base["kernel_types"]) | set(cand["kernel_types"])):
        b, c = base["kernel_types"].get(t, 0.0), cand["kernel_types"].get(t, 0.0)
        types.append({"kernel_type": t, "base_us": b, "cand_us": c, "delta_us": c - b})
    types.sort(key=lambda r: -abs(r["delta_us"]))
    kernels = []
    for key in set(base["kernels"]) | set(cand["kernels"]):
        b, c = base["kernels"].get(key), cand["kernels"].get(key)
        status = "new" if b is None else "gone" if c is None else "changed"
        b, c = b or [0.0, 0.0], c or [0.0, 0.0]
        kernels.append({"kernel_type": key[0], "name": key[1], "status": status, "base_launches": b[0],
                        "cand_launches": c[0], "base_us": b[1], "cand_us": c[1], "delta_us": c[1] - b[1]})
    kernels.sort(key=lambda r: (-abs(r["delta_us"]), r["name"]))
    comparable = base["per_step"] == cand["per_step"]
    return {"per_step": base["per_step"] and cand["per_step"], "comparable": comparable,
            "base": {k: base[k] for k in ("ranks", "steps", "partial")},
            "cand": {k: cand[k] for k in ("ranks", "steps", "partial")},
            "summary": summary, "kernel_types": types, "kernels": kernels}


def regression(diff: dict, config: RegressionConfig) -> dict | None:
    """The GPU time per step a profile lost against the previous one, if it is a regression
    under ``config``: ``{"delta_us", "delta_pct", "base_us", "cand_us"}``."""
    if not diff["per_step"] or not diff["comparable"]:
        return None  # totals of captures of different lengths are not comparable
    gpu = diff["summary"][0]
    if gpu["delta"] is None or gpu["delta_pct"] is None:
        return None
    if gpu["delta"] < config.min_us or gpu["delta_pct"] < config.min_pct:
        return None
    return {"delta_us": gpu["delta"], "delta_pct": gpu["delta_pct"], "base_us": gpu["base"], "cand_us": gpu["cand"]}


def regression_finding(diff: dict, found: dict, analysis: dict, baseline: dict, detected_at: int) -> dict:
    """The ``Finding`` of a regression of ``analysis`` against ``baseline`` (the previous
    profile of its workflow and rank): what grew most, and the GPU time the profiled steps lost."""
    grew = [k for k in diff["kernels"] if k["delta_us"] > 0][:3]
    causes = []
    idle = next(s for s in diff["summary"] if s["metric"] == "idle_us")
    if idle["delta"] and idle["delta"] > 0:
        causes.append(f"GPU idle +{idle['delta'] / 1e3:.3f} ms")
    for k in grew:
        what = {"new": " (new)", "gone": "", "changed": ""}[k["status"]]
        causes.append(f"{_short(k['name'])}{what} +{k['delta_us'] / 1e3:.3f} ms")
    steps = analysis.get("profiler_steps") or 1
    return {
        "finding_id": f"{analysis['trace_id']}:{RULE}",
        "trace_id": analysis["trace_id"],
        "workflow_id": analysis["workflow_id"],
        "rank": analysis["rank"],
        "rule": RULE,
        "severity": "CRITICAL" if found["delta_pct"] >= 50 else "WARNING",
        "title": f"A step takes {found['delta_pct']:.0f} % longer on the GPU than in the previous profile",
        "evidence": (f"GPU time per step {found['cand_us'] / 1e3:.3f} ms against {found['base_us'] / 1e3:.3f} ms "
                     f"in {baseline['trace_id']}; per step: " + (", ".join(causes) or "no single cause")),
        "gpu_seconds_at_stake": found["delta_us"] * steps / 1e6,
        "recommendation": (f"See what changed: gpufleet diff on the two profiles ({baseline['trace_id']} and "
                           f"{analysis['trace_id']}). Look for a framework, library or driver upgrade, a change of "
                           "model, batch size or precision, or a slower input pipeline since the previous profile."),
        "detected_at": detected_at,
    }


def _short(name: str) -> str:
    return short_kernel_name(name, width=60)


# -- text --------------------------------------------------------------------------------------
_LABELS = {"gpu_time_us": "GPU time", "idle_us": "  idle", "compute_us": "  compute",
           "non_compute_us": "  non-compute", "overlap_pct": "comm/comp overlap %", "launches": "launches",
           "launch_delay_mean_us": "launch delay (mean)"}


def render_diff(diff: dict, top: int = 15) -> str:
    unit = "per step (mean over ranks)" if diff["per_step"] else "per profile (totals: no profiler steps)"
    b, c = diff["base"], diff["cand"]
    lines = [(f"baseline: {b['ranks']} rank(s), {b['steps']} steps{' PARTIAL' if b['partial'] else ''}; "
              f"candidate: {c['ranks']} rank(s), {c['steps']} steps{' PARTIAL' if c['partial'] else ''}; "
              f"figures {unit}")]
    if not diff["comparable"]:
        lines.append("WARNING: one profile has profiler steps and the other not: totals and per-step figures are "
                     "compared as they are")
    lines.append(f"  {'':<22}{'baseline':>14}{'candidate':>14}{'change':>14}{'':>9}")
    for s in diff["summary"]:
        scale, unit_s = (1e3, " ms") if s["metric"].endswith("_us") else (1.0, "")
        lines.append(
            f"  {_LABELS[s['metric']]:<22}{_num(s['base'], scale, unit_s):>14}{_num(s['cand'], scale, unit_s):>14}"
            f"{_num(s['delta'], scale, unit_s, sign=True):>14}{_pct(s['delta_pct']):>9}"
        )
    if diff["kernel_types"]:
        lines.append("  by kernel type")
        for t in diff["kernel_types"]:
            lines.append(f"    {t['kernel_type']:<56}{t['base_us'] / 1e3:>10.3f}{t['cand_us'] / 1e3:>10.3f}"
                         f"{t['delta_us'] / 1e3:>+10.3f} ms")
    changed = [k for k in diff["kernels"] if k["delta_us"] or k["status"] != "changed"][:top]
    if changed:
        lines.append(f"  kernels that changed most (GPU ms {unit.split(' (')[0]}; launches)")
        for k in changed:
            mark = {"new": "NEW ", "gone": "GONE", "changed": "    "}[k["status"]]
            lines.append(
                f"    {mark} {k['base_us'] / 1e3:>9.3f} -> {k['cand_us'] / 1e3:>9.3f} ({k['delta_us'] / 1e3:>+9.3f})"
                f"  {k['base_launches']:>7.1f} -> {k['cand_launches']:>7.1f}  {k['kernel_type'][:4]} "
                f"{_short(k['name'])}"
            )
    return "\n".join(lines)


def _num(value: float | None, scale: float, unit: str, sign: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value / scale:{'+' if sign else ''}.3f}{unit}"


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value:+.1f} %"


class ComparisonConfig(msgspec.Struct, frozen=True):
    regressions: RegressionConfig = RegressionConfig()
    # A requested profile's ranks are kept this long after the last one arrived.
    ranks_retention_s: float = 3600.0
