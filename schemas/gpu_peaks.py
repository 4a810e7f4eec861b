"""Dense peak TFLOPS of GPU models per precision, their peak memory bandwidth, memory and MIG
profiles (``gpu_peaks.json``, with the datasheet of each): what model FLOPs utilisation and the
operators' rooflines are measured against, and what right-sizing recommends from."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import NamedTuple

PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")


@cache
def _table() -> tuple[tuple[str, dict[str, float], float | None], ...]:
    raw = json.loads((Path(__file__).with_name("gpu_peaks.json")).read_text())
    return tuple((g["match"], g["tflops"], g.get("memory_gbps")) for g in raw["gpus"])


def _entry(gpu_name: str | None) -> tuple[str, dict[str, float], float | None] | None:
    if not gpu_name:
        return None
    return next((e for e in _table() if e[0] in gpu_name), None)


def peak_tflops(gpu_name: str | None, precision: str) -> float | None:
    """The dense peak of ``gpu_name`` (as NVML or the profiler names it) at ``precision``, or
    None where the model or the precision is not in the table."""
    entry = _entry(gpu_name)
    return None if entry is None else entry[1].get(precision)


def peak_memory_gbps(gpu_name: str | None) -> float | None:
    """The peak memory bandwidth of ``gpu_name`` in GB/s, or None where it is not in the table."""
    entry = _entry(gpu_name)
    return None if entry is None else entry[2]


class MigProfile(NamedTuple):
    name: str  # as nvidia-smi names it: "1g.10gb"
    sevenths: int  # compute slices of the seven
    memory_gb: float


class GpuSpec(NamedTuple):
    match: str  # the model, as a substring of the name NVML reports
    memory_gb: float
    bf16_tflops: float | None
    mig: tuple[MigProfile, ...]  # the profiles smaller than the whole GPU, smallest first


@cache
def catalogue() -> tuple[GpuSpec, ...]:
    """Every model of the table, in its order (more specific names first)."""
    raw = json.loads((Path(__file__).with_name("gpu_peaks.json")).read_text())
    return tuple(GpuSpec(g["match"], float(g["memory_gb"]), g["tflops"].get("bf16"),
                         tuple(MigProfile(n, s, float(m)) for n, s, m in g.get("mig", ())))
                 for g in raw["gpus"])


def gpu_spec(gpu_name: str | None) -> GpuSpec | None:
    """The table's entry of ``gpu_name``, or None where the model is not in it."""
    if not gpu_name:
        return None
    return next((g for g in catalogue() if g.match in gpu_name), None)
