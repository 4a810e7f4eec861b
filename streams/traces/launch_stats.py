"""CUDA launch statistics of one rank (HTA 0.5.0's cuda_kernel_launch_stats, aggregated).

Each ``cudaLaunchKernel``/``cudaLaunchKernelExC``/``cudaMemcpyAsync``/``cudaMemsetAsync`` call
is joined to its GPU event by correlation id: launch delay = max(0, gpu start - cpu start -
cpu duration). A short kernel: call <= 50 us and kernel shorter than the call; a runtime
outlier: call > 50 us; a launch-delay outlier: delay > 100 us.
"""

from __future__ import annotations

import msgspec

from streams.traces.analysis import Finished, Options
from streams.traces.batch import EventBatch

LAUNCH_CALLS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync"})
RUNTIME_CUTOFF_US = 50
LAUNCH_DELAY_CUTOFF_US = 100


class Call(msgspec.Struct, gc=False):
    """A CUDA runtime call that launched (or may have launched) work on the GPU, held until its
    GPU event arrives: what the analysers read of it then."""

    name: str
    ts: float
    dur: float
    op: str | None = None  # the CPU operator it was made from, where that operator counts its FLOPs
    step: str | None = None  # the profiler step it was made in


class LaunchStats(msgspec.Struct):
    runtime_cutoff_us: float = RUNTIME_CUTOFF_US
    launch_delay_cutoff_us: float = LAUNCH_DELAY_CUTOFF_US
    launches: int = 0
    cpu_us: float = 0.0
    gpu_us: float = 0.0
    delay_us: float = 0.0
    max_delay_us: float = 0.0
    short_kernels: int = 0
    short_kernel_gpu_us: float = 0.0
    runtime_outliers: int = 0
    delay_outliers: int = 0

    @classmethod
    def create(cls, options: Options) -> LaunchStats:
        return cls()

    def add(self, batch: EventBatch) -> None:
        """The batch's GPU-side events launched by a launch call, with the call."""
        runtime_cutoff, delay_cutoff = self.runtime_cutoff_us, self.launch_delay_cutoff_us
        for call, ts, gpu_dur in zip(batch.calls, batch.g_ts, batch.g_dur):
            if call is None or call.name not in LAUNCH_CALLS:
                continue
            cpu_dur = call.dur
            self.launches += 1
            self.cpu_us += cpu_dur
            self.gpu_us += gpu_dur
            delay = ts - call.ts - cpu_dur
            if delay > 0:  # (per launch: comparisons cost less than calls of max())
                self.delay_us += delay
                if delay > self.max_delay_us:  # noqa: PLR1730
                    self.max_delay_us = delay
                if delay > delay_cutoff:
                    self.delay_outliers += 1
            if cpu_dur > runtime_cutoff:
                self.runtime_outliers += 1
            elif gpu_dur < cpu_dur:
                self.short_kernels += 1
                self.short_kernel_gpu_us += gpu_dur

    def result(self, finished: Finished) -> dict:
        n = self.launches
        return {"launch": {
            "launches": n,
            "cpu_duration_mean_us": self.cpu_us / n if n else None,
            "gpu_duration_mean_us": self.gpu_us / n if n else None,
            "launch_delay_mean_us": self.delay_us / n if n else None,
            "launch_delay_max_us": self.max_delay_us if n else None,
            "launch_delay_total_us": self.delay_us,
            "short_kernels": self.short_kernels,
            "short_kernel_gpu_us": self.short_kernel_gpu_us,
            "runtime_outliers": self.runtime_outliers,
            "launch_delay_outliers": self.delay_outliers,
        }}

    def to_state(self) -> dict:
        return {"launch": {k: getattr(self, k) for k in COUNTERS}}

    @classmethod
    def from_state(cls, state: dict, options: Options) -> LaunchStats:
        stats = cls()
        for k, v in state["launch"].items():
            setattr(stats, k, v)
        return stats


COUNTERS = ("launches", "cpu_us", "gpu_us", "delay_us", "max_delay_us", "short_kernels", "short_kernel_gpu_us",
            "runtime_outliers", "delay_outliers")
