"""A made trace of copies overlapping on several streams, where HTA's own memory bandwidth, queue
length and idle figures depend on the order of equal times (tests/unit/streams/traces/test_hta_equality.py)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.traces import COMPUTE_KERNELS


def overlapping_copies_trace(path: Path, seed: int = 1, streams: int = 4, copies_per_stream: int = 300,
                             kernels: int = 600) -> Path:
    """The shapes where HTA's memory bandwidth and queue length summaries depend on the order
    of equal times: device-to-device copies running at once on several streams (a few host
    copies and sets among them, some of 0 us), kernels launched in the very microsecond
    another starts on their stream, copies that start as others of their kind end and copies
    that end together. Whole-microsecond times on a 5 us grid make such ties common; the GPU
    events are listed stream by stream, as a profiler's buffers hold them, so the file's order
    is not their start order. Bandwidths are the profiler's (bytes over the nanosecond
    duration): decimal fractions no float holds exactly. Its HTA results are
    ``tests/data/hta/overlapping-copies-<seed>.json`` (``benchmarks/hta_reference.py``)."""
    import random

    rng = random.Random(seed)
    corr = 0
    cpu: list[dict] = []
    gpu: dict[int, list[dict]] = {}
    names = ("Memcpy DtoD (Device -> Device)",) * 6 + ("Memcpy HtoD (Pinned -> Device)",
                                                       "Memcpy DtoH (Device -> Pinned)", "Memset (Device)")
    for s in range(streams):
        stream = 13 + s
        t = 1000 + 5 * rng.randrange(4)
        for _ in range(copies_per_stream):
            corr += 1
            name = rng.choice(names)
            dur = 5 * rng.choice((0, 1, 1, 2, 2, 3, 4, 6, 10))
            start = t + 5 * rng.choice((0, 0, 0, 1, 2))
            nbytes = rng.randint(1 << 12, 1 << 26)
            ns = max(dur * 1000 + rng.randint(-400, 400), 100)
            launch = start - 5 * rng.choice((0, 1, 2, 4))
            cpu.append({"ph": "X", "cat": "cuda_runtime", "pid": 1, "tid": 1, "ts": launch, "dur": 3,
                        "name": "cudaMemsetAsync" if name.startswith("Memset") else "cudaMemcpyAsync",
                        "args": {"correlation": corr, "cbid": 41}})
            gpu.setdefault(stream, []).append(
                {"ph": "X", "cat": "gpu_memset" if name.startswith("Memset") else "gpu_memcpy", "name": name,
                 "pid": 0, "tid": stream, "ts": start, "dur": dur,
                 "args": {"stream": stream, "correlation": corr, "device": 0, "context": 1, "bytes": nbytes,
                          "memory bandwidth (GB/s)": nbytes / ns}})
            t = start + dur
    t = gpu_free = 1000
    for _ in range(kernels):  # kernels on stream 7, often launched as an earlier one starts
        corr += 1
        launch = t
        start = max(gpu_free, t + 5 * rng.choice((0, 1, 1, 3)))
        dur = 5 * rng.randint(1, 4)
        gpu_free = start + dur
        cpu.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                    "ts": launch, "dur": 2, "args": {"correlation": corr, "cbid": 211}})
        gpu.setdefault(7, []).append({"ph": "X", "cat": "kernel", "name": rng.choice(COMPUTE_KERNELS), "pid": 0,
                                      "tid": 7, "ts": start, "dur": dur,
                                      "args": {"stream": 7, "correlation": corr, "device": 0, "context": 1}})
        t += 5 * rng.choice((0, 1, 1, 2))
    cpu.sort(key=lambda e: e["ts"])
    events = cpu + [e for stream in sorted(gpu, reverse=True) for e in gpu[stream]]
    doc = {"schemaVersion": 1,
           "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85_000_000_000}],
           "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
           "traceEvents": events}
    path.write_text(json.dumps(doc))
    return path
