"""Antipatterns in one rank's trace -> findings with evidence, GPU time at stake and the fix.

``AntipatternCollector`` is fed the same time-ordered events as the analysers and keeps
O(streams) state plus a fixed-size utilisation histogram; ``detect_antipatterns`` turns what
it collected (with the analysis result) into findings. Rules:

* the Nsight Systems CUDA rules: GPU gaps >= 500 ms; GPU utilisation in 30 time chunks,
  chunks under 50 % flagged; time in cudaDeviceSynchronize/cudaStreamSynchronize;
  synchronous cudaMemcpy (except device-to-device and host-to-device <= 64,000 bytes);
  asynchronous copies from pageable memory; synchronous cudaMemset;
* launch-bound trains of short kernels (>= 10 in a row on a stream, each shorter than its
  launch call): try CUDA graphs or torch.compile;
* high launch delay; low communication/computation overlap; input-pipeline stalls (GPU
  idle while DataLoader work runs); GEMM/convolution time without tensor-core kernels
  (try AMP/bf16); peak memory over 90 % of the device's;
* from what the host agent saw during a requested profile (``ProfileSystemContext``): a
  starved GPU while the host's or the job's CPUs are saturated (CPU-bound input), or while
  the host waits on I/O (storage-bound input), on the live input-bound detector's thresholds.

Findings worth under 1 ms of GPU time are left out. The GPU time at stake of different
findings can overlap (a gap is also a low-utilisation chunk): do not add them up.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import msgspec

from streams.detect_waste import DetectorConfig

GAP_US = 500_000
CHUNKS = 30
MIN_CHUNKED_SPAN_US = 100_000  # below this a trace is too short for 30 chunks to say anything
MIN_AT_STAKE_US = 1_000  # findings worth less GPU time than this are noise
CHUNK_UTILIZATION = 0.5
HIST_BUCKETS = 1024
HOST_CPU_SATURATED_PCT = 90.0
_INPUT_BOUND = DetectorConfig()  # the live input-bound detector's thresholds
SYNC_CALLS = frozenset({"cudaDeviceSynchronize", "cudaStreamSynchronize"})
SMALL_HTOD_BYTES = 64_000
TRAIN_LENGTH = 10
SHORT_CALL_US = 50
MATMUL_RE = re.compile(r"gemm|conv|cutlass|cudnn|wgrad|dgrad|fprop|matmul|xmma", re.IGNORECASE)
TENSOR_CORE_RE = re.compile(
    r"h884|h1688|s1688|i8816|hmma|wmma|tensorop|xmma|_tc_|bf16|f16f16|fp16|half|gmma|sm80_|sm90_|884|1688|16816",
    re.IGNORECASE,
)


@lru_cache(maxsize=65_536)
def _matmul_kind(name: str) -> tuple[bool, bool]:
    """(a GEMM or convolution kernel, on tensor cores). Kernel names are long C++ templates
    and a trace repeats a few hundred of them thousands of times: match each once."""
    matmul = MATMUL_RE.search(name) is not None
    return matmul, matmul and TENSOR_CORE_RE.search(name) is not None


class AntipatternCollector(msgspec.Struct):
    # GPU busy coverage, for gaps and the utilisation histogram
    first_ts: float | None = None
    group_start: float = 0.0
    group_end: float = 0.0
    gaps: int = 0
    gap_us: float = 0.0
    bucket_us: float = 1000.0
    buckets: list[float] = msgspec.field(default_factory=list)
    # synchronisation and copies
    sync_calls: int = 0
    sync_us: float = 0.0
    sync_memcpy: int = 0
    sync_memcpy_us: float = 0.0
    pageable_async: int = 0
    pageable_async_us: float = 0.0
    pageable_async_bytes: int = 0
    sync_memset: int = 0
    sync_memset_us: float = 0.0
    # trains of short kernels, per stream: [current run length, idle inside the run, previous end]
    runs: dict[int, list[float]] = msgspec.field(default_factory=dict)
    trains: int = 0
    train_kernels: int = 0
    train_idle_us: float = 0.0
    # input pipeline: DataLoader time, and its union with GPU busy time
    dataloader: list[float] = msgspec.field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])  # Coverage fields
    dataloader_or_gpu: list[float] = msgspec.field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    dataloader_seen: bool = False
    # precision
    matmul_us: float = 0.0
    matmul_tensor_core_us: float = 0.0
    compute_kernel_us: float = 0.0

    # -- feeding ---------------------------------------------------------------------------
    def add_cpu(self, e: dict) -> None:
        name = e["name"]
        if e["kind"] == "runtime":
            if name in SYNC_CALLS:
                self.sync_calls += 1
                self.sync_us += e["dur"]
        elif "DataLoader" in name and e["kind"] == "cpu_op":
            self.dataloader_seen = True
            _cov_add(self.dataloader, e["ts"], e["ts"] + e["dur"])
            _cov_add(self.dataloader_or_gpu, e["ts"], e["ts"] + e["dur"])

    def add_gpu(self, e: dict, call: dict | None) -> None:
        ts, end = e["ts"], e["ts"] + e["dur"]
        self._busy(ts, end)
        _cov_add(self.dataloader_or_gpu, ts, end)
        cat, name = e["cat"], e["name"]
        call_name = call["name"] if call else None
        if e["kind"] == "memcpy":
            if call_name == "cudaMemcpy":
                nbytes = e.get("bytes") or 0
                same_device = "DtoD" in name
                small_upload = "HtoD" in name and nbytes <= SMALL_HTOD_BYTES
                if not (same_device or small_upload):
                    self.sync_memcpy += 1
                    self.sync_memcpy_us += call["dur"]
            elif call_name == "cudaMemcpyAsync" and "Pageable" in name:
                self.pageable_async += 1
                self.pageable_async_us += e["dur"]
                self.pageable_async_bytes += e.get("bytes") or 0
        elif e["kind"] == "memset" and call_name == "cudaMemset":
            self.sync_memset += 1
            self.sync_memset_us += call["dur"]
        if e["kind"] == "kernel" and cat in ("kernel", "Kernel"):
            self.compute_kernel_us += e["dur"]
            matmul, tensor_core = _matmul_kind(name)
            if matmul:
                self.matmul_us += e["dur"]
                if tensor_core:
                    self.matmul_tensor_core_us += e["dur"]
            short = call is not None and call["dur"] <= SHORT_CALL_US and e["dur"] < call["dur"]
            self._train(e["stream"], ts, end, short)

    def _train(self, stream: int, ts: float, end: float, short: bool) -> None:
        run = self.runs.get(stream)
        if run is None:
            run = self.runs[stream] = [0, 0.0, end]
        if short:
            if run[0] > 0:
                run[1] += max(0.0, ts - run[2])
            run[0] += 1
        else:
            self._close_train(run)
        run[2] = end

    def _close_train(self, run: list[float]) -> None:
        if run[0] >= TRAIN_LENGTH:
            self.trains += 1
            self.train_kernels += int(run[0])
            self.train_idle_us += run[1]
        run[0], run[1] = 0, 0.0

    def _busy(self, ts: float, end: float) -> None:
        if self.first_ts is None:
            self.first_ts, self.group_start, self.group_end = ts, ts, end
            return
        if ts > self.group_end:
            gap = ts - self.group_end
            if gap >= GAP_US:
                self.gaps += 1
                self.gap_us += gap
            self._histogram(self.group_start, self.group_end)
            self.group_start, self.group_end = ts, end
        elif end > self.group_end:
            self.group_end = end

    def _histogram(self, start: float, end: float) -> None:
        """Add covered time [start, end) to buckets of ``bucket_us`` from the first event,
        doubling the bucket width (folding pairs) to stay within HIST_BUCKETS."""
        origin = self.first_ts or 0.0
        while end - origin > self.bucket_us * HIST_BUCKETS:
            b = self.buckets
            self.buckets = [sum(b[i:i + 2]) for i in range(0, len(b), 2)]
            self.bucket_us *= 2
        w = self.bucket_us
        pos = start
        while pos < end:
            i = int((pos - origin) // w)
            stop = min(end, origin + (i + 1) * w)
            if i >= len(self.buckets):
                self.buckets.extend([0.0] * (i + 1 - len(self.buckets)))
            self.buckets[i] += stop - pos
            pos = stop

    # -- results -----------------------------------------------------------------------------
    def summary(self) -> dict:
        """Evidence numbers (closes the open GPU interval and open trains on a copy)."""
        c = AntipatternCollector.from_state(self.to_state())
        if c.first_ts is not None:
            c._histogram(c.group_start, c.group_end)
        for run in c.runs.values():
            c._close_train(run)
        chunks = c._chunks()
        dl = _cov_total(c.dataloader)
        dl_gpu_union = _cov_total(c.dataloader_or_gpu)
        gpu_busy = sum(c.buckets)
        return {
            "gpu_gaps": c.gaps, "gpu_gap_us": c.gap_us,
            "low_utilization_chunks": [i for i, u in enumerate(chunks) if u < CHUNK_UTILIZATION],
            "chunk_utilization": chunks,
            "chunk_us": (c.group_end - c.first_ts) / CHUNKS if c.first_ts is not None else 0.0,
            "sync_calls": c.sync_calls, "sync_us": c.sync_us,
            "sync_memcpy": c.sync_memcpy, "sync_memcpy_us": c.sync_memcpy_us,
            "pageable_async": c.pageable_async, "pageable_async_us": c.pageable_async_us,
            "pageable_async_bytes": c.pageable_async_bytes,
            "sync_memset": c.sync_memset, "sync_memset_us": c.sync_memset_us,
            "trains": c.trains, "train_kernels": c.train_kernels, "train_idle_us": c.train_idle_us,
            "dataloader_us": dl if c.dataloader_seen else None,
            # GPU idle while DataLoader work ran = |DL| - |DL and GPU| = |DL or GPU| - |GPU|
            "gpu_idle_in_dataloader_us": (dl_gpu_union - gpu_busy) if c.dataloader_seen else None,
            "matmul_us": c.matmul_us, "matmul_tensor_core_us": c.matmul_tensor_core_us,
            "compute_kernel_us": c.compute_kernel_us,
        }

    def _chunks(self) -> list[float]:
        if self.first_ts is None or self.group_end <= self.first_ts:
            return []
        span = self.group_end - self.first_ts
        chunk = span / CHUNKS
        w = self.bucket_us
        buckets = self.buckets
        out = []
        for k in range(CHUNKS):
            lo, hi = k * chunk, (k + 1) * chunk
            covered = 0.0
            for i in range(int(lo // w), min(len(buckets), int(hi // w) + 1)):  # the buckets it touches
                overlap = min(hi, (i + 1) * w) - max(lo, i * w)
                if overlap > 0:
                    covered += buckets[i] * overlap / w  # busy time assumed even within a bucket
            out.append(min(1.0, covered / chunk))
        return out

    def to_state(self) -> dict:
        state = msgspec.to_builtins(self)  # new lists and dicts: a snapshot, not a view
        state["runs"] = {str(k): v for k, v in state["runs"].items()}
        return state

    @classmethod
    def from_state(cls, state: dict) -> AntipatternCollector:
        c = cls(**{name: state[name] for name in cls.__struct_fields__})
        c.runs = {int(k): list(v) for k, v in state["runs"].items()}
        c.buckets = list(state["buckets"])
        c.dataloader = list(state["dataloader"])
        c.dataloader_or_gpu = list(state["dataloader_or_gpu"])
        return c


def _cov_add(cov: list[float], ts: float, end: float) -> None:
    """Union of intervals fed in start order (as ``trace_temporal_breakdown.Coverage``), kept in
    a JSON-able 4-float list [seen, start, end, closed] so that it checkpoints as it is."""
    if not cov[0]:
        cov[:] = [1.0, ts, end, 0.0]
    elif ts > cov[2]:
        cov[3] += cov[2] - cov[1]
        cov[1], cov[2] = ts, end
    elif end > cov[2]:
        cov[2] = end


def _cov_total(cov: list[float]) -> float:
    return cov[3] + cov[2] - cov[1] if cov[0] else 0.0


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

    @property
    def kernel_us(self) -> float:
        return self.analysis["kernel_time_us"] or 0.0


# A rule: one antipattern, a function of the evidence that returns its finding or None. A new
# rule is a function here, added to RULES, with a case in tests/unit/streams/test_trace_antipatterns.py.
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


def _host_wait_us(analysis: dict) -> float:
    """GPU time spent waiting on the host, over all streams: they wait at the same time, so
    the GPU cannot lose more than its idle time."""
    return min(sum(x["host_wait_us"] for x in analysis["idle_by_stream"]), analysis["idle_time_us"])


def _starved(e: Evidence) -> float | None:
    """The share of the trace the GPU was idle, when a requested profile's host context is
    there and the GPU was starved (busy under the live input-bound detector's threshold)."""
    idle_pct = e.analysis["idle_pct"]
    if e.system is None or idle_pct is None or 100.0 - idle_pct >= _INPUT_BOUND.input_bound_util_pct:
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
    job_full = per_gpu is not None and per_gpu >= _INPUT_BOUND.input_bound_cpu_per_gpu_pct
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
        "cpu_bound_input", "CRITICAL" if idle_pct >= 50 else "WARNING",
        "The GPU waits on a CPU-bound input pipeline",
        ", ".join(parts) + f" while profiled ({_seen(system)})", _host_wait_us(e.analysis) or e.analysis["idle_time_us"],
        fix)


