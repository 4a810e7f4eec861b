"""The serving services' load as the reports and the owners' pages compute it (``gpufleet serving``,
``/jobs``'s services, ``/services/NAME``): ClickHouse sums a week of a fleet's serving windows
into spans and replicas (``gpufleet.reports.serving.service_loads``), against the windows read
into Python and summed there by the same rule (``streams.serving.service.load``, which the
reports did before), in the same run on the same embedded engine. A week of 100 replicas of 10
services at one window a minute is 1,008,000 windows; the pages ask for it at every view whose
kept copy is older than 30 s.

    python benchmarks/bench_services.py [--replicas 100] [--days 7] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpufleet.reports.serving import service_loads
from gpufleet.web import services
from gpufleet.web.access import Viewer
from sinks.clickhouse_client import connect
from sinks.write_clickhouse import ClickHouseWriter
from streams.serving.service import load

START_S = 1_764_000_000


def store(client, database: str, replicas: int, minutes: int) -> None:
    """A window a minute per replica; every third replica serves no request, the others 60-66 a
    minute with a capacity of 2 requests a second."""
    ClickHouseWriter(client, database).ensure_tables()
    client.command(f"""
        INSERT INTO {database}.serving_windows (workflow_id, owner, team, service, engine, window_start, window_end,
            gpu_count, gpu_seconds, utilization_mean_pct, requests, requests_per_s, capacity_per_s, capacity_windows,
            state, closed_at)
        SELECT concat('replica-', toString(number % {replicas})), 'ana', 'llm',
               concat('service-', toString(number % {replicas} % 10)), 'vllm',
               toDateTime64({START_S} + intDiv(number, {replicas}) * 60, 3),
               toDateTime64({START_S} + 60 + intDiv(number, {replicas}) * 60, 3), 1, 60.0, 30.0,
               if(number % {replicas} % 3 = 0, 0, 60 + number % 7), 1.0, 2.0, 1,
               if(number % {replicas} % 3 = 0, 'IDLE', 'BUSY'),
               toDateTime64({START_S} + 61 + intDiv(number, {replicas}) * 60, 3)
        FROM numbers({replicas * minutes})""")


def in_python(client, database: str) -> list:
    """The windows read whole, then summed by the rule in Python (the reports' way before)."""
    rows = client.query(f"""
        SELECT workflow_id, service, toUnixTimestamp64Milli(window_start), toUnixTimestamp64Milli(window_end),
               requests, gpu_seconds, state, capacity_per_s
        FROM {database}.serving_windows FINAL ORDER BY service, workflow_id, window_start""").result_rows
    by_service: dict[str, list[dict]] = {}
    for wf, service, start, end, requests, gpu_s, state, capacity in rows:
        by_service.setdefault(service, []).append({"workflow_id": wf, "window_start": start, "window_end": end,
                                                   "requests": requests, "gpu_seconds": gpu_s, "state": state,
                                                   "capacity_per_s": capacity})
    return [load(name, windows, 600_000, 0.2) for name, windows in by_service.items()]


def timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--replicas", type=int, default=100)
    p.add_argument("--days", type=int, default=7)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    client = connect(f"chdb://{tempfile.mkdtemp(prefix='gpufleet-bench-services-')}")
    database = "bench_services"
    store(client, database, args.replicas, args.days * 1440)
    operator = Viewer("", operator=True, via="benchmark")
    summed = service_loads(client, database)[""]
    read = in_python(client, database)
    same = {(s.service, s.replicas, s.replicas_needed, round(s.freed_gpu_hours, 6)) for s in summed} == \
        {(s.service, s.replicas, s.replicas_needed, round(s.freed_gpu_hours, 6)) for s in read}
    times: dict[str, list[float]] = {"sql": [], "python": [], "list": [], "page": []}
    for _ in range(args.rounds):  # (in turn, so that both see the same machine)
        times["sql"].append(timed(lambda: service_loads(client, database)))
        times["python"].append(timed(lambda: in_python(client, database)))
        times["list"].append(timed(lambda: services.services(client, database, operator, 7 * 86400)))
        times["page"].append(timed(lambda: services.service(client, database, operator, "service-1", 7 * 86400)))
    med = {k: statistics.median(v) for k, v in times.items()}
    windows = args.replicas * args.days * 1440
    print(f"{len(summed)} services, {args.replicas} replicas, {args.days} days: {windows:,} windows "
          f"(medians of {args.rounds} rounds, in turn)")
    print(f"  every service's load, summed by ClickHouse: {med['sql'] * 1000:,.0f} ms; the windows read and summed "
          f"in Python: {med['python'] * 1000:,.0f} ms; {med['python'] / med['sql']:.1f}x faster; the same loads: "
          f"{'yes' if same else 'NO'}")
    print(f"  an operator's services on /jobs: {med['list'] * 1000:,.0f} ms; a service's page (its load, "
          f"{args.replicas // 10} replicas, its chart): {med['page'] * 1000:,.0f} ms")


if __name__ == "__main__":
    main()
