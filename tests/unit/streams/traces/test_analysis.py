"""Every analysis of ``ANALYSES`` keeps the protocol of ``streams.traces.analysis``: it can be
made, fed batches of columns, checkpointed and restored on its own, and its part of the
checkpoint is its own."""

import json

import pytest

from producers.traces.read import read_trace
from streams.traces.analysis import Finished, Options
from streams.traces.analyze import ANALYSES, TraceAnalyzer
from streams.traces.batch import EventBatch
from tests.support.traces import synthetic_job_trace, synthetic_operator_trace

OPTIONS = Options(horizon_us=10_000_000)
CORE_KEYS = {"counters", "calls", "horizon"}


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> list[dict]:
    """A trace with every kind of state: streams, NCCL, steps, copies, operators on two threads."""
    tmp = tmp_path_factory.mktemp("t")
    job = list(read_trace(synthetic_job_trace(tmp / "job.json")).events)
    ops = list(read_trace(synthetic_operator_trace(tmp / "ops.json")).events)
    shift = job[-1]["end"] + 1_000 - ops[0]["ts"]  # the operators' trace after the job's
    return job + [{**e, "ts": e["ts"] + shift, "end": e["end"] + shift,
                   "correlation": e["correlation"] + 10_000_000 if e["correlation"] >= 0 else -1} for e in ops]


@pytest.mark.parametrize("cls", ANALYSES, ids=lambda c: c.__name__)
def test_an_analysis_restored_mid_trace_gives_what_it_gives_fed_whole(events, cls):
    cut = len(events) * 3 // 5
    whole = TraceAnalyzer()
    whole.add_events(events, size=500)
    first = TraceAnalyzer()
    first.add_events(events[:cut], size=333)
    own = first.analyses[cls].to_state()
    assert own and CORE_KEYS.isdisjoint(own), f"{cls.__name__} owns no checkpoint key, or one of the analyzer's"
    state = {**first.to_state(), **json.loads(json.dumps(own))}
    resumed = TraceAnalyzer.from_state(state)
    resumed.analyses[cls] = cls.from_state(json.loads(json.dumps(own)), OPTIONS)
    resumed._wire()
    resumed.add_events(events[cut:], size=777)
    finished = Finished("NVIDIA H100 80GB HBM3", whole.analyses)
    got = resumed.analyses[cls].result(Finished("NVIDIA H100 80GB HBM3", resumed.analyses))
    assert got == whole.analyses[cls].result(finished) and got


def test_the_analyses_own_disjoint_parts_of_the_checkpoint(events):
    a = TraceAnalyzer()
    a.add_events(events)
    owned = [set(analysis.to_state()) for analysis in a.analyses.values()]
    every = set().union(*owned)
    assert sum(map(len, owned)) == len(every), "two analyses write the same checkpoint key"
    assert set(a.to_state()) == every | CORE_KEYS


def test_the_result_does_not_depend_on_how_the_events_are_batched(events):
    results = []
    for size in (1, 7, 4096):
        a = TraceAnalyzer()
        a.add_events(events, size=size)
        results.append(a.result("NVIDIA H100 80GB HBM3"))
    assert results[0] == results[1] == results[2]
    assert results[0]["operators"] and results[0]["collectives"] and results[0]["steps"]


def test_an_analysis_reads_columns_not_event_objects(events):
    """A batch made from columns (as ``gpufleet analyze`` and the worker make them) gives the
    result a batch made from event dicts gives."""
    from_dicts = TraceAnalyzer()
    from_dicts.add_events(events)
    from_columns = TraceAnalyzer()
    keys = ("kind", "cat", "name", "ts", "dur", "stream", "device", "correlation", "tid")
    extras = {i: {k: e[k] for k in ("bytes", "bandwidth_gbps", "memcpy_kind", "trace_order", "flops", "precision",
                                   "op_bytes") if e.get(k) is not None} for i, e in enumerate(events)}
    from_columns.add_batch(EventBatch(*([e[k] for e in events] for k in keys), {i: x for i, x in extras.items() if x}))
    assert from_columns.result() == from_dicts.result()
