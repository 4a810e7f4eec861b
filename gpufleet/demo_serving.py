"""The demo's serving deployment (``producers.simulate.serving``): how it is set up, and what the
pipeline measured of it (``serving_windows`` in ClickHouse, as ``gpufleet serving`` reads it)
beside what the simulator planted in the windows that closed."""

from __future__ import annotations

from collections import defaultdict

from gpufleet.reports.serving import services
from producers.simulate.serving import SERVICE, ServingPlan, serving_samples_at
from streams.serving.service import replicas_needed

# The demo runs 30 simulated minutes: a replica is told after 10 minutes without a request.
DEMO_THRESHOLDS = "[default]\nidle_replica_min_s = 600\n"
SPAN_S, MARGIN, WINDOW_MS = 600, 0.2, 60_000


def planted(fleet, ticks: int, published: int, start_ms: int, closed_to: int, plan: ServingPlan) -> dict:
    """What the simulator sent, by the windows that closed: each replica's requests by window,
    the busiest span, each replica's capacity (its busiest window) and the replicas needed."""
    windows: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for tick in range(published):
        for s in serving_samples_at(fleet, tick, ticks, start_ms, 1000, plan):
            start = s["event_time"] // WINDOW_MS * WINDOW_MS
            if start + WINDOW_MS <= closed_to:
                windows[s["workflow_id"]][start] += s["requests"]
    spans: dict[int, float] = defaultdict(float)
    for per_window in windows.values():
        for start, requests in per_window.items():
            spans[start // (SPAN_S * 1000) * SPAN_S * 1000] += requests
    peak = max(spans.values(), default=0.0) / SPAN_S
    capacity = [max(w.values()) / (WINDOW_MS / 1000) for w in windows.values() if any(w.values())]
    idle = sorted(wf for wf, w in windows.items() if not any(w.values()))
    return {"peak": peak, "needed": replicas_needed(capacity, peak, MARGIN), "idle": idle, "replicas": len(windows)}


def serving_against_planted(client, database: str, fleet, ticks: int, published: int, start_ms: int,
                            plan: ServingPlan) -> str:
    (closed_to,), = client.query(f"SELECT toUnixTimestamp64Milli(max(window_end)) FROM {database}.serving_windows"
                                 ).result_rows
    loads = [s for s in services(client, database, "all", SPAN_S, MARGIN) if s.service == SERVICE]
    if not loads or not closed_to:
        return "no serving window closed"
    got, want = loads[0], planted(fleet, ticks, published, start_ms, closed_to, plan)
    (never_served,) = client.query(
        f"SELECT groupArray(workflow_id) FROM (SELECT workflow_id FROM {database}.serving_windows FINAL "
        f"WHERE service = {{s:String}} GROUP BY workflow_id HAVING countIf(requests > 0) = 0 ORDER BY workflow_id)",
        parameters={"s": SERVICE}).result_rows[0]
    alerted = [wf for (wf,) in client.query(
        f"SELECT DISTINCT workflow_id FROM {database}.alerts FINAL WHERE detector = 'idle_replica' "
        "AND status = 'FIRING' ORDER BY workflow_id").result_rows]
    rows = [("replicas", got.replicas, want["replicas"]),
            ("replicas that served no request", len(never_served), len(want["idle"])),
            (f"busiest {SPAN_S // 60} min, requests/s", f"{got.peak_per_s:.3f}", f"{want['peak']:.3f}"),
            (f"replicas needed (+{MARGIN:.0%})", got.replicas_needed, want["needed"])]
    title = (f"{plan.replicas} replicas of {SERVICE}, the router sending traffic to {plan.active} "
             f"(peak {plan.peak_per_s:g} requests/s):")
    lines = [title, f"{'':<34}  {'measured':>24}  {'planted':>24}"]
    lines += [f"{name:<34}  {m!s:>24}  {p!s:>24}" for name, m, p in rows]
    lines.append(f"served no request: {', '.join(sorted(never_served)) or 'none'} (planted: "
                 f"{'the same' if sorted(never_served) == want['idle'] else ', '.join(want['idle'])})")
    lines.append(f"GPU-hours held beyond the replicas needed: {got.freed_gpu_hours:.3f} of {got.gpu_hours:.3f}; "
                 f"idle-replica alerts: {', '.join(alerted) or 'none yet'}")
    return "\n".join(lines)
