"""The per-workflow state as a declared type, written to its changelog versioned: a state the
previous release wrote (tests/data/window-state-v0.json, made by that release's code) is read
back and the workflow goes on as if the worker had never been upgraded."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from faust.serializers import codecs

from schemas.goodput_buckets import JOULES_FIELDS, SECONDS_FIELDS
from schemas.sample_columns import columns_of
from streams.stages.window_table import STATE_CODEC
from streams.windows import workflow_state
from streams.windows.batches import Incoming, WindowConfig
from streams.windows.utilization import WindowAggregator
from streams.windows.workflow_state import STATE_VERSION, StateError, WorkflowState
from tests.support.samples import BASE_MS, sample

V0 = json.loads((Path(__file__).resolve().parents[3] / "data" / "window-state-v0.json").read_text())


def samples(start_s: int, end_s: int) -> list[dict]:
    """What the previous release's state was built from (t < 150 s), and what came after."""
    return [sample(workflow_id=wf, gpu_index=g, gpu_uuid=f"{wf}-{g}", event_time=BASE_MS + t * 1000,
                   utilization_pct=float((7 * t + 13 * g) % 40))
            for t in range(start_s, end_s) for wf in ("wf-a", "wf-b") for g in range(2)]


def test_a_state_the_previous_release_wrote_is_read_with_every_field():
    raw = V0["store"]["wf-a"]
    state = codecs.loads(STATE_CODEC, json.dumps(raw).encode())  # as Faust's json codec wrote it
    assert isinstance(state, WorkflowState)
    assert msgspec.structs.asdict(state) | raw == msgspec.structs.asdict(state)  # nothing lost or changed
    assert state.hosts == ["gpu-host-000"] and state.job["windows"] == 2 and state.windows
    assert codecs.loads(STATE_CODEC, json.dumps(V0["store"]["wf-b"]).encode()).ending is True


def test_after_the_upgrade_the_workflows_go_on_as_if_nothing_happened():
    reference = WindowAggregator(WindowConfig(), {}, {})
    blocks = columns_of(samples(0, 300))
    expected = reference.process(0, [Incoming(i, b) for i, b in enumerate(blocks)], closed_at=0).closed

    store = {wf: codecs.loads(STATE_CODEC, json.dumps(raw).encode()) for wf, raw in V0["store"].items()}
    upgraded = WindowAggregator(WindowConfig(), store, dict(V0["history"]))
    first = V0["samples_through_offset"] + 1
    later = columns_of(samples(150, 300))
    closed = upgraded.process(0, [Incoming(first + i, b) for i, b in enumerate(later)], closed_at=0).closed
    assert len(closed) == 2 * 2
    for got, want in zip(closed, expected[-len(closed):]):  # the windows from 120 s on, alike
        if got["window_start"] >= BASE_MS + 150_000:
            assert got == want
            continue
        # Open at the upgrade: the previous release kept no goodput, so the buckets hold the
        # samples from the upgrade on (30 s of 2 GPUs); the rest of the window is alike.
        goodput = (*SECONDS_FIELDS, *JOULES_FIELDS)
        assert {k: v for k, v in got.items() if k not in goodput} == {
            k: v for k, v in want.items() if k not in goodput}
        assert sum(got[k] for k in SECONDS_FIELDS) == pytest.approx(60.0)
    # A replay of what the previous release applied is still recognised as one.
    assert upgraded.process(0, [Incoming(0, columns_of(samples(0, 1))[0])], closed_at=0).replayed == 2


def test_written_now_it_is_versioned_and_round_trips():
    state = codecs.loads(STATE_CODEC, json.dumps(V0["store"]["wf-a"]).encode())
    data = codecs.dumps(STATE_CODEC, state)
    assert json.loads(data)["v"] == STATE_VERSION
    assert codecs.loads(STATE_CODEC, data) == state
    assert codecs.dumps(STATE_CODEC, None) == b"null" and codecs.loads(STATE_CODEC, b"null") is None  # deleted


@pytest.mark.parametrize("data, says", [
    (b'{"v": 99, "state": {"partition": 0}}', "version 99; this release reads 0 to 1"),
    (b'{"partition": "zero"}', "not a workflow state"),
    (b"[1, 2]", "not a workflow state: a list"),
    (b"\xff", "not a workflow state"),
])
def test_what_is_no_state_of_a_known_version_says_so(data, says):
    with pytest.raises(StateError, match=says):
        workflow_state.decode(data)


def test_the_window_state_table_and_its_changelog_use_the_versioned_codec():
    """Found by the restart test: a serializer set after the table was made did not reach its
    changelog topic, and restored states came back as plain dicts."""
    import faust

    from schemas.codec import Codec
    from streams.settings import StreamSettings
    from streams.stages.windows import WindowStage

    app = faust.App("test-workflow-state", broker="kafka://127.0.0.1:1", store="memory://", autodiscover=False)
    stage = WindowStage(app, StreamSettings(bootstrap="127.0.0.1:1"), Codec())
    assert stage.table.value_serializer == stage.table.changelog_topic.value_serializer == STATE_CODEC
    assert stage.table.data.value_serializer == STATE_CODEC
