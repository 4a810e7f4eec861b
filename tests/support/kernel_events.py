"""KernelEvent and TraceEnd records of a small trace, as the trace agent publishes them."""

from __future__ import annotations

from tests.support.traces import kernel, runtime


def kernel_events(trace_id="wf/t.json", n=20):
    raw = []
    for i in range(n):
        raw.append(runtime("cudaLaunchKernel", i * 100, 5, corr=i))
        raw.append(kernel("gemm", i * 100 + 10, 50, corr=i))
    out = []
    for seq, e in enumerate(raw):
        args = e["args"]
        out.append(("KernelEvent", {
            "trace_id": trace_id, "workflow_id": "wf", "rank": 1, "seq": seq,
            "kind": "runtime" if e["cat"] == "cuda_runtime" else "kernel", "cat": e["cat"], "name": e["name"],
            "ts": e["ts"], "dur": e["dur"], "stream": args.get("stream", -1), "correlation": args["correlation"],
        }))
    return out


def end(trace_id="wf/t.json", events=40, partial=False, error=None, system=None, flops=None, gpu_name=None):
    return ("TraceEnd", {"trace_id": trace_id, "workflow_id": "wf", "rank": 1, "events": events,
                         "events_read": events, "source": "t.json", "partial": partial, "error": error,
                         "last_step_dropped": False, "published_at": 0, "system": system, "flops": flops,
                         "gpu_name": gpu_name})
