"""The profile comparison stage's decisions as plain functions: the stage's state (its table's
data: key -> entry) and a partition's analyses in; the findings and the keys changed, out
(``compare``); and the requested profiles whose ranks stopped arriving (``expired``).

``streams.stages.comparison`` reads the topic, calls them inside its batch and sends what they
return (records before state: ``streams.stages.state``).
"""

from __future__ import annotations

from schemas.topics import request_of_trace
from streams.profiling.diff import (
    ComparisonConfig,
    RegressionConfig,
    diff_profiles,
    profile_figures,
    regression,
    regression_finding,
)
from streams.traces.collectives import stragglers

STRAGGLER_RULE = "straggler_rank"
# What of an analysis the baseline keeps (all the diff reads).
BASELINE_FIELDS = ("trace_id", "workflow_id", "rank", "partial", "gpu_events", "profiler_steps", "kernel_time_us",
                   "idle_time_us", "compute_time_us", "non_compute_time_us", "comp_comm_overlap_pct", "launches",
                   "launch_delay_mean_us", "kernel_types", "top_kernels", "analyzed_at")


def baseline_key(analysis: dict) -> str:
    return f"rank\x00{analysis['workflow_id']}\x00{analysis['rank']}"


def profile_key(workflow_id: str, request_id: str) -> str:
    return f"profile\x00{workflow_id}\x00{request_id}"


def compare(state, partition: int, analyses: list[dict], config: ComparisonConfig,
            now: int) -> tuple[list[dict], set[str]]:
    """The findings of ``analyses`` against ``state`` (the stage's table: key -> entry), which
    is updated; returns the findings and the keys changed."""
    findings, changed = [], set()
    for analysis in analyses:
        if analysis["partial"] or not analysis["gpu_events"]:
            continue
        findings += _against_previous(state, partition, analysis, config.regressions, now, changed)
        findings += _against_other_ranks(state, partition, analysis, now, changed)
    return findings, changed


def _against_previous(state, partition: int, analysis: dict, config: RegressionConfig, now: int,
                      changed: set[str]) -> list[dict]:
    key = baseline_key(analysis)
    base = state.get(key)
    if base is not None and (base["trace_id"] == analysis["trace_id"] or analysis["analyzed_at"] < base["analyzed_at"]):
        return []  # the same profile again (a replay), or one older than the baseline that came late
    found = []
    if base is not None:
        diff = diff_profiles(profile_figures([base]), profile_figures([analysis]))
        regressed = regression(diff, config)
        if regressed is not None:
            found.append(regression_finding(diff, regressed, analysis, base, now))
    state[key] = {**{f: analysis.get(f) for f in BASELINE_FIELDS}, "partition": partition}
    changed.add(key)
    return found


def _against_other_ranks(state, partition: int, analysis: dict, now: int, changed: set[str]) -> list[dict]:
    origin = request_of_trace(analysis["trace_id"])
    if origin is None or not analysis.get("collectives"):
        return []  # not a requested profile (its ranks cannot be told apart), or no collective
    request_id, _, rank = origin
    key = profile_key(analysis["workflow_id"], request_id)
    entry = state.get(key) or {"partition": partition, "workflow_id": analysis["workflow_id"],
                               "request_id": request_id, "ranks": {}, "trace_ids": {}}
    entry["ranks"][str(rank)] = analysis["collectives"]
    entry["trace_ids"][str(rank)] = analysis["trace_id"]
    entry["updated_ms"] = now
    state[key] = entry
    changed.add(key)
    if len(entry["ranks"]) < 2:
        return []
    result = stragglers({int(r): c for r, c in entry["ranks"].items()})
    s = result["straggler"]
    if s is None:
        return []
    return [{
        "finding_id": f"profile/{request_id}:{STRAGGLER_RULE}",
        "trace_id": entry["trace_ids"][str(s["rank"])],
        "workflow_id": analysis["workflow_id"],
        "rank": s["rank"],
        "rule": STRAGGLER_RULE,
        "severity": "WARNING",
        "title": f"Rank {s['rank']} arrives last at the collectives: the other ranks wait for it",
        "evidence": (f"of {result['collectives']} collectives matched across {len(entry['ranks'])} ranks of profile "
                     f"{request_id}, rank {s['rank']} came last to {100 * s['last_share']:.0f} %; the others waited "
                     f"{s['caused_us'] / 1e3:.3f} ms in all"),
        "gpu_seconds_at_stake": s["caused_us"] / 1e6,
        "recommendation": (f"Find what rank {s['rank']} does more or slower before each collective: its input "
                           "pipeline (data loading on its host), its host (CPU contention, a throttled or unhealthy "
                           "GPU: see its samples) or an uneven share of the work (unbalanced batches or layers)."),
        "detected_at": now,
    }]


def expired(state, now: int, config: ComparisonConfig) -> dict[str, int]:
    """Requested profiles whose ranks stopped arriving ``ranks_retention_s`` ago: key -> partition."""
    limit = now - config.ranks_retention_s * 1000
    return {k: v["partition"] for k, v in list(state.items())
            if k.startswith("profile\x00") and v is not None and v["updated_ms"] < limit}
