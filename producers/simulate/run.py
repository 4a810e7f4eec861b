"""Drives a simulated fleet in (scaled) real time and publishes its samples to Kafka."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from producers.publish_kafka import Publisher
from producers.simulate.fleet import Fleet
from schemas.sample_columns import columns_of
from schemas.topics import GPU_SAMPLES


@dataclass(frozen=True)
class SimulationPlan:
    start_ms: int
    ticks: int
    interval_ms: int = 1000
    speed: float = 60.0  # simulated seconds per wall second; 0 = as fast as possible


@dataclass
class SimulationProgress:
    ticks_done: int = 0
    samples: int = 0


def run_simulation(
    fleet: Fleet,
    plan: SimulationPlan,
    publisher: Publisher,
    topic: str = GPU_SAMPLES.name,
    stop: threading.Event | None = None,
    progress: SimulationProgress | None = None,
    on_tick: Callable[[SimulationProgress], None] | None = None,
    batched: bool = True,
    serving: Callable[[int], list[dict]] | None = None,
) -> SimulationProgress:
    """Publish ``plan.ticks`` ticks of samples, paced at ``plan.speed``, then flush.

    ``batched``: each workflow's samples of a host tick in one ``GpuSampleColumns`` message, as
    the host agent sends them; else one ``GpuSample`` message per GPU. ``serving``: the tick's
    ``ServingSample``s (``producers.simulate.serving``), sent beside the GPU samples."""
    progress = progress or SimulationProgress()
    wall_start = time.monotonic()
    for tick in range(plan.ticks):
        if stop is not None and stop.is_set():
            break
        samples = list(fleet.samples_at(tick, plan.start_ms, plan.interval_ms))
        if batched:
            publisher.publish(GPU_SAMPLES, columns_of(samples), topic=topic, schema="GpuSampleColumns")
        else:
            publisher.publish(GPU_SAMPLES, samples, topic=topic)
        if serving is not None:
            publisher.publish(GPU_SAMPLES, serving(tick), topic=topic, schema="ServingSample")
        progress.samples += len(samples)
        progress.ticks_done = tick + 1
        if on_tick is not None:
            on_tick(progress)
        if plan.speed > 0:
            due = wall_start + (tick + 1) * plan.interval_ms / 1000.0 / plan.speed
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    remaining = publisher.flush()
    if remaining:
        raise RuntimeError(f"{remaining} samples were still undelivered after the final flush")
    return progress
