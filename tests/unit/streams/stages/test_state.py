"""The rule every stage's state keeps (``streams.stages.state``): changes and records inside a
batch only, states written by the commit, once per entry, and after a rebalance as last written."""

from __future__ import annotations

import asyncio

import faust
import pytest
from faust.types import TP
from faust.types.tuples import ConsumerMessage

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


class _Event:
    """A changelog record as faust's recovery hands it to a store."""

    def __init__(self, partition, key, value):
        self.key, self.value = key, value
        self.message = type("Message", (), {"partition": partition, "value": value})()


def restore(table, written):
    """What faust's recovery does with a table's changelog: each record applied over the
    entries in memory, through the store's own ``apply_changelog_batch``."""
    table.data.apply_changelog_batch([_Event(*w) for w in written], lambda k: k, lambda v: v)


def test_a_rebalance_leaves_the_tables_as_last_written_never_a_mix(state):
    """Faust re-reads a kept partition's changelog over the table in memory after a rebalance:
    entries written since are put back as written, entries never written stay as they are now.
    A state put back behind a window closed since (kept) counted the window's samples twice
    (the fleet fault test: 480 GPU-s for 240). After a revocation the tables hold nothing but
    what recovery restores, and recovery reads every changelog partition of theirs whole."""
    data = state.things.data
    changelog = state.things.changelog_topic.get_topic_name()
    recovery = state.app.tables.recovery
    recovery.active_offsets[TP(changelog, 3)] = 41  # where its last recovery ended
    other = TP("someone-elses-changelog", 3)
    recovery.active_offsets[other] = 7

    async def change(entries):
        async with state.batch():
            for key, value in entries.items():
                data[key] = value
                state.changed(state.things, key, value["partition"])

    asyncio.run(change({"wf-a": {"partition": 3, "applied": 100}}))
    state.app.sensors.on_commit_initiated(None)  # written
    asyncio.run(change({"wf-a": {"partition": 3, "applied": 160}, "wf-a@60": {"partition": 3, "closed": True}}))

    asyncio.run(state.app.on_partitions_revoked.send(set()))  # a rebalance; partition 3 stays here
    assert dict(data) == {} and state.dirty(state.things) == {}
    assert recovery.active_offsets.get(TP(changelog, 3)) is None  # read again from its first record
    assert recovery.active_offsets[other] == 7  # another stage's tables are its own
    restore(state.things, state.written)
    assert dict(data) == {"wf-a": {"partition": 3, "applied": 100}}  # as written: one whole state


def handed(app, topic: str, partition: int, offset: int):
    """A message as faust's consumer hands it to a stream (tracked: pending its ack)."""
    message = ConsumerMessage(topic, partition, offset, 0.0, 0, None, None, b"", None)
    app.consumer.track_message(message)
    return message


def test_offsets_acked_for_state_a_rebalance_forgot_are_never_committed(state):
    """Found by the soak (seed 29): faust drops a revoked partition's acked offsets before the
    batches in flight finish; a batch that finished after acked its messages again, the stage
    forgot its changes (never written), and where the partition stayed with the worker the next
    generation's first commit committed those offsets: recovery then skipped the batch's
    samples, and two windows were emitted again with 56 of 240 and 28 of 120 GPU-seconds."""
    app = state.app
    app.topics.add(app.topic("samples"))  # (a stream's topic: its messages are acked)
    asyncio.run(app.topics._update_indices())  # (as the conductor does when the worker starts)
    consumer = app.consumer
    tp = TP("samples", 3)
    first, late = [handed(app, "samples", 3, offset) for offset in (10, 11)]
    consumer._acked.pop(tp, None)  # what faust's revocation does first, batches still in flight

    async def in_flight():
        async with state.batch():
            state.things.data["wf-a"] = {"partition": 3, "applied": 10}
            state.changed(state.things, "wf-a", 3)
        first.ack(consumer)  # the batch done: acked after faust dropped the partition's acks

    asyncio.run(in_flight())
    assert consumer._acked[tp] == [10]  # (upstream: an ack is recorded whatever was revoked)
    asyncio.run(app.on_partitions_revoked.send({tp}))  # the stages forget what no commit wrote
    assert state.dirty(state.things) == {} and dict(state.things.data) == {}
    assert not consumer._acked.get(tp) and consumer._new_offset(tp) is None  # nothing to commit
    late.ack(consumer)  # handed over before the revocation, acked after it
    assert not consumer._acked.get(tp) and consumer._new_offset(tp) is None
    # The next generation's messages are acked and committed as always.
    handed(app, "samples", 3, 10).ack(consumer)
    assert consumer._acked[tp] == [10]
