"""The worker's hot path per sample (decode + validate + window) against Avro decoding alone.

Prints microseconds per sample and the ratio to the baseline measured in the same run, so
the number means something on a noisy machine. The windowing should cost about as much
again as decoding (ratio near 2), not an order of magnitude more.
"""

from __future__ import annotations

import time

from producers.simulate_fleet import build_fleet
from schemas.codec import Codec
from schemas.validate_sample import validate_sample
from streams.window_utilization import Incoming, WindowAggregator, WindowConfig

START = 1_767_225_600_000
BATCH = 5000


def best_of(fn, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    codec = Codec()
    fleet = build_fleet(seed=1, hosts=32, gpus_per_host=8, workflows=64)
    ticks = 600
    values = [codec.encode("GpuSample", s) for t in range(ticks) for s in fleet.samples_at(t, START, 1000)]
    n = len(values)

    def decode_only() -> None:
        for i in range(0, n, BATCH):
            codec.decode_many(values[i:i + BATCH])

    def hot_path() -> None:
        agg = WindowAggregator(WindowConfig(), {})
        for i in range(0, n, BATCH):
            ok, _ = codec.decode_many(values[i:i + BATCH])
            batch = [Incoming(i + j, r) for j, _, r in ok if validate_sample(r) is None]
            agg.process(0, batch, closed_at=0)

    base = best_of(decode_only)
    full = best_of(hot_path)
    print(f"samples: {n}")
    print(f"decode only:                 {base / n * 1e6:6.2f} us/sample")
    print(f"decode + validate + window:  {full / n * 1e6:6.2f} us/sample")
    print(f"ratio to decode alone:       {full / base:6.2f}x")


if __name__ == "__main__":
    main()
