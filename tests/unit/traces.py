"""Builders of small Kineto-format traces for tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

SHARED_TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"


def kernel(name: str, ts: float, dur: float, stream: int = 7, corr: int = -1, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"stream": stream, "correlation": corr, "device": 0}}


def memcpy(ts: float, dur: float, stream: int = 7, corr: int = -1, nbytes: int = 1024) -> dict:
    e = kernel("Memcpy HtoD (Pageable -> Device)", ts, dur, stream, corr, cat="gpu_memcpy")
    e["args"]["bytes"] = nbytes
    return e


def runtime(name: str, ts: float, dur: float, corr: int) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "cbid": 211}}


def step(n: int, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1,
            "ts": ts, "dur": dur, "args": {}}


def cpu_op(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}}


def memory(ts: float, total_allocated: int, device: int = 0) -> dict:
    return {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
            "args": {"Device Type": 1, "Device Id": device, "Total Allocated": total_allocated}}


def write_trace(path: Path, events: list[dict], rank: int | None = 0, gz: bool = False,
                device_memory: int | None = None, kineto_layout: bool = False) -> Path:
    doc: dict = {"schemaVersion": 1}
    if device_memory is not None:
        doc["deviceProperties"] = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": device_memory}]
    if rank is not None:
        doc["distributedInfo"] = {"rank": rank}
    doc["traceEvents"] = [*events, {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler", "ts": 0, "dur": 1}]
    if kineto_layout:  # as the profiler writes it: each event a block from "  {" to "  }"
        events_text = ",\n".join("  {\n    " + json.dumps(e)[1:-1] + "\n  }" for e in doc.pop("traceEvents"))
        head = json.dumps(doc, indent=2)[:-2]
        data = (head + ',\n  "traceEvents": [\n' + events_text + "\n]}").encode()
    else:
        data = json.dumps(doc).encode()  # one line: not the profiler's layout, read by the generic parser
    if gz:
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path
