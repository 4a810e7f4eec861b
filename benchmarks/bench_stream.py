"""The stream stage on a real broker: throughput, keeping up with 10,000 GPUs, alert latency.

Starts its own Kafka (``gpufleet/local/kafka.py``) in a temporary directory and measures,
in one run so that the ratios mean something on a noisy machine:

1. throughput over the same pre-published messages (10,000 GPUs x N ticks, as the agents
   send them: each host every ``--send-every`` seconds, each workflow's samples since its last
   send in one GpuSampleColumns message; ``--send-every 1`` for one per tick; ``--format batch``
   for older agents' GpuSampleBatch, row by row, ``--format gpu`` for one GpuSample message per
   GPU sample):
   - baseline: a bare confluent-kafka consumer that only decodes the Avro;
   - ``gpufleet worker`` (batch decode, validate, windows, detectors, changelog);
   - a naive Faust agent: one ``faust.Record`` and one windowed-table update per sample
     (``benchmarks/naive_record_agent.py``).
   Goals (issue 4): worker >= 50 % of the baseline, >= 10x the naive agent.
   With ``--against REV``: the worker of git revision REV (a temporary worktree) on the same
   messages, alternating with this one ``--repeat`` times (medians): what a change cost the
   worker (issue 18: the goodput waterfall may cost at most 10 %).
2. 10,000 GPUs at 1 Hz in real time for ``--live-s`` seconds: the worker's consumer lag,
   sampled every 5 s, must stay flat (not grow with time).
3. Alert latency: a workflow that is idle from its first sample, published in real time;
   from that sample's event time to the webhook receiving the alert. Goal: within the
   detector's required duration + one window + 10 s (run with a 10 s window and 20 s
   duration so that the benchmark takes a minute, not the default 11).

    python benchmarks/bench_stream.py [--ticks 120] [--live-s 60] [--send-every 5] [--format columns]
                                      [--against REV --repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

from confluent_kafka import Consumer, Producer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support.samples

from fleet_load import AgentSends, Lag, fleet_10k, produce, rate_from_commits, stop, worker

from gpufleet.local import kafka as local_kafka
from kafka_client.admin import create_topics, ensure_topics
from kafka_client.config import consumer_config, producer_config
from producers.simulate.fleet import build_fleet
from schemas.codec import Codec
from schemas.topics import GPU_SAMPLES
from sinks.consume_alerts import AlertNotifier
from sinks.route_alerts import load_routing

CODEC = Codec()
FORMATS = {"columns": "GpuSampleColumns", "batch": "GpuSampleBatch", "gpu": "GpuSample per GPU"}














def against(bootstrap, data_dir, rev: str, repeat: int, ticks: int, send_every: int) -> None:
    """This worker against the worker of ``rev`` on the same messages, alternating, medians."""
    prefix = "vs."
    ensure_topics(bootstrap, prefix=prefix)
    topic = prefix + GPU_SAMPLES.name
    producer = Producer(producer_config(bootstrap, **{"linger.ms": 50}))
    agents = AgentSends(fleet_10k(), 1_767_225_600_000, send_every)
    total = sum(produce(producer, topic, agents.tick(t)) for t in range(ticks)) + produce(
        producer, topic, agents.rest()
    )
    producer.flush(60)
    per_message = 10_000 * ticks / total
    tree = data_dir / "against"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=ROOT, check=True, capture_output=True)
    rates: dict[str, list[float]] = {"this": [], rev: []}
    try:
        for r in range(repeat):
            for name, root in (("this", ROOT), (rev, tree)):
                app = f"vs-{'this' if root == ROOT else 'rev'}-{r}"
                proc = worker(bootstrap, prefix, data_dir, app, "--idle-partition-s", "3600", root=root)
                try:
                    rates[name].append(rate_from_commits(bootstrap, app, topic, GPU_SAMPLES.partitions, total, proc)
                                       * per_message)
                finally:
                    stop(proc)
            print(f"  run {r + 1}: this worker {rates['this'][-1]:,.0f} samples/s, {rev} {rates[rev][-1]:,.0f}")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False, capture_output=True)
    ours, theirs = statistics.median(rates["this"]), statistics.median(rates[rev])
    ratios = sorted(a / b for a, b in zip(rates["this"], rates[rev]))
    print(f"against {rev}: this worker {ours:,.0f} samples/s, {rev} {theirs:,.0f} samples/s (medians of {repeat}): "
          f"{ours / theirs:.2f} of it (per-run ratios {', '.join(f'{x:.2f}' for x in ratios)})")




def bare_consume(bootstrap, topic, total) -> float:
    """Messages/s of a consumer that only decodes."""
    c = Consumer(consumer_config(bootstrap, f"bare-{time.time_ns()}"))
    c.subscribe([topic])
    n, t0 = 0, None
    try:
        while n < total:
            messages = c.consume(num_messages=5000, timeout=1.0)
            if messages and t0 is None:
                t0 = time.perf_counter()
            ok, errors = CODEC.decode_many([m.value() for m in messages if m.error() is None])
            n += len(ok) + len(errors)
        return n / (time.perf_counter() - t0)
    finally:
        c.close()


def throughput(bootstrap, data_dir, ticks, send_every=1, fmt="columns", py_spy: Path | None = None) -> dict:
    prefix = "tp."
    ensure_topics(bootstrap, prefix=prefix)  # all of them: the worker needs its co-partitioned inputs alike
    topic = prefix + GPU_SAMPLES.name
    producer = Producer(producer_config(bootstrap, **{"linger.ms": 50}))
    agents = AgentSends(fleet_10k(), 1_767_225_600_000, send_every, fmt)
    total = sum(produce(producer, topic, agents.tick(t)) for t in range(ticks)) + produce(
        producer, topic, agents.rest()
    )
    producer.flush(60)
    per_message = 10_000 * ticks / total  # samples per message; rates below are in samples/s
    print(f"throughput: {10_000 * ticks:,} samples of 10,000 GPUs x {ticks} ticks in {total:,} messages "
          f"({FORMATS[fmt]}{'' if fmt == 'gpu' else f' per host and workflow every {send_every} s'}) "
          f"on {GPU_SAMPLES.partitions} partitions")

    bare = bare_consume(bootstrap, topic, total) * per_message
    print(f"  bare consume + Avro decode   {bare:>10,.0f} samples/s")

    proc = worker(bootstrap, prefix, data_dir, "tp-worker", "--idle-partition-s", "3600")
    spy = None
    if py_spy:  # where the worker's time goes: collapsed stacks, one line per stack
        spy = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "py-spy"),
                "record",
                "--pid",
                str(proc.pid),
                "--format",
                "raw",
                "--rate",
                "200",
                "--output",
                str(py_spy),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
        )
    try:
        ours = rate_from_commits(bootstrap, "tp-worker", topic, GPU_SAMPLES.partitions, total, proc) * per_message
    finally:
        if spy is not None:
            spy.send_signal(2)
            spy.wait(60)
        stop(proc)
    print(f"  gpufleet worker              {ours:>10,.0f} samples/s   {ours / bare:.2f} of bare (goal >= 0.50)")

    app = "tp-naive"
    create_topics(bootstrap, [(f"{app}-busy-gpu-ms-changelog", GPU_SAMPLES.partitions, True)])
    env = {**os.environ, "GPUFLEET_BOOTSTRAP": bootstrap, "GPUFLEET_BENCH_TOPIC": topic,
           "GPUFLEET_BENCH_APP": app, "GPUFLEET_BENCH_DATADIR": str(data_dir / app)}
    with open(data_dir / "naive.log", "ab") as naive_log:
        proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "naive_record_agent.py"), "worker",
                                 "-l", "warn"], cwd=ROOT, env=env, stdout=naive_log, stderr=subprocess.STDOUT)
    try:
        naive = rate_from_commits(bootstrap, app, topic, GPU_SAMPLES.partitions, total, proc) * per_message
    finally:
        stop(proc)
    print(f"  naive faust.Record agent     {naive:>10,.0f} samples/s   worker is {ours / naive:.1f}x (goal >= 10x)")
    return {"bare": bare, "worker": ours, "naive": naive}


def live(bootstrap, data_dir, seconds, send_every=1, fmt="columns") -> list[int]:
    prefix = "live."
    ensure_topics(bootstrap, prefix=prefix)  # all of them: the worker needs its co-partitioned inputs alike
    topic = prefix + GPU_SAMPLES.name
    fleet = fleet_10k(seed=4)
    proc = worker(bootstrap, prefix, data_dir, "live-worker", "--idle-partition-s", "3600")
    producer = Producer(producer_config(bootstrap))
    lags: list[int] = []
    per_tick: list[int] = []  # messages per tick: lag in messages -> seconds of samples
    start_ms = int(time.time() * 1000)
    agents = AgentSends(fleet, start_ms, send_every, fmt)
    t0 = time.monotonic()
    lag = Lag(bootstrap, "live-worker", topic, GPU_SAMPLES.partitions)
    try:
        for tick in range(int(seconds)):
            due = t0 + tick
            time.sleep(max(0.0, due - time.monotonic()))
            per_tick.append(produce(producer, topic, agents.tick(tick)))
            if tick % 5 == 4:
                committed, end = lag()
                lags.append(end - committed)
        producer.flush(30)
    finally:
        lag.close()
        stop(proc)
    behind = time.monotonic() - t0 - seconds
    messages_per_s = sum(per_tick) / len(per_tick)
    lag_s = [round(n / messages_per_s, 1) for n in lags]
    print(f"live: 10,000 GPUs at 1 Hz for {seconds:.0f} s (publisher {behind:+.1f} s off its schedule);"
          f" worker lag every 5 s, in seconds of samples: {lag_s}")
    half = len(lags) // 2
    # Flat: the second half's lag no higher than the first half's (plus a second of samples for
    # noise), or never more than 3 s of samples behind.
    flat = max(lag_s[half:]) <= max(max(lag_s[:half]) + 1.0, 3.0)
    print(f"  lag flat: {flat}")
    return lags


class Hook(BaseHTTPRequestHandler):
    arrivals: ClassVar[list] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Hook.arrivals.append((time.time(), body["gpufleet_alert"]))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def alert_latency(bootstrap, data_dir, window_s=10.0, min_s=20.0, send_every=1) -> float:
    prefix = "lat."
    ensure_topics(bootstrap, prefix=prefix)
    topic = prefix + GPU_SAMPLES.name
    fleet = build_fleet(seed=21, hosts=4, gpus_per_host=8, workflows=8)
    idle = next(w for w in fleet.workflows if w.profile.name == "idle")
    http = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    routing = data_dir / "routing.toml"
    routing.write_text(f'[default]\nwebhook = "http://127.0.0.1:{http.server_address[1]}/"\n')
    notifier = AlertNotifier(bootstrap, load_routing(routing), data_dir / "sent.log", group_id="lat-notifier",
                             topic_prefix=prefix)
    stop_notifier = threading.Event()
    threading.Thread(target=notifier.run, args=(stop_notifier,), daemon=True).start()
    proc = worker(
        bootstrap,
        prefix,
        data_dir,
        "lat-worker",
        "--window-s",
        str(window_s),
        "--lateness-s",
        str(send_every + 2),
        "--detector-min-s",
        str(min_s),
        "--idle-partition-s",
        "5",
    )
    time.sleep(8)  # the worker joins its group before the first sample
    producer = Producer(producer_config(bootstrap))
    start_ms = int(time.time() * 1000)
    agents = AgentSends(fleet, start_ms, send_every)
    t0 = time.monotonic()
    goal = min_s + window_s + 10
    try:
        for tick in range(int(goal * 3)):
            time.sleep(max(0.0, t0 + tick - time.monotonic()))
            produce(producer, topic, agents.tick(tick))
            if any(a["workflow_id"] == idle.workflow_id for _, a in Hook.arrivals):
                break
        producer.flush(10)
    finally:
        stop(proc)
        stop_notifier.set()
        http.shutdown()
    mine = [(t, a) for t, a in Hook.arrivals if a["workflow_id"] == idle.workflow_id]
    if not mine:
        print(f"alert latency: no alert for the idle workflow within {goal * 3:.0f} s")
        return float("inf")
    latency = mine[0][0] - start_ms / 1000
    print(f"alert latency: {mine[0][1]['detector']} for {idle.workflow_id} reached the webhook {latency:.1f} s after"
          f" its first idle sample; goal <= {min_s:.0f} s required + {window_s:.0f} s window + 10 s = {goal:.0f} s")
    return latency


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=120,
                        help="ticks of 10,000 GPUs for the throughput run (enough for 15+ s of the worker's commits)")
    parser.add_argument("--live-s", type=float, default=60.0)
    parser.add_argument("--skip", nargs="*", default=[], choices=["throughput", "live", "latency"])
    parser.add_argument("--format", choices=sorted(FORMATS), default="columns",
                        help="what the agents send: GpuSampleColumns (default), GpuSampleBatch, or GpuSample per GPU")
    parser.add_argument("--send-every", type=int, default=5,
                        help="seconds between an agent's sends, as gpufleet agent --send-every (default 5)")
    parser.add_argument("--against", default=None, help="a git revision whose worker to compare with, same run")
    parser.add_argument("--repeat", type=int, default=3, help="alternating runs of each worker with --against")
    parser.add_argument("--py-spy", type=Path, default=None,
                        help="record the worker's stacks during the throughput run into this file (py-spy raw)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-") as tmp:
        data_dir = Path(tmp)
        broker = local_kafka.start(data_dir / "kafka", partitions=8)
        try:
            if args.against:
                against(broker.bootstrap, data_dir, args.against, args.repeat, args.ticks, args.send_every)
            if "throughput" not in args.skip:
                throughput(broker.bootstrap, data_dir, args.ticks, args.send_every, args.format, args.py_spy)
            if "live" not in args.skip:
                live(broker.bootstrap, data_dir, args.live_s, args.send_every, args.format)
            if "latency" not in args.skip:
                alert_latency(broker.bootstrap, data_dir, send_every=args.send_every)
        finally:
            local_kafka.stop(data_dir / "kafka")


if __name__ == "__main__":
    main()
