"""A second analyst's ``SELECT 1`` through the query server while a first runs the slowest query
the read path allows (one that only its time limit stops), against the same ``SELECT 1`` on
an idle server, in the same run. Goal (issue 31): < 1 s while the slow query runs.

The server is the one ``gpufleet sink`` and ``gpufleet demo`` start on the embedded engine;
both analysts are separate processes' clients (``sinks.query_server.find_server``), as
``gpufleet sql`` in two terminals would be.

    python benchmarks/bench_query_server.py [--limit-s 60] [--probes 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time

SLOW = "SELECT sum(sipHash64(number)) FROM system.numbers"  # runs until its time limit stops it


def probe(remote, n: int, spacing_s: float, keep_going=lambda: True) -> list[float]:
    """Seconds each of ``n`` ``SELECT 1`` took to answer, ``spacing_s`` apart."""
    took = []
    for _ in range(n):
        if not keep_going():
            break
        t0 = time.perf_counter()
        assert remote.query("SELECT 1").result_rows == [(1,)]
        took.append(time.perf_counter() - t0)
        time.sleep(spacing_s)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit-s", type=float, default=60.0, help="the read path's time limit (its default: 60)")
    parser.add_argument("--probes", type=int, default=20)
    args = parser.parse_args()
    os.environ["GPUFLEET_QUERY_MAX_SECONDS"] = f"{args.limit_s:g}"

    from clickhouse_connect.driver.exceptions import DatabaseError

    from gpufleet.asgi_server import AsgiServer
    from sinks.clickhouse_client import connect
    from sinks.query_server import QueryServer, find_server

    path = tempfile.mkdtemp(prefix="gpufleet-bench-query-")
    connect(f"chdb://{path}").command("SELECT 1")  # the engine's directory made
    server = QueryServer(path).start(AsgiServer)
    remote = find_server(path)
    try:
        idle = probe(remote, args.probes, 0.05)
        outcome: dict[str, object] = {}

        def slow() -> None:
            t0 = time.perf_counter()
            try:
                find_server(path).query(SLOW)
                outcome["slow"] = "finished"
            except DatabaseError as exc:
                outcome["slow"] = str(exc).splitlines()[0][:120]
            outcome["slow_s"] = time.perf_counter() - t0

        first = threading.Thread(target=slow)
        first.start()
        time.sleep(1.0)  # the slow query under way
        spacing = max(0.05, (args.limit_s - 2) / args.probes)
        busy = probe(remote, args.probes, spacing, first.is_alive)
        first.join()
    finally:
        server.stop()
    print(f"slow query: ran {outcome['slow_s']:.1f} s under a {args.limit_s:g} s limit: {outcome['slow']}")
    print(f"SELECT 1, idle server: median {statistics.median(idle) * 1000:.1f} ms, max {max(idle) * 1000:.1f} ms "
          f"({len(idle)} probes)")
    print(f"SELECT 1, while it ran: median {statistics.median(busy) * 1000:.1f} ms, max {max(busy) * 1000:.1f} ms "
          f"({len(busy)} probes)")
    print(f"ratio (busy median / idle median): {statistics.median(busy) / statistics.median(idle):.2f}; "
          f"goal: max < 1000 ms: {'met' if max(busy) < 1.0 else 'NOT met'}")


if __name__ == "__main__":
    main()
