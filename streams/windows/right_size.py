"""Right-sizing: what a workflow should ask for next time, from its whole run so far.

From the job's totals (``streams.windows.summary``: GPU-seconds, GPU-seconds at 0 %, peak memory,
SM and tensor activity, CPU) and the table of GPU models and MIG profiles
(``schemas/gpu_peaks.json``, with its sources), at most one recommendation of each kind:

- **fewer GPUs**: GPUs that sat at 0 % for most of the job (its GPU-seconds at 0 %, as whole
  GPUs over the job's length, counted where at least ``IDLE_SHARE`` of a GPU's time);
- **a MIG slice**: the smallest profile of the same model whose memory holds the job's peak
  with ``HEADROOM`` and whose share of the SMs covers its SM activity with headroom;
- **a smaller GPU model**: otherwise, the model of least memory that holds the peak and whose
  bf16 peak covers the job's tensor work (SM activity times the current model's peak);
- **CPU cores and host memory per GPU**: what the job's processes used, for the scheduler request.

Each says which measurement it used: memory is the framework allocator's own peak where the
job reports it (``producers.profiling.hook.report_memory``: PyTorch's ``max_memory_allocated``), else
NVML's used memory (a framework that reserves memory up front, as PyTorch's caching allocator
does, looks bigger there than it is: the recommendation is then on the safe side); compute is
GPM's SM activity where the GPUs report it (Hopper and later), else NVML's utilisation, an upper
bound (a kernel on one SM counts as busy). ``gpu_hours_freed`` is what following it would have given back over the run.

Plain logic: the totals in, records out.
"""

from __future__ import annotations

import math

from schemas.gpu_peaks import catalogue, gpu_spec
from streams.windows.job_activity import activity_mean

HEADROOM = 1.2  # memory and compute the recommendation must hold beyond the job's peak and mean
IDLE_SHARE = 0.75  # a GPU at 0 % for this share of the job counts as one the job did not need
NVML_MEMORY = "NVML used memory (a framework that reserves memory up front looks bigger there)"
ALLOCATOR_MEMORY = "the framework allocator's peak (PyTorch max_memory_allocated, reported by the job)"


def recommend(job: dict) -> list[dict]:
    """The ``RightSize`` records of a job's totals (possibly none: it fits what it has), judged on
    the GPU-seconds its samples stand for (the unobserved ones say nothing of its use)."""
    seconds = job.get("gpu_seconds", 0.0) - job.get("unobserved_gpu_seconds", 0.0)
    gpus = job.get("max_gpus", 0)
    if seconds <= 0 or gpus <= 0:
        return []
    out = []
    hours = seconds / 3600
    span_s = seconds / gpus  # the job's length, as if every GPU ran all of it
    zero = job.get("zero_util_gpu_seconds", 0.0)
    idle = min(gpus - 1, math.floor(zero / span_s / IDLE_SHARE)) if gpus > 1 else 0
    if idle >= 1:
        out.append(_record("gpu_count", f"{gpus} GPUs", f"{gpus - idle} GPUs",
                           f"{zero / 3600:.2f} of its {hours:.2f} GPU-hours were at 0 % utilisation: as many as "
                           f"{idle} GPU(s) idle for {IDLE_SHARE:.0%} of the run or more", "NVML utilisation",
                           idle * span_s / 3600))
    model = job.get("model")
    spec = gpu_spec(model)
    peak, memory_source = ((job["alloc_peak"], ALLOCATOR_MEMORY) if job.get("alloc_peak") is not None
                           else (job.get("mem_peak"), NVML_MEMORY))
    if spec is not None and peak is not None:
        used_gb = peak * spec.memory_gb
        need_gb = used_gb * HEADROOM
        sm = activity_mean(job, "sm")
        busy, compute_source = ((sm, "GPM SM activity") if sm is not None
                                else (job["util_weighted"] / seconds, "NVML utilisation (an upper bound)"))
        need_share = min(1.0, busy / 100 * HEADROOM)
        busy_hours = hours - idle * span_s / 3600
        slice_ = next((p for p in spec.mig if p.memory_gb >= need_gb and p.sevenths / 7 >= need_share), None)
        sources = f"memory: {memory_source}; compute: {compute_source}"
        if slice_ is not None:
            out.append(_record("mig", model, f"MIG {slice_.name} of {spec.match}",
                               f"peak memory {used_gb:.1f} GB of {spec.memory_gb:g} and {busy:.0f} % busy fit "
                               f"{slice_.sevenths}/7 of the GPU with {HEADROOM - 1:.0%} headroom", sources,
                               (1 - slice_.sevenths / 7) * busy_hours))
        elif spec.bf16_tflops:
            work = busy / 100 * spec.bf16_tflops * HEADROOM
            smaller = sorted((g for g in catalogue() if g.memory_gb < spec.memory_gb and g.memory_gb >= need_gb
                              and (g.bf16_tflops or 0) >= work), key=lambda g: (g.memory_gb, g.bf16_tflops))
            if smaller:
                g = smaller[0]
                out.append(_record("gpu_model", model, g.match,
                                   f"peak memory {used_gb:.1f} GB of {spec.memory_gb:g} and {busy:.0f} % busy "
                                   f"fit a {g.match} ({g.memory_gb:g} GB, {g.bf16_tflops:g} bf16 TFLOPS) with "
                                   f"{HEADROOM - 1:.0%} headroom", sources, busy_hours))
    host_memory = job.get("host_mem_per_gpu")
    if host_memory:
        gib = max(1, math.ceil(host_memory * HEADROOM / 2**30))
        out.append(_record("host_memory_per_gpu", None, f"{gib} GiB of host memory per GPU",
                           f"its processes peaked at {host_memory / 2**30:.1f} GiB per GPU on a host",
                           "the agent's per-workflow resident memory", 0.0))
    cpu = activity_mean(job, "cpu")
    if cpu is not None:
        cores = max(1, math.ceil(cpu / 100 * HEADROOM / gpus))
        out.append(_record("cpu_per_gpu", None, f"{cores} CPU core(s) per GPU",
                           f"its processes kept {cpu / 100:.1f} cores busy on average over {gpus} GPU(s)",
                           "the agent's per-workflow CPU time", 0.0))
    return out


def _record(kind: str, current: str | None, recommended: str, reason: str, source: str, freed_h: float) -> dict:
    return {"kind": kind, "current": current, "recommended": recommended, "reason": reason, "source": source,
            "gpu_hours_freed": round(freed_h, 6)}
