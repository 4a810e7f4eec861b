"""The window stage's throughput with serving replicas' traffic beside their GPU samples, against
the same GPU samples alone, in the same run: each batch's messages decoded as the stage decodes
them (``Codec.decode_many``) and given to its step (``streams.stages.window_step``), in process.
What Kafka and Faust add per message is not in it: a ServingSample is one more message for them
too, so the ratio is an upper bound of what the worker keeps.

64 replicas of 8 GPUs each for 10 simulated minutes, each workflow's tick one ``GpuSampleColumns``
block (as the agents send them), and beside it a ``ServingSample`` every tick (an agent reading
its endpoint each second) or every 10 ticks (the agent's default, ``--serving-interval-s 10``).
Alternating rounds, medians. Goal: at least 0.9 of the GPU samples a second.

    python benchmarks/bench_serving_stage.py
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from schemas.codec import Codec
from schemas.sample_columns import columns_of
from streams.settings import StreamSettings
from streams.stages.window_step import Decoded, WindowStep
from tests.support.samples import BASE_MS, sample

REPLICAS, GPUS, TICKS = 64, 8, 600
CODEC = Codec()


def batches(serving_every: int | None) -> list[list[tuple[str, dict]]]:
    out = []
    for t in range(TICKS):
        batch = []
        for r in range(REPLICAS):
            wf = f"svc-{r}"
            if serving_every and t % serving_every == 0:
                batch.append(("ServingSample", {
                    "workflow_id": wf, "host": f"h{r}", "owner": "ana", "team": "ml",
                    "gpu_uuids": [f"GPU-{r}-{g}" for g in range(GPUS)], "service": "llama", "engine": "vllm",
                    "event_time": BASE_MS + t * 1000, "interval_ms": 1000 * serving_every, "requests": 3.0 * (r % 4),
                    "tokens": 900.0, "running": 4.0, "waiting": 0.0, "queue_time_ms": 20.0, "ttft_ms": 80.0,
                    "kv_cache_usage": 0.4, "batch_size": None}))
            samples = [sample(workflow_id=wf, host=f"h{r}", gpu_index=g, gpu_uuid=f"GPU-{r}-{g}",
                              event_time=BASE_MS + t * 1000, utilization_pct=30.0 + g) for g in range(GPUS)]
            batch += [("GpuSampleColumns", b) for b in columns_of(samples)]
        out.append(batch)
    return out


def encoded(batches: list[list[tuple[str, dict]]]) -> list[list[bytes]]:
    return [[CODEC.encode(name, record) for name, record in batch] for batch in batches]


def run(prepared: list[list[bytes]]) -> float:
    """GPU samples a second through a fresh step, each batch decoded first."""
    step = WindowStep(StreamSettings(bootstrap="-"), {}, {}, clock=lambda: BASE_MS + 10**9)
    offset, began = 0, time.perf_counter()
    for t, batch in enumerate(prepared):
        ok, errors = CODEC.decode_many(batch)
        decoded = [Decoded(i, name, record, offset + i) for i, name, record in ok]
        offset += len(decoded)
        out = step.samples(0, decoded, BASE_MS + t * 1000)
        assert not out.dead and not errors, (out.dead[:1], errors[:1])
    return REPLICAS * GPUS * TICKS / (time.perf_counter() - began)


def main() -> None:
    kinds = {"GPU samples alone": encoded(batches(None)), "with a ServingSample every tick": encoded(batches(1)),
             "with a ServingSample every 10 ticks": encoded(batches(10))}
    gc.collect()
    gc.freeze()  # the prepared batches are not the stage's garbage: no collection walks them
    base_name = "GPU samples alone"
    for name in [k for k in kinds if k != base_name]:
        ratios, base, with_serving = [], [], []
        for r in range(9):  # the two alternating, each ratio of neighbours: what drifts cancels
            if r % 2:
                pair = [run(kinds[base_name]), run(kinds[name])]
            else:
                pair = [run(kinds[name]), run(kinds[base_name])][::-1]
            base.append(pair[0])
            with_serving.append(pair[1])
            ratios.append(pair[1] / pair[0])
        print(f"{name:<38} {statistics.median(with_serving):>10,.0f} GPU samples/s against "
              f"{statistics.median(base):,.0f} alone: median ratio {statistics.median(ratios):.3f}x (goal >= 0.9x)")


if __name__ == "__main__":
    main()