def storage_bound_input(e: Evidence) -> dict | None:
    """A starved GPU in the trace, explained by the host waiting for I/O during the capture."""
    idle_pct = _starved(e)
    if idle_pct is None:
        return None
    iowait = e.system["host_iowait_mean_pct"]
    if iowait is None or iowait < _INPUT_BOUND.input_bound_iowait_pct:
        return None
    return _finding(
        "storage_bound_input", "CRITICAL" if idle_pct >= 50 else "WARNING",
        "The GPU waits on storage",
        f"the GPU idle {idle_pct:.0f} % of the trace while the host spent {iowait:.0f} % of its CPU time "
        f"waiting for I/O ({_seen(e.system)})", _host_wait_us(e.analysis) or e.analysis["idle_time_us"],
        "Read the data from local NVMe or a cache, in large sequential shards (WebDataset, TFRecord), "
        "with more prefetching (DataLoader prefetch_factor); check the shared filesystem's throughput.")


# Every rule, in the order their findings are listed.
RULES: tuple[Rule, ...] = (
    gpu_gaps, low_utilization_chunks, synchronization, synchronous_memcpy, pageable_async_memcpy,
    synchronous_memset, launch_bound, high_launch_delay, low_comm_overlap, input_pipeline_stall,
    no_tensor_cores, memory_pressure, cpu_bound_input, storage_bound_input,
)


def detect_antipatterns(s: dict, analysis: dict, memory: dict | None = None,
                        system: dict | None = None) -> list[dict]:
    """The findings of every rule on one trace (see :class:`Evidence` for the arguments)."""
    evidence = Evidence(s, analysis, memory, system)
    return [f for rule in RULES if (f := rule(evidence)) is not None]
