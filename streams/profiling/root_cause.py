"""The closed loop's second half: an automatic profile's findings go into the alert that caused it.

A firing low-utilisation or input-bound alert makes the worker request a profile of the
workflow (``auto_profile``). Each rank's trace is analysed on the trace stage, which sends a
``ProfileResult`` (``profile_result``) keyed and partitioned like the workflow's samples; the
window stage, which keeps the alert's life cycle, merges the ranks' results into it
(``apply_profile_result``) and sends the alert again -- same ``alert_id``, now with the root
cause and the top findings -- so the owner learns *why* while the job still runs. A replayed
result changes nothing (each trace counts once), and the root cause stays on the episode's
later transitions (its RESOLVED too).
"""

from __future__ import annotations

from streams.windows.workflow_state import WorkflowState

TOP_FINDINGS = 3
FOLLOWS = " An automatic profile was requested; its findings will follow in an update of this alert."


def profile_result(analysis: dict, findings: list[dict], request_id: str, host: str, rank: int,
                   now_ms: int) -> dict:
    """The ``ProfileResult`` of one rank's analysed trace (``TraceAnalysis`` + its ``Finding``s)."""
    idle = sum(s["host_wait_us"] + s["kernel_wait_us"] + s["other_us"] for s in analysis["idle_by_stream"])
    host_wait = sum(s["host_wait_us"] for s in analysis["idle_by_stream"])
    return {
        "request_id": request_id, "workflow_id": analysis["workflow_id"], "trace_id": analysis["trace_id"],
        "host": host, "rank": rank, "kernel_time_us": float(analysis["kernel_time_us"]),
        "idle_pct": analysis["idle_pct"],
        "host_wait_pct_of_idle": 100.0 * host_wait / idle if idle > 0 else None,
        "error": analysis.get("error"),
        "system": analysis.get("system"),
        "findings": [{k: f[k] for k in ("rule", "title", "evidence", "recommendation", "gpu_seconds_at_stake")}
                     | {"severity": str(f["severity"])} for f in findings],
        "analyzed_at": now_ms,
    }


def apply_profile_result(state: WorkflowState, result: dict, now_ms: int) -> dict | None:
    """Merge ``result`` into the alert episode that requested it; the updated alert, or None
    (not an automatic profile of a known episode, or a result already counted)."""
    for lifecycle in state.alerts.values():
        if lifecycle.get("profile_request_id") == result["request_id"] and lifecycle.get("last_alert"):
            break
    else:
        return None
    ranks = lifecycle.setdefault("profile_ranks", {})
    if result["trace_id"] in ranks:
        return None  # a replay: this rank is in already
    ranks[result["trace_id"]] = {
        "kernel_time_us": result["kernel_time_us"], "idle_pct": result["idle_pct"],
        "host_wait_pct_of_idle": result["host_wait_pct_of_idle"], "findings": result["findings"],
        "system": result.get("system"),
    }
    top = _top_findings(ranks)
    lifecycle["findings"] = top
    lifecycle["root_cause"] = root_cause = _describe(ranks, top)
    base = lifecycle["last_alert"]
    firing = base["status"] == "FIRING"
    # The owner hears the root cause once, and only if they heard about the alert (its rate limit).
    notify = firing and base["notify"] and not lifecycle.get("root_cause_notified")
    if notify:
        lifecycle["root_cause_notified"] = True
    return {
        **base,
        "notify": notify,
        "message": base["message"].replace(FOLLOWS, "") + f" Automatic profile {result['request_id']}: {root_cause}",
        "root_cause": root_cause,
        "findings": top,
        "fired_at": now_ms,
    }


def _top_findings(ranks: dict) -> list[dict]:
    """One entry per rule over all ranks: the rank where most GPU time is at stake speaks for it."""
    by_rule: dict[str, dict] = {}
    for rank in ranks.values():
        for f in rank["findings"]:
            best = by_rule.get(f["rule"])
            if best is None:
                by_rule[f["rule"]] = {**f, "ranks": 1}
            else:
                best["ranks"] += 1
                if f["gpu_seconds_at_stake"] > best["gpu_seconds_at_stake"]:
                    best.update({**f, "ranks": best["ranks"]})
    order = {"CRITICAL": 0, "WARNING": 1, "INFO": 2}
    ranked = sorted(
        by_rule.values(), key=lambda f: (-f["gpu_seconds_at_stake"], order.get(f["severity"], 3), f["rule"])
    )
    return ranked[:TOP_FINDINGS]


def _describe(ranks: dict, top: list[dict]) -> str:
    weights = [(r["kernel_time_us"], r) for r in ranks.values() if r["idle_pct"] is not None]
    total = sum(w for w, _ in weights)
    parts = []
    if total > 0:
        idle = sum(w * r["idle_pct"] for w, r in weights) / total
        waits = [(w, r["host_wait_pct_of_idle"]) for w, r in weights if r["host_wait_pct_of_idle"] is not None]
        text = f"GPU idle {idle:.0f} % of the profiled time"
        if waits and sum(w for w, _ in waits) > 0:
            host = sum(w * v for w, v in waits) / sum(w for w, _ in waits)
            text += f", {host:.0f} % of it waiting on the host"
        parts.append(text + f" ({len(ranks)} rank{'s' if len(ranks) != 1 else ''} profiled).")
    seen = _system_seen([r["system"] for r in ranks.values() if r.get("system")])
    if seen:
        parts.append(seen)
    if top:
        parts.append("Found: " + "; ".join(f"{f['title']} ({f['gpu_seconds_at_stake']:.2f} GPU-s at stake)"
                                           for f in top) + ".")
        parts.append(f"Try: {top[0]['recommendation']}")
    else:
        parts.append("No antipattern found in the trace.")
    return " ".join(parts)


_SEEN = (("gpu_utilization_mean_pct", "GPU utilisation {:.0f} %"), ("sm_active_mean_pct", "SM activity {:.0f} %"),
         ("host_cpu_mean_pct", "host CPU {:.0f} %"), ("host_iowait_mean_pct", "I/O wait {:.0f} %"))


def _system_seen(systems: list[dict]) -> str | None:
    """What the agents measured during the capture, over all ranks (weighted by time covered)."""
    ticks = sum(s["ticks"] for s in systems)
    if not ticks:
        return None
    said = []
    for key, text in _SEEN:
        values = [(s["span_ms"], s[key]) for s in systems if s[key] is not None and s["span_ms"] > 0]
        if values:
            said.append(text.format(sum(w * v for w, v in values) / sum(w for w, _ in values)))
    if not said:
        return None
    interval = sum(s["span_ms"] for s in systems) / ticks
    return f"Meanwhile the host agents measured {', '.join(said)} ({ticks} samples, one every {interval:.0f} ms)."
