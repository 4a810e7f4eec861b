"""What ``gpufleet replay`` holds in memory to send a recording, against the recording itself, in
the same run: a generic CSV of 200 containers over one day (a GPU utilisation, a request rate and
a queue time each minute: 864,000 readings) read as the command reads it
(``recorded.read_generic``), then every tick's records made and turned into the messages sent
(``recorded.records``, ``recorded.messages``), one tick after the other, as the command sends them.
Python's own allocations are traced (``tracemalloc``): the series read, and the most held beyond
it while the records are made. Goal: at most 0.25 of the series beyond it (the records of one
tick at a time, not of the whole recording: an operator's month of a large fleet must fit where
its readings do).

    python benchmarks/bench_replay.py
"""

from __future__ import annotations

import gc
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from producers.serving.recorded import messages, read_generic, records

CONTAINERS, MINUTES = 200, 1440
START_S = 1_795_996_800  # 2026-11-30T00:00:00Z


def recording(path: Path) -> int:
    """Writes the CSV; returns how many readings it holds."""
    with path.open("w") as f:
        f.write("timestamp,container,metric,value\n")
        for c in range(CONTAINERS):
            name = f"sd-xl-serving-6d8f9c7b5d-{c:05d}"
            for m in range(MINUTES):
                t = START_S + m * 60 + c % 60
                f.write(f"{t},{name},gpu_util_pct,{(c * 7 + m) % 100}\n{t},{name},requests_per_s,{(m % 50) / 10}\n"
                        f"{t},{name},queue_time_ms,{m % 300}\n")
    return CONTAINERS * MINUTES * 3


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-replay-") as d:
        path = Path(d) / "fleet.csv"
        readings = recording(path)
        gc.collect()
        tracemalloc.start()
        t0 = time.perf_counter()
        series = read_generic(path)
        read_s = time.perf_counter() - t0
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        t0 = time.perf_counter()
        ticks = sent = 0
        for _, batch in records(series, 86_400.0, "sd-xl"):
            ticks += 1
            sent += len(messages(batch))
        make_s = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    beyond = max(0, peak - held)
    print(f"replay of {CONTAINERS} containers over {MINUTES // 60} h ({readings:,} readings; traced, so slower than "
          f"the command): the series read in {read_s:.1f} s holds {held / 2**20:.1f} MB ({held / readings:.0f} B a "
          f"reading); {ticks:,} ticks, {sent:,} messages made in {make_s:.1f} s, holding at most "
          f"{beyond / 2**20:.1f} MB more: {beyond / held:.3f}x the series (goal <= 0.25x)")


if __name__ == "__main__":
    main()
