"""The GPUs of the Slurm test's node as NVML would see them: each running job process that opened
GPUs (an entry ``<pid>.json`` of a registry folder, written by ``tests/integration/gpu_job.py``)
is on the GPUs Slurm named to it (its CUDA_VISIBLE_DEVICES: Slurm's indexes, in the order of the
device files), which NVML knows by minor number; NVML's own order differs. The fake NVML is at
the pynvml boundary; everything above it is the agent's own."""

from __future__ import annotations

import json
import os
from pathlib import Path

from producers.agent.gpus.sample_nvml import NvmlSampler
from tests.support.fake_nvml import FakeGpu, FakeNvml, FakeProcess


class JobGpus:
    def __init__(self, registry: Path, count: int) -> None:
        self.registry = registry
        # NVML index i has minor number minors[i]: Slurm's GPU 0 is NVML's GPU 1, and so on.
        minors = [i + 1 if i % 2 == 0 and i + 1 < count else i - 1 if i % 2 else i for i in range(count)]
        self.gpus = [FakeGpu(f"GPU-{i:02d}-{minors[i]}", util=0, mem_used=0, minor=minors[i], processes=[])
                     for i in range(count)]
        self.by_minor = {g.minor: g for g in self.gpus}

    def refresh(self) -> None:
        for g in self.gpus:
            g.processes, g.util, g.mem_used = [], 0, 0
        for entry in self.registry.glob("*.json"):
            pid = int(entry.stem)
            try:
                os.kill(pid, 0)
                opened = json.loads(entry.read_text())
            except (OSError, ValueError):
                continue  # gone, or being written
            for index in opened["gpus"]:
                g = self.by_minor[int(index)]
                g.processes.append(FakeProcess(pid, sm_util=int(opened["util"])))
                g.util, g.mem_used = int(opened["util"]), g.mem_used + (48 << 30)  # 60 % of an 80 GB GPU


class Sampler(NvmlSampler):
    def __init__(self, jobs: JobGpus) -> None:
        super().__init__(FakeNvml(jobs.gpus))
        self.jobs = jobs

    def tick(self):
        self.jobs.refresh()
        return super().tick()
