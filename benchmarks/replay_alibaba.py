"""Replays Alibaba's public GenAI serving trace (``../shared/datasets/alibaba-genai-2026``: 143
Stable Diffusion serving containers' GPU duty cycle over 22.8 h, one sample every ~57 s) through
the window stage's step, in process and in event-time order, with the worker's default settings:
each container a workflow of one GPU, each duty-cycle sample a GPU sample standing for the time to
the next one (at most 120 s). Prints what the alerts do with a real fleet: how many replicas are
alerted, how many alerts are still firing after their workflow ended, how many fire inside the
start-up the waterfall counts, and how many episodes (messages) a workflow gets; then the same
with each container's traffic beside its samples (a serving replica judged by what it served),
and the service's peak, the replicas it needed and the GPU-hours held beyond them.

    .venv/bin/python benchmarks/replay_alibaba.py [--hours H]

A measurement, not a benchmark of speed: the data is scaled by its publishers ("preserving
trends"), so the figures describe this trace, not a site.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from schemas.topics import ALERTS, SERVING_WINDOWS, WORKFLOW_SUMMARIES, WORKFLOW_WINDOWS
from sinks.serving_digest import ServingDigests
from streams.serving.service import load
from tests.support.alibaba import DATA, duty_cycles, qps, replay, samples, traffic


def report(series, sent) -> None:
    alerts = [a for spec, a in sent if spec is ALERTS]
    summaries = {s["workflow_id"]: s for spec, s in sent if spec is WORKFLOW_SUMMARIES}
    windows = [w for spec, w in sent if spec is WORKFLOW_WINDOWS]
    last_status: dict[str, dict] = {}
    for a in alerts:
        last_status[a["alert_id"]] = a
    firing_after_end = [a for a in last_status.values() if a["status"] == "FIRING"]
    messages = Counter((a["workflow_id"], a["detector"]) for a in alerts if a["status"] == "FIRING" and a["notify"])
    alerted = {a["workflow_id"] for a in alerts if a["status"] == "FIRING"}
    started = {w["workflow_id"]: w for w in windows if w.get("startup_gpu_seconds", 0) > 0}
    in_startup = [a for a in alerts if a["status"] == "FIRING" and a["workflow_id"] in started
                  and a["window_start"] == started[a["workflow_id"]]["window_start"]]
    idle_msgs = [n for (wf, d), n in messages.items() if d == "idle_allocated"]
    print(f"containers replayed        {len(series)}")
    print(f"workflows summarised       {len(summaries)} (ended by silence)")
    print(f"replicas alerted           {len(alerted)} of {len(series)}")
    print(f"alerts FIRING at the end   {len(firing_after_end)} (after every workflow ended)")
    print(f"alerts in start-up windows {len(in_startup)}")
    print(f"idle-allocation messages   {sum(idle_msgs)} on {len(idle_msgs)} workflows, "
          f"median {sorted(idle_msgs)[len(idle_msgs) // 2] if idle_msgs else 0} each")
    print(f"messages by detector       {dict(Counter(d for (_, d), n in messages.items() for _ in range(n)))}")


def report_serving(sent) -> None:
    windows = [r for spec, r in sent if spec is SERVING_WINDOWS]
    got = load("stable-diffusion", windows, span_ms=600_000, margin=0.2)
    states = Counter(w["state"] for w in windows)
    print(f"serving windows            {dict(states)}")
    print(f"service peak               {got.peak_per_s:.2f} requests/s (scaled) over 10 min, "
          f"{got.replicas_at_peak} replicas held")
    print(f"replicas needed (+20 %)    {got.replicas_needed} of {got.replicas}"
          f"{' (an upper bound: no replica saturated)' if not got.saturated_windows else ''}")
    print(f"GPU-hours beyond them      {got.freed_gpu_hours:,.0f} of {got.gpu_hours:,.0f}")
    (firing, resolved), (firing_told, resolved_told) = told_together([a for spec, a in sent if spec is ALERTS])
    print(f"idle-replica messages      one per alert: {firing} (and {resolved} RESOLVED); a service's told together "
          f"(the notifier's default {DIGEST_S} s, each alert arriving at its window's end): {firing_told} (and "
          f"{resolved_told} RESOLVED)")


DIGEST_S = 300


def told_together(alerts: list[dict]) -> tuple[tuple[int, int], tuple[int, int]]:
    """The idle-replica messages an owner and their team get, (FIRING, RESOLVED): one per alert
    (a RESOLVED of each FIRING told), and as the notifier tells them (``sinks.serving_digest``,
    its clock the alerts' own times, as they would come live)."""
    now = [0.0]
    digests = ServingDigests(DIGEST_S, clock=lambda: now[0])
    alone, together = Counter(), Counter()
    notified, resolved = set(), set()  # (one per alert: each alert's FIRING told, and its RESOLVED)
    told: dict[str, set] = {"FIRING": set(), "RESOLVED": set()}  # (together: the notifier's sent log)

    def tell() -> None:
        for digest in digests.due():
            together[digest[0][0]["status"]] += 1
            told[digest[0][0]["status"]].update(a["alert_id"] for a, _ in digest)

    for a in alerts:
        if a["detector"] != "idle_replica":
            continue
        now[0], alert_id = a["window_end"] / 1000, a["alert_id"]
        tell()
        if a["status"] == "FIRING" and a["notify"]:
            alone["FIRING"] += 1
            notified.add(alert_id)
            if alert_id not in told["FIRING"]:
                digests.hold(a, None)
        elif a["status"] == "RESOLVED":
            if alert_id in notified and alert_id not in resolved:
                alone["RESOLVED"] += 1
                resolved.add(alert_id)
            if not digests.drop(alert_id) and alert_id in told["FIRING"] and alert_id not in told["RESOLVED"]:
                digests.hold(a, None)
    now[0] = float("inf")
    tell()
    return (alone["FIRING"], alone["RESOLVED"]), (together["FIRING"], together["RESOLVED"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hours", type=float, default=None, help="the first H hours only (default: all 22.8 h)")
    args = p.parse_args()
    if not DATA.is_dir():
        print(f"replay_alibaba: {DATA} is not here (it sits beside the checkout)", file=sys.stderr)
        return 2
    series = duty_cycles(args.hours)
    print("-- judged by GPU utilisation alone (GPU samples only)")
    report(series, replay(samples(series)))
    print("-- judged by traffic (each sample's ServingSample beside it, from qps.csv)")
    sent = replay(samples(series), traffic(series, qps()))
    report(series, sent)
    report_serving(sent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
