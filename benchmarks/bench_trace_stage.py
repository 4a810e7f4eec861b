"""The worker's trace stage per kernel event: a trace's messages decoded and applied to its session
(``streams.traces.sessions``), a batch of messages at a time as the stage takes them, against
decoding alone, on the same messages in the same run; for the ``KernelEventColumns`` messages the
agents send (``EVENTS_PER_MESSAGE`` events each) and for the ``KernelEvent`` records (one message
per event) older agents send. Prints kernel events per second of each (best of ``--repeat``) and
the ratio of the two; with ``--against REV``, also this stage against the stage of git revision
REV (a temporary worktree, its own benchmark run on the same trace), alternating, medians of
``--rounds``. The cycle collector is off while it runs, as during an analysis.

    python benchmarks/bench_trace_stage.py [--batch 1000] [--repeat 5] [--against REV --rounds 3] [TRACE]

TRACE: a profiler trace (default: the largest under shared/traces).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from producers.traces.publish import kernel_event_columns, kernel_event_records
from producers.traces.read import no_cycle_collection, read_trace
from schemas.codec import Codec
from streams.traces.sessions import TraceSessionConfig, TraceSessions

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
THROUGH = re.compile(r"decode \+ trace stage:\s+([\d,]+) kernel events/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", type=Path, default=None)
    parser.add_argument("--batch", type=int, default=1000, help="messages per batch (the stage's take)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--against", default=None, help="a git revision whose trace stage to compare with")
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs of each with --against")
    args = parser.parse_args()
    trace_path = args.trace or max(SHARED.glob("*.json.gz"), key=lambda p: p.stat().st_size)
    if args.against:
        against(trace_path, args)
        return
    codec = Codec()
    trace = read_trace(trace_path)
    end = {"trace_id": "wf/bench", "workflow_id": "wf", "rank": trace.rank, "events": len(trace.events),
           "events_read": trace.events_seen, "source": str(trace_path), "partial": False, "error": None,
           "last_step_dropped": trace.last_step_dropped, "memory_peak_bytes": None, "memory_total_bytes": None,
           "flops": trace.flops or None, "gpu_name": trace.gpu_name, "published_at": 0, "system": None}
    marker = codec.encode("TraceEnd", end)
    columns = [codec.encode("KernelEventColumns", r) for r in kernel_event_columns(trace, "wf/bench", "wf")]
    records = [codec.encode("KernelEvent", r) for r in kernel_event_records(trace, "wf/bench", "wf")]
    n = len(trace.events)
    print(f"trace: {trace_path.name} ({n:,} kernel events, batches of {args.batch} messages)")
    rates = {}
    for label, values in (("KernelEventColumns", columns + [marker]), ("KernelEvent", records + [marker])):
        batches = [values[i:i + args.batch] for i in range(0, len(values), args.batch)]
        base, full = timed(codec, batches, args.repeat)
        rates[label] = n / full
        print(f"{label} ({len(values) - 1:,} messages)")
        print(f"  decode only:             {n / base:10,.0f} kernel events/s")
        print(f"  decode + trace stage:    {n / full:10,.0f} kernel events/s  "
              f"({full / base:.2f}x the time of decoding)")
    print(f"columns against one message per event: {rates['KernelEventColumns'] / rates['KernelEvent']:.2f}x "
          "the kernel events per second")


def timed(codec: Codec, batches: list[list[bytes]], repeat: int) -> tuple[float, float]:
    """The best time of decoding the batches, and of decoding and applying them to a session."""

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
        return min(decode_only() for _ in range(repeat)), min(decode_and_apply() for _ in range(repeat))


def against(trace_path: Path, args: argparse.Namespace) -> None:
    """This stage against REV's, each its own benchmark on the same trace, alternating."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "against"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), args.against],
                       check=True, capture_output=True)
        try:
            ours, theirs = [], []
            for _ in range(args.rounds):
                for where, into in ((ROOT, ours), (tree, theirs)):
                    out = subprocess.run([sys.executable, "benchmarks/bench_trace_stage.py", str(trace_path),
                                          "--batch", str(args.batch), "--repeat", str(args.repeat)],
                                         cwd=where, check=True, capture_output=True, text=True).stdout
                    into.append(float(THROUGH.search(out).group(1).replace(",", "")))  # (the first: what agents send)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    ratio = statistics.median(ours) / statistics.median(theirs)
    print(f"trace: {trace_path.name}")
    print(f"this trace stage:   {statistics.median(ours):10,.0f} kernel events/s (median of {args.rounds}: "
          f"{', '.join(f'{x:,.0f}' for x in ours)})")
    print(f"{args.against}'s:      {statistics.median(theirs):10,.0f} kernel events/s (median of {args.rounds}: "
          f"{', '.join(f'{x:,.0f}' for x in theirs)})")
    print(f"this stage against {args.against}: {ratio:.2f}x the kernel events per second")


if __name__ == "__main__":
    main()
