"""The worker's hot path per sample (decode + validate + window) against Avro decoding alone.

The samples are encoded as the agents send them (``--format``): by default each host's
samples of a workflow over 5 s in one GpuSampleColumns message; ``batch`` for the older
GpuSampleBatch (row by row), ``gpu`` for one GpuSample per message. Prints microseconds per
sample and the ratio to the baseline measured in the same run, so the number means something
on a noisy machine. The windowing should cost a fraction of decoding, not a multiple.

Also the cost of the goodput waterfall (``streams.windows.goodput``): the same hot path with its two
functions replaced by no-ops, alternating, median of ``--repeat``. Goal (issue 18): the
waterfall costs the worker at most 10 % of its throughput. ``--planted`` runs on a fleet
with start-up phases, starved and throttled jobs (more samples take the per-sample path).

    python benchmarks/bench_window_utilization.py [--format columns|batch|gpu] [--planted]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support.samples

from producers.simulate.fleet import build_fleet
from schemas.codec import Codec
from schemas.sample_columns import blocks_of, columns_of
from streams.windows import record as window_record
from streams.windows.batches import Incoming, WindowConfig
from streams.windows.utilization import WindowAggregator
from tests.support.samples import batch_samples  # the older GpuSampleBatch format, for comparison

START = 1_767_225_600_000
BATCH = 2000  # messages per batch, as the worker takes them
SEND_EVERY = 5


def best_of(fn, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def messages(codec: Codec, fmt: str, ticks: int, planted: bool = False) -> list[bytes]:
    fleet = build_fleet(seed=1, hosts=32, gpus_per_host=8, workflows=64, planted=planted)
    out = []
    for first in range(0, ticks, SEND_EVERY):
        samples = [s for t in range(first, first + SEND_EVERY) for s in fleet.samples_at(t, START, 1000)]
        if fmt == "gpu":
            out += [codec.encode("GpuSample", s) for s in samples]
        elif fmt == "batch":
            out += [codec.encode("GpuSampleBatch", b) for b in batch_samples(samples, per_tick=False)]
        else:
            out += [codec.encode("GpuSampleColumns", b) for b in columns_of(samples, per_tick=False)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=["columns", "batch", "gpu"], default="columns")
    parser.add_argument("--ticks", type=int, default=600)
    parser.add_argument("--planted", action="store_true")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    codec = Codec()
    values = messages(codec, args.format, args.ticks, args.planted)
    n = 256 * args.ticks

    def decode_only() -> None:
        for i in range(0, len(values), BATCH):
            codec.decode_many(values[i:i + BATCH])

    def hot_path() -> None:
        agg = WindowAggregator(WindowConfig(), {})
        for i in range(0, len(values), BATCH):
            ok, _ = codec.decode_many(values[i:i + BATCH])
            batch = []
            for j, name, record in ok:
                blocks, _ = blocks_of(name, record)
                batch += [Incoming(i + j, block, k) for k, block in enumerate(blocks)]
            agg.process(0, batch, closed_at=0)

    base = best_of(decode_only)
    full = best_of(hot_path)
    print(f"samples: {n} in {len(values)} {args.format} messages")
    print(f"decode only:                 {base / n * 1e6:6.2f} us/sample")
    print(f"decode + validate + window:  {full / n * 1e6:6.2f} us/sample")
    print(f"ratio to decode alone:       {full / base:6.2f}x")

    def without_goodput() -> float:
        # (the window's accumulator, streams.windows.record, calls them by these names)
        saved = window_record.add_goodput, window_record.goodput_fields
        window_record.add_goodput = lambda *args: None
        window_record.goodput_fields = lambda *args: {}
        try:
            return best_of(hot_path, 1)
        finally:
            window_record.add_goodput, window_record.goodput_fields = saved

    ratios = []
    for _ in range(args.repeat):
        off = without_goodput()
        on = best_of(hot_path, 1)
        ratios.append(off / on)
    print(f"goodput waterfall:           throughput with it {median(ratios):.3f} of without "
          f"(median of {args.repeat}: {', '.join(f'{r:.3f}' for r in sorted(ratios))}; goal >= 0.90)")


if __name__ == "__main__":
    main()
