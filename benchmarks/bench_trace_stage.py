"""The worker's trace stage per kernel event: the ``KernelEvent`` messages of a trace decoded and
applied to its session (``streams.traces.sessions``), a batch at a time as the stage takes them,
against decoding alone, on the same messages in the same run. Prints kernel events per second of
each and their ratio (best of ``--repeat``): the baseline a faster trace stage is measured
against (the goal of issue 34: twice today's events per second). The cycle collector is off
while it runs, as during an analysis.

    python benchmarks/bench_trace_stage.py [--batch 1000] [--repeat 5] [TRACE]

TRACE: a profiler trace (default: the largest under shared/traces).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from producers.publish_trace import kernel_event_records
from producers.read_trace import no_cycle_collection, read_trace
from schemas.codec import Codec
from streams.traces.sessions import TraceSessionConfig, TraceSessions

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", type=Path, default=None)
    parser.add_argument("--batch", type=int, default=1000, help="messages per batch (the stage's take)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    trace_path = args.trace or max(SHARED.glob("*.json.gz"), key=lambda p: p.stat().st_size)
    codec = Codec()
    trace = read_trace(trace_path)
    records = list(kernel_event_records(trace, "wf/bench", "wf"))
    end = {"trace_id": "wf/bench", "workflow_id": "wf", "rank": trace.rank, "events": len(records),
           "events_read": trace.events_seen, "source": str(trace_path), "partial": False, "error": None,
           "last_step_dropped": trace.last_step_dropped, "memory_peak_bytes": None, "memory_total_bytes": None,
           "flops": trace.flops or None, "gpu_name": trace.gpu_name, "published_at": 0, "system": None}
    values = [codec.encode("KernelEvent", r) for r in records] + [codec.encode("TraceEnd", end)]
    batches = [values[i:i + args.batch] for i in range(0, len(values), args.batch)]

    def decode_only() -> float:
        t = time.perf_counter()
        for batch in batches:
            codec.decode_many(batch)
        return time.perf_counter() - t

    def decode_and_apply() -> float:
        sessions = TraceSessions(TraceSessionConfig(), {})
        t = time.perf_counter()
        for batch in batches:
            ok, _ = codec.decode_many(batch)
            result = sessions.apply(0, [(name, r) for _, name, r in ok], now_ms=0)
        elapsed = time.perf_counter() - t
        assert result.analyses, "the trace's session did not end"
        return elapsed

    with no_cycle_collection():
        base = min(decode_only() for _ in range(args.repeat))
        full = min(decode_and_apply() for _ in range(args.repeat))
    n = len(records)
    print(f"trace: {trace_path.name} ({n:,} kernel events, batches of {args.batch})")
    print(f"decode only:               {n / base:10,.0f} kernel events/s")
    print(f"decode + trace stage:      {n / full:10,.0f} kernel events/s  ({full / base:.2f}x the time of decoding)")


if __name__ == "__main__":
    main()
