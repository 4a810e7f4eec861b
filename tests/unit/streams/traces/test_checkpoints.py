"""Checkpoints of trace sessions written by the release before the analyser protocol restore
unchanged: each resumed and fed the rest of its trace gives the result that release gave."""

import gzip
import json
from pathlib import Path

import pytest

from streams.traces.analyze import TraceAnalyzer
from tests.support.trace_checkpoints import GPU, TRACES, cut_of, digest, events_of

FIXTURE = Path(__file__).parents[3] / "data" / "trace-checkpoints-v1.json.gz"


@pytest.fixture(scope="module")
def checkpoints() -> dict:
    return json.loads(gzip.decompress(FIXTURE.read_bytes()))


@pytest.mark.parametrize("name", list(TRACES))
def test_a_checkpoint_of_the_last_release_resumes_to_its_result(tmp_path, checkpoints, name):
    stored = checkpoints[name]
    events = events_of(name, tmp_path)
    assert digest(events) == stored["events"], "the trace builder changed: the fixture no longer fits its trace"
    cut = cut_of(name, events)
    assert cut == stored["cut"]
    resumed = TraceAnalyzer.from_state(stored["state"])
    for e in events[cut:]:
        resumed.add(e)
    assert json.loads(json.dumps(resumed.result(GPU))) == stored["result"]
