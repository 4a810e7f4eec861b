"""The traces behind ``tests/data/trace-checkpoints-v1.json.gz``: checkpoints of the trace analysis
(``TraceAnalyzer.to_state``) written by the release before the analyser protocol, each cut
part-way through a trace the tests make, with the result that release gave on resuming it and
feeding the rest. A later release must restore them unchanged (``tests/unit/streams/traces/test_checkpoints.py``).

Made with ``python -m tests.support.trace_checkpoints OUT`` at commit 58dad57."""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
import tempfile
from pathlib import Path

from producers.traces.read import read_trace
from tests.support.overlapping_copies import overlapping_copies_trace
from tests.support.traces import queue_full_trace, synthetic_job_trace, synthetic_operator_trace

GPU = "NVIDIA H100 80GB HBM3"
# name -> (builder, cut as a share of the events)
TRACES = {
    "synthetic-job": (synthetic_job_trace, 2 / 3),  # several streams, NCCL overlapping computation, steps
    "operators": (synthetic_operator_trace, 1 / 2),  # operators open on two threads (the roofline's state)
    "overlapping-copies": (overlapping_copies_trace, 1 / 2),  # copies still running at the cut
    "queue-full": (queue_full_trace, 1 / 2),  # a queue's changes still buffered at the cut
}


def events_of(name: str, directory: Path) -> list[dict]:
    builder, _ = TRACES[name]
    return list(read_trace(builder(directory / f"{name}.json")).events)


def digest(events: list[dict]) -> str:
    """The events' fingerprint: a fixture is only meaningful for the trace it was cut from."""
    return hashlib.sha256(json.dumps(events, sort_keys=True).encode()).hexdigest()


def cut_of(name: str, events: list[dict]) -> int:
    return int(len(events) * TRACES[name][1])


def make() -> dict:  # pragma: no cover - run by hand, with the release whose checkpoints are kept
    from streams.traces.analyze import TraceAnalyzer

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in TRACES:
            events = events_of(name, Path(tmp))
            cut = cut_of(name, events)
            first = TraceAnalyzer()
            for e in events[:cut]:
                first.add(e)
            state = json.loads(json.dumps(first.to_state()))
            resumed = TraceAnalyzer.from_state(state)
            for e in events[cut:]:
                resumed.add(e)
            out[name] = {"events": digest(events), "cut": cut, "state": state,
                         "result": json.loads(json.dumps(resumed.result(GPU)))}
    return out


if __name__ == "__main__":  # pragma: no cover
    Path(sys.argv[1]).write_bytes(gzip.compress(json.dumps(make(), separators=(",", ":")).encode(), mtime=0))
