"""Antipatterns in one rank's trace -> findings with evidence, GPU time at stake and the fix:
one function per rule over what ``streams.traces.antipatterns.AntipatternCollector`` collected
and the analysis of the same trace, all listed in ``RULES``. Rules:

* the Nsight Systems CUDA rules: GPU gaps >= 500 ms; GPU utilisation in 30 time chunks,
  chunks under 50 % flagged; time in cudaDeviceSynchronize/cudaStreamSynchronize;
  synchronous cudaMemcpy (except device-to-device and host-to-device <= 64,000 bytes);
  asynchronous copies from pageable memory; synchronous cudaMemset;
* launch-bound trains of short kernels (>= 10 in a row on a stream, each shorter than its
  launch call): try CUDA graphs or torch.compile;
* high launch delay; low communication/computation overlap; input-pipeline stalls (GPU
  idle while DataLoader work runs); GEMM/convolution time without tensor-core kernels
  (try AMP/bf16); peak memory over 90 % of the device's; operators that count their FLOPs
  running under 70 % of their roofline (``streams.traces.operators``);
* from what the host agent saw during a requested profile (``ProfileSystemContext``): a
  starved GPU while the host's or the job's CPUs are saturated (CPU-bound input), or while
  the host waits on I/O (storage-bound input), on the live input-bound detector's thresholds
  (the worker's ``Thresholds``: a trace knows no team, so the site's default);
* where the critical path was found (``gpufleet analyze --critical-path``): steps whose critical
  path is mostly CPU time, exposed communication, or launch delays and gaps between kernels,
  with the operators that take most of it.

Findings worth under 1 ms of GPU time are left out. The GPU time at stake of different
findings can overlap (a gap is also a low-utilisation chunk): do not add them up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from streams.alerts.detectors import DEFAULTS, DetectorConfig
from streams.traces.antipatterns import CHUNKS, TRAIN_LENGTH

MIN_CHUNKED_SPAN_US = 100_000  # below this a trace is too short for 30 chunks to say anything
MIN_AT_STAKE_US = 1_000  # findings worth less GPU time than this are noise
HOST_CPU_SATURATED_PCT = 90.0


def _finding(rule: str, severity: str, title: str, evidence: str, at_stake_us: float, fix: str) -> dict:
    return {"rule": rule, "severity": severity, "title": title, "evidence": evidence,
            "gpu_seconds_at_stake": max(0.0, at_stake_us) / 1e6, "recommendation": fix}


@dataclass(frozen=True)
class Evidence:
    """What the rules look at: an :meth:`AntipatternCollector.summary` (``s``), the analysis of
    the same trace, the busiest device's memory (``{"peak_bytes", "total_bytes"}``, when known)
    and, for a requested profile, what the host agent saw meanwhile (``ProfileSystemContext``)."""

    s: dict
    analysis: dict
    memory: dict | None = None
    system: dict | None = None
    critical_path: dict | None = None  # a CriticalPath.result(), where it was found
    thresholds: DetectorConfig = DEFAULTS.default  # the live input-bound detector's

    @property
    def kernel_us(self) -> float:
        return self.analysis["kernel_time_us"] or 0.0


# A rule: one antipattern, a function of the evidence that returns its finding or None. A new
# rule is a function here, added to RULES, with a case in tests/unit/streams/traces/test_antipatterns.py.
Rule = Callable[[Evidence], dict | None]


def gpu_gaps(e: Evidence) -> dict | None:
    s = e.s
    if not s["gpu_gaps"]:
        return None
    return _finding(
        "gpu_gaps", "WARNING", "The GPU sat idle for long stretches",
        f"{s['gpu_gaps']} gaps of 500 ms or more, {s['gpu_gap_us'] / 1e6:.2f} s in all",
        s["gpu_gap_us"],
        "Look at what the CPU does in these gaps (data loading, checkpointing, evaluation, "
        "synchronisation) and overlap it with GPU work.")


def low_utilization_chunks(e: Evidence) -> dict | None:
    s = e.s
    low = s["low_utilization_chunks"] if s["chunk_us"] * CHUNKS >= MIN_CHUNKED_SPAN_US else []
    if not low:
        return None
    idle = sum((1 - s["chunk_utilization"][i]) * s["chunk_us"] for i in low)
    return _finding(
        "low_utilization_chunks", "WARNING" if len(low) < CHUNKS // 2 else "CRITICAL",
        "GPU utilisation under 50 % in parts of the trace",
        f"{len(low)} of {CHUNKS} time chunks ({s['chunk_us'] / 1e3:.1f} ms each) under 50 % busy; "
        f"lowest {min(s['chunk_utilization']) * 100:.0f} %",
        idle,
        "Profile the low chunks: host-side work, small batches or synchronisation starve the GPU there.")


def synchronization(e: Evidence) -> dict | None:
    s = e.s
    if not (s["sync_calls"] and s["sync_us"] >= max(0.01 * e.kernel_us, MIN_AT_STAKE_US)):
        return None
    return _finding(
        "synchronization", "WARNING", "Time spent in CUDA synchronisation calls",
        f"{s['sync_calls']} cudaDeviceSynchronize/cudaStreamSynchronize calls, "
        f"{s['sync_us'] / 1e3:.1f} ms of CPU time blocked",
        s["sync_us"],
        "Remove synchronisations from the training loop (.item(), .cpu(), printing tensors, "
        "torch.cuda.synchronize()); read values back once per N steps.")


def synchronous_memcpy(e: Evidence) -> dict | None:
    s = e.s
    if not s["sync_memcpy"]:
        return None
    return _finding(
        "synchronous_memcpy", "WARNING", "Synchronous memory copies",
        f"{s['sync_memcpy']} cudaMemcpy calls (not device-to-device, not small uploads), "
        f"{s['sync_memcpy_us'] / 1e3:.1f} ms",
        s["sync_memcpy_us"],
        "Use cudaMemcpyAsync / tensor.to(device, non_blocking=True) from pinned memory.")


def pageable_async_memcpy(e: Evidence) -> dict | None:
    s = e.s
    if not (s["pageable_async"] and s["pageable_async_us"] >= MIN_AT_STAKE_US):
        return None
    return _finding(
        "pageable_async_memcpy", "WARNING", "Asynchronous copies from pageable memory",
        f"{s['pageable_async']} cudaMemcpyAsync copies from pageable host memory, "
        f"{s['pageable_async_bytes'] / 1e6:.1f} MB, {s['pageable_async_us'] / 1e3:.1f} ms on the GPU; "
        "they are not asynchronous",
        s["pageable_async_us"],
        "Pin host memory: DataLoader(pin_memory=True), or tensor.pin_memory() before .to(device, non_blocking=True).")


def synchronous_memset(e: Evidence) -> dict | None:
    s = e.s
    if not (s["sync_memset"] and s["sync_memset_us"] >= MIN_AT_STAKE_US):
        return None
    return _finding(
        "synchronous_memset", "INFO", "Synchronous memsets",
        f"{s['sync_memset']} cudaMemset calls, {s['sync_memset_us'] / 1e3:.2f} ms",
        s["sync_memset_us"], "Use cudaMemsetAsync on the work stream.")


def launch_bound(e: Evidence) -> dict | None:
    s = e.s
    if not s["trains"]:
        return None
    return _finding(
        "launch_bound", "WARNING", "Launch-bound trains of short kernels",
        f"{s['trains']} runs of {TRAIN_LENGTH}+ kernels shorter than their launch calls, "
        f"{s['train_kernels']} kernels, {s['train_idle_us'] / 1e3:.1f} ms of GPU idle between them",
        s["train_idle_us"],
        "Capture the step in CUDA graphs, or fuse kernels with torch.compile; larger batches help too.")


def high_launch_delay(e: Evidence) -> dict | None:
    analysis = e.analysis
    launch_mean = analysis.get("launch_delay_mean_us")
    if launch_mean is None or launch_mean <= 100 or not analysis["launches"]:
        return None
    host_wait = _host_wait_us(analysis)
    return _finding(
        "high_launch_delay", "WARNING" if host_wait > 0.1 * e.kernel_us else "INFO", "High kernel launch delay",
        f"mean {launch_mean:.0f} us between a launch call's return and its kernel's start over "
        f"{analysis['launches']} launches; {analysis['launch_delay_outliers']} over 100 us; GPU waited on the "
        f"host for {host_wait / 1e3:.1f} ms",
        host_wait,
        "Long queues behind slow kernels are harmless; a starved queue is not: reduce per-step host work "
        "or use CUDA graphs.")


def low_comm_overlap(e: Evidence) -> dict | None:
    comm, overlap_pct = e.analysis["communication_time_us"], e.analysis["comp_comm_overlap_pct"]
    if not (comm > 0 and overlap_pct is not None and overlap_pct < 50):
        return None
    return _finding(
        "low_comm_overlap", "WARNING", "Communication is not overlapped with computation",
        f"only {overlap_pct:.1f} % of {comm / 1e3:.1f} ms of NCCL time overlaps computation",
        comm - e.analysis["comp_comm_overlap_us"],
        "Overlap gradient all-reduce with backward (DDP bucket_cap_mb, FSDP prefetch), and avoid "
        "synchronising between collectives.")


def input_pipeline_stall(e: Evidence) -> dict | None:
    stall, kernel_us = e.s["gpu_idle_in_dataloader_us"], e.kernel_us
    if stall is None or kernel_us <= 0 or stall < 0.05 * kernel_us:
        return None
    return _finding(
        "input_pipeline_stall", "CRITICAL" if stall >= 0.2 * kernel_us else "WARNING",
        "The GPU waits for the input pipeline",
        f"GPU idle for {stall / 1e3:.1f} ms while DataLoader work ran "
        f"({100 * stall / kernel_us:.0f} % of GPU kernel time)",
        stall,
        "Load data in worker processes: DataLoader(num_workers>0, pin_memory=True, persistent_workers=True, "
        "prefetch_factor); move decoding/augmentation off the training process.")


def no_tensor_cores(e: Evidence) -> dict | None:
    s = e.s
    if s["matmul_us"] < 0.1 * max(s["compute_kernel_us"], 1) or s["matmul_tensor_core_us"] >= 0.1 * s["matmul_us"]:
        return None
    return _finding(
        "no_tensor_cores", "WARNING", "Matrix multiplications do not use tensor cores",
        f"{s['matmul_us'] / 1e3:.1f} ms in GEMM/convolution kernels, "
        f"{100 * s['matmul_tensor_core_us'] / max(s['matmul_us'], 1):.0f} % of it in tensor-core kernels",
        s["matmul_us"] - s["matmul_tensor_core_us"],
        "Train in mixed precision (torch.autocast with bf16 or fp16), or allow TF32 "
        "(torch.backends.cuda.matmul.allow_tf32 = True) on Ampere and newer.")


def memory_pressure(e: Evidence) -> dict | None:
    memory = e.memory
    if not (memory and memory.get("peak_bytes") and memory.get("total_bytes")):
        return None
    share = memory["peak_bytes"] / memory["total_bytes"]
    if share <= 0.9:
        return None
    return _finding(
        "memory_pressure", "WARNING", "Peak GPU memory above 90 % of the device",
        f"peak {memory['peak_bytes'] / 2**30:.1f} GiB of {memory['total_bytes'] / 2**30:.1f} GiB ({share:.0%})",
        0.0,
        "Near the limit the allocator fragments and may retry or fail: use activation checkpointing, "
        "a smaller micro-batch, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.")


def operators_below_roof(e: Evidence) -> dict | None:
    """Operators that count their FLOPs and run under 70 % of their roofline (``streams.traces.operators``)."""
    slow = [o for o in e.analysis.get("operators", []) if o["at_stake_us"] > 0 and o["bound"] is not None]
    at_stake = sum(o["at_stake_us"] for o in slow)
    if at_stake < MIN_AT_STAKE_US:
        return None
    slow.sort(key=lambda o: -o["at_stake_us"])
    said = [f"{o['name']} at {o['roof_pct']:.0f} % of its {o['bound']} roof ({o['achieved_tflops']:.1f} of "
            f"{o['roof_tflops']:.1f} TFLOP/s at {o['precision']}; {o['at_stake_us'] / 1e3:.3f} ms at stake)"
            for o in slow[:3]]
    compute = any(o["bound"] == "compute" for o in slow[:3])
    memory = any(o["bound"] == "memory" for o in slow[:3])
    fixes = []
    if compute:
        fixes.append("for compute-bound operators: shapes in multiples of 8 (16 for fp8) so that tensor cores "
                     "fill, larger or batched matrix multiplications, bf16 or fp8 where accuracy allows")
    if memory:
        fixes.append("for memory-bound operators: fuse them (torch.compile), avoid copies and casts between them, "
                     "keep tensors contiguous (channels_last for convolutions)")
    return _finding(
        "operators_below_roof", "WARNING", "Operators run well under their roofline",
        "; ".join(said), at_stake,
        "Reach 70 % of the roof: " + "; ".join(fixes) + ". gpufleet analyze lists each operator's roofline.")


def _host_wait_us(analysis: dict) -> float:
    """GPU time spent waiting on the host, over all streams: they wait at the same time, so
    the GPU cannot lose more than its idle time."""
    return min(sum(x["host_wait_us"] for x in analysis["idle_by_stream"]), analysis["idle_time_us"])


def _starved(e: Evidence) -> float | None:
    """The share of the trace the GPU was idle, when a requested profile's host context is
    there and the GPU was starved (busy under the live input-bound detector's threshold)."""
    idle_pct = e.analysis["idle_pct"]
    if e.system is None or idle_pct is None or 100.0 - idle_pct >= e.thresholds.input_bound_util_pct:
        return None
    return idle_pct


def _seen(system: dict) -> str:
    return f"{system['ticks']} samples over {system['span_ms'] / 1000:.1f} s"


def cpu_bound_input(e: Evidence) -> dict | None:
    """A starved GPU in the trace, explained by the host's CPUs during the capture."""
    idle_pct = _starved(e)
    if idle_pct is None:
        return None
    system = e.system
    host_cpu, job_cpu = system["host_cpu_mean_pct"], system["workflow_cpu_mean_pct"]
    per_gpu = None if job_cpu is None else job_cpu / max(1, system["gpus"])
    host_full = host_cpu is not None and host_cpu >= HOST_CPU_SATURATED_PCT
    job_full = per_gpu is not None and per_gpu >= e.thresholds.input_bound_cpu_per_gpu_pct
    if not (host_full or job_full):
        return None
    parts = [f"the GPU idle {idle_pct:.0f} % of the trace"]
    if host_cpu is not None:
        parts.append(f"the host's CPUs {host_cpu:.0f} % busy")
    if per_gpu is not None:
        parts.append(f"the job's processes at {per_gpu:.0f} % of a core per GPU")
    fix = ("The input pipeline is CPU-bound and the host has no cores to spare: move decoding and "
           "augmentation to the GPU (NVIDIA DALI, transforms on device tensors), preprocess the data "
           "offline, or run on hosts with more CPU per GPU." if host_full else
           "The job keeps its cores busy while the host has idle ones: load data in more worker processes "
           "(DataLoader num_workers, persistent_workers=True) so the training loop only feeds the GPU.")
    return _finding(
        "cpu_bound_input",
        "CRITICAL" if idle_pct >= 50 else "WARNING",
        "The GPU waits on a CPU-bound input pipeline",
        ", ".join(parts) + f" while profiled ({_seen(system)})",
        _host_wait_us(e.analysis) or e.analysis["idle_time_us"],
        fix,
    )


def storage_bound_input(e: Evidence) -> dict | None:
    """A starved GPU in the trace, explained by the host waiting for I/O during the capture."""
    idle_pct = _starved(e)
    if idle_pct is None:
        return None
    iowait = e.system["host_iowait_mean_pct"]
    if iowait is None or iowait < e.thresholds.input_bound_iowait_pct:
        return None
    return _finding(
        "storage_bound_input", "CRITICAL" if idle_pct >= 50 else "WARNING",
        "The GPU waits on storage",
        f"the GPU idle {idle_pct:.0f} % of the trace while the host spent {iowait:.0f} % of its CPU time "
        f"waiting for I/O ({_seen(e.system)})", _host_wait_us(e.analysis) or e.analysis["idle_time_us"],
        "Read the data from local NVMe or a cache, in large sequential shards (WebDataset, TFRecord), "
        "with more prefetching (DataLoader prefetch_factor); check the shared filesystem's throughput.")


CRITICAL_PATH_CPU_SHARE = 0.5
CRITICAL_PATH_OTHER_SHARE = 0.3


def critical_path_bound(e: Evidence) -> dict | None:
    """What sets the pace of the profiled steps, where it is not the GPU's own computation."""
    cp = e.critical_path
    total = cp["total"] if cp else None
    if not total or not total["path_us"]:
        return None
    path = total["path_us"]
    waiting = total["launch_overhead_us"] + total["kernel_gap_us"]
    shares = (f"{100 * total['cpu_us'] / path:.0f} % CPU, {100 * total['gpu_compute_us'] / path:.0f} % GPU compute, "
              f"{100 * total['communication_us'] / path:.0f} % communication, {100 * waiting / path:.0f} % launch "
              "delays and gaps between kernels")
    steps = len(cp["steps"])
    where = f"the critical path of {steps} step{'s' if steps != 1 else ''} ({path / 1e3:.1f} ms): {shares}"

    def top(on: str) -> str:
        named = [f"{t['short_name']} {t['time_us'] / 1e3:.1f} ms" for t in cp["top"] if t["on"] == on][:3]
        return "; most on it: " + ", ".join(named) if named else ""

    if total["cpu_us"] >= CRITICAL_PATH_CPU_SHARE * path:
        return _finding(
            "critical_path_cpu", "WARNING", "The steps wait for the CPU", where + top("cpu"), total["cpu_us"],
            "The GPU's work follows the host's: speed up or take off the main thread what is named (data "
            "loading: more DataLoader workers and pinned memory; Python and launch overhead: torch.compile, "
            "CUDA graphs), and remove synchronisations that make the host wait for the GPU and then the GPU "
            "for the host.")
    if total["communication_us"] >= CRITICAL_PATH_OTHER_SHARE * path:
        return _finding(
            "critical_path_communication", "WARNING", "Communication sets the pace of the steps", where + top("gpu"),
            total["communication_us"],
            "Overlap the collectives with computation (DDP bucket sizes, FSDP prefetching, async tensor "
            "parallelism) or move less data (gradient compression, a topology-aware layout).")
    if waiting >= CRITICAL_PATH_OTHER_SHARE * path:
        return _finding(
            "critical_path_launch", "WARNING", "Launch delays and gaps between kernels set the pace of the steps",
            where, waiting,
            "The GPU waits between kernels: fuse small kernels (torch.compile), capture the step in a CUDA "
            "graph, and keep the launch queue full (no synchronisation between launches).")
    return None


# Every rule, in the order their findings are listed.
RULES: tuple[Rule, ...] = (
    gpu_gaps, low_utilization_chunks, synchronization, synchronous_memcpy, pageable_async_memcpy,
    synchronous_memset, launch_bound, high_launch_delay, low_comm_overlap, input_pipeline_stall,
    no_tensor_cores, memory_pressure, operators_below_roof, cpu_bound_input, storage_bound_input,
    critical_path_bound,
)


def detect_antipatterns(s: dict, analysis: dict, memory: dict | None, system: dict | None,
                        critical_path: dict | None, thresholds: DetectorConfig) -> list[dict]:
    """The findings of every rule on one trace (see :class:`Evidence` for the arguments)."""
    evidence = Evidence(s, analysis, memory, system, critical_path, thresholds)
    return [f for rule in RULES if (f := rule(evidence)) is not None]
