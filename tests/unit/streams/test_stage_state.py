"""The rule every stage's state keeps (``streams.stages.state``): changes and records inside a
batch only, states written by the commit, once per entry, and dropped with their partitions."""

from __future__ import annotations

import asyncio

import faust
import pytest

from schemas.codec import Codec
from schemas.topics import ALERTS
from streams.stages import state as stage_state
from streams.stages.state import OutsideBatch, StageState


@pytest.fixture
def state(monkeypatch):
    app = faust.App("test-stage-state", broker="kafka://127.0.0.1:1", store="memory://", autodiscover=False)
    s = StageState(app, "test-stage", Codec())
    table = s.table(app.Table("things", default=None, partitions=8, key_type=str))
    written, sent = [], []
    monkeypatch.setattr(
        table, "send_changelog", lambda partition, key, value, **kw: written.append((partition, key, value))
    )

    async def send(codec, topic, spec, record):
        sent.append(record)

    monkeypatch.setattr(stage_state, "send", send)
    s.written, s.sent, s.things = written, sent, table
    return s


def test_a_stage_cannot_change_its_state_or_send_outside_a_batch(state):
    with pytest.raises(OutsideBatch, match="stage test-stage changed its state outside a batch"):
        state.changed(state.things, "a", 0)
    with pytest.raises(OutsideBatch, match="sent a record outside a batch"):
        asyncio.run(state.send(None, ALERTS, {"workflow_id": "wf"}))
    assert state.sent == [] and state.dirty(state.things) == {}


def test_the_commit_writes_each_changed_entry_once_with_its_value_then(state):
    async def batches():
        for n in range(3):
            async with state.batch():
                state.things.data["a"] = {"partition": 0, "n": n}
                state.changed(state.things, "a", 0)
                await state.send(None, ALERTS, {"workflow_id": "wf", "n": n})
        async with state.batch():
            del state.things.data["a"]
            state.things.data["b"] = {"partition": 3}
            state.changed(state.things, "b", 3)

    asyncio.run(batches())
    assert state.written == [] and len(state.sent) == 3  # nothing written before the commit
    state.app.sensors.on_commit_initiated(None)  # the commit: after its flush (faust_fixes, fix 5)
    assert state.written == [(0, "a", None), (3, "b", {"partition": 3})]  # as they are then: a deleted
    state.app.sensors.on_commit_initiated(None)
    assert len(state.written) == 2  # written once


def test_entries_of_partitions_owned_elsewhere_are_dropped_with_their_unsaved_changes(state):
    data = state.things.data
    data.update({"wf-a": {"partition": 0}, "wf-b": {"partition": 3}, "wf-c@1": {"partition": 3},
                 "wf-d": {"partition": 5}})

    async def change():
        async with state.batch():
            for key, p in (("wf-a", 0), ("wf-b", 3), ("wf-gone", 3)):
                state.changed(state.things, key, p)

    asyncio.run(change())
    assert state.drop({0, 5}) == 2
    assert dict(data) == {"wf-a": {"partition": 0}, "wf-d": {"partition": 5}}
    assert state.dirty(state.things) == {"wf-a": 0}
