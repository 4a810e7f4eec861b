"""50 owners loading job pages while the sink ingests at its full rate, as deployed on one host: the
sink's process owns the embedded engine and serves its query server, ``gpufleet serve`` is a
process of its own reading through it, and the owners are 50 concurrent clients. Goal (issue 42):
the sink keeps >= 0.9 of the rate it has without them (same run, interleaved phases), and pages
answer within 2 s at the 95th percentile.

The sink's work is its writer's: decoded GpuSample records in batches of 20,000 through
``ClickHouseWriter.insert`` into ``gpu_samples`` (its materialised views, the per-minute rollup
the pages read among them). The pages are of 50 jobs of 8 GPUs over a day (from their rollups),
each owner asking for their own job's page and charts, again and again.

    python benchmarks/bench_owners_load.py [--owners 50] [--seconds 20] [--rounds 2]
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
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support.samples, benchmarks.bench_job_page

DAY_MIN = 1440


def sink_role(path: str, jobs: int, batch: int) -> None:
    """The sink's process: the jobs' history stored, the query server up, then ``ingest S`` runs."""
    from benchmarks.bench_job_page import store
    from gpufleet.asgi_server import AsgiServer
    from producers.simulate.fleet import build_fleet
    from sinks.clickhouse_client import connect
    from sinks.clickhouse_ddl import GPU_SAMPLES_TABLE
    from sinks.query_server import QueryServer
    from sinks.write_clickhouse import ClickHouseWriter, Row

    client = connect(f"chdb://{path}")
    start = (int(time.time() * 1000) - 2 * 86_400_000) // 60_000 * 60_000
    for n in range(jobs):
        store(client, "gpufleet", f"job-{n:02d}", 8, DAY_MIN, start, owner=f"owner{n:02d}", first_offset=n * DAY_MIN)
    writer = ClickHouseWriter(client, "gpufleet")
    fleet = build_fleet(seed=5, hosts=125, gpus_per_host=8, workflows=300)
    records, tick = [], 0
    while len(records) < batch:
        records += list(fleet.samples_at(tick, start, 1000))
        tick += 1
    queries = QueryServer(Path(path)).start(AsgiServer)
    print("ready", flush=True)
    offset = 0
    for line in sys.stdin:
        seconds = float(line.split()[1])
        rows, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            assert writer.insert(GPU_SAMPLES_TABLE, [Row(0, offset + i, r) for i, r in enumerate(records)]) == []
            offset += len(records)
            rows += len(records)
        print(json.dumps({"rows_per_s": rows / (time.perf_counter() - t0)}), flush=True)
    queries.stop()


def load(url: str, n: int) -> float:
    """Seconds owner ``n``'s page took: the job and its charts, as the browser asks for them."""
    t0 = time.perf_counter()
    for path in (f"/api/jobs/job-{n:02d}", f"/api/figures/job-{n:02d}"):
        request = urllib.request.Request(url + path, headers={"X-Forwarded-User": f"owner{n:02d}"})
        with urllib.request.urlopen(request, timeout=120) as answer:
            answer.read()
    return time.perf_counter() - t0


def owner(url: str, n: int, stop: threading.Event, took: list[float], think_s: float) -> None:
    """Owner ``n`` with their page open: loads it again every ``think_s`` (staggered: 0.2 to 1.8 x)."""
    pause = think_s * (0.2 + 1.6 * (n % 9) / 8)
    while not stop.is_set():
        took.append(load(url, n))
        if stop.wait(pause):
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owners", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=20_000)
    parser.add_argument("--nice", type=int, default=10,
                        help="the service's CPU priority below the sink's (docs/owners.md: deploy it so)")
    parser.add_argument("--think-s", type=float, default=5.0,
                        help="each owner's pause between two loads of their page, on average (0: none)")
    parser.add_argument("--fresh-s", type=float, default=30.0, help="the service's --fresh-s")
    parser.add_argument("--role", default="main")
    parser.add_argument("--path")
    args = parser.parse_args()
    if args.role == "sink":
        sink_role(args.path, args.owners, args.batch)
        return

    path = tempfile.mkdtemp(prefix="gpufleet-bench-owners-")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sink = subprocess.Popen([sys.executable, __file__, "--role", "sink", "--path", path, "--owners",
                             str(args.owners), "--batch", str(args.batch)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert sink.stdout.readline().strip() == "ready"
    serve = subprocess.Popen(["nice", "-n", str(args.nice), sys.executable, "-m", "gpufleet", "serve",
                              "--trusted-proxy", "127.0.0.1", "--no-actions", "--no-munge", "--port", "0",
                              "--clickhouse-dsn", f"chdb://{path}", "--database", "gpufleet", "--fresh-s",
                              str(args.fresh_s)], stdout=subprocess.PIPE, text=True, env=env)
    url = serve.stdout.readline().split(" at ")[1].split()[0]

    def ingest() -> float:
        sink.stdin.write(f"ingest {args.seconds}\n")
        sink.stdin.flush()
        return json.loads(sink.stdout.readline())["rows_per_s"]

    os.nice(args.nice)  # the owners' browsers are not on the sink's host: their load is not its CPU's
    first = []
    for n in range(args.owners):  # each owner opens their page once: read cold, one after the other
        first.append(load(url, n))
    alone, loaded, took = [], [], []
    try:
        for _ in range(args.rounds):  # interleaved: alone, then with the owners
            alone.append(ingest())
            stop = threading.Event()
            threads = [threading.Thread(target=owner, args=(url, n, stop, took, args.think_s), daemon=True)
                       for n in range(args.owners)]
            for t in threads:
                t.start()
            loaded.append(ingest())
            stop.set()
            for t in threads:
                t.join(120)
    finally:
        serve.terminate()
        sink.stdin.close()
        sink.wait(60)
    a, b = statistics.median(alone), statistics.median(loaded)
    p95 = statistics.quantiles(took, n=20)[18]
    print(f"first load of each owner's page (cold, the sink idle): median "
          f"{statistics.median(first) * 1000:.0f} ms, max {max(first) * 1000:.0f} ms")
    print(f"sink alone: {a:,.0f} rows/s; with {args.owners} owners loading pages (every {args.think_s:g} s on "
          f"average): {b:,.0f} rows/s")
    print(f"ratio (with owners / alone): {b / a:.2f} (goal >= 0.90)")
    print(f"pages while the sink ingests: {len(took)} loaded, median {statistics.median(took) * 1000:.0f} ms, "
          f"p95 {p95 * 1000:.0f} ms (goal < 2000 ms)")


if __name__ == "__main__":
    main()
