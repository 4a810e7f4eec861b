"""Dense peak TFLOPS of GPU models per precision (``gpu_peaks.json``, with the datasheet of
each): what model FLOPs utilisation is measured against."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")


@cache
def _table() -> tuple[tuple[str, dict[str, float]], ...]:
    raw = json.loads((Path(__file__).with_name("gpu_peaks.json")).read_text())
    return tuple((g["match"], g["tflops"]) for g in raw["gpus"])


def peak_tflops(gpu_name: str | None, precision: str) -> float | None:
    """The dense peak of ``gpu_name`` (as NVML or the profiler names it) at ``precision``, or
    None where the model or the precision is not in the table."""
    if not gpu_name:
        return None
    for match, tflops in _table():
        if match in gpu_name:
            return tflops.get(precision)
    return None
