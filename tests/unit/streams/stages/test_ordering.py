"""The records a batch leads to are durable before the state that applied the batch reaches
its changelog: a new owner that restores a state skips what it applied, so a record not yet
durable would be lost (found by the fleet fault test: a worker killed while a windows
partition's leader was down). The window stage's commit waits for a batch in progress, then
flushes, then writes the states; the trace stage flushes before it writes its states."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import faust
import pytest

from schemas.codec import Codec
from schemas.sample_columns import columns_of
from streams.settings import StreamSettings
from streams.stages import state as stage_state
from streams.stages.io import BeforeCommit
from streams.stages.windows import WindowStage
from streams.windows.workflow_state import decode
from tests.support.samples import BASE_MS, sample


@pytest.fixture
def stage(monkeypatch):
    app = faust.App("test-stage-ordering", broker="kafka://127.0.0.1:1", store="memory://", autodiscover=False)
    stage = WindowStage(app, StreamSettings(bootstrap="127.0.0.1:1"), Codec())
    events: list[tuple] = []

    async def send(codec, topic, spec, record):
        events.append(("send", spec.name, record.get("window_start")))

    async def flush():
        events.append(("flush",))

    monkeypatch.setattr(stage_state, "send", send)
    monkeypatch.setattr(app.producer, "flush", flush)
    monkeypatch.setattr(stage.table, "send_changelog",
                        lambda partition, key, value, value_serializer=None: events.append(("state", key, value)))
    monkeypatch.setattr(stage.history, "send_changelog",
                        lambda partition, key, value, value_serializer=None: events.append(("history", key, value)))
    stage.events = events
    return stage


def messages(first_s: int, last_s: int, offset: int) -> list:
    codec = Codec()
    samples = [sample(event_time=BASE_MS + t * 1000) for t in range(first_s, last_s)]
    return [SimpleNamespace(value=codec.encode("GpuSampleColumns", b), offset=offset + i, partition=0, key=b"wf-a",
                            topic="gpufleet.gpu-samples.v1") for i, b in enumerate(columns_of(samples))]


def test_a_batch_sends_its_records_and_leaves_its_states_to_the_commit(stage):
    batch = messages(0, 80, offset=0)  # 80 s: the first window closes
    asyncio.run(stage._apply_samples(0, batch, now=BASE_MS + 90_000))
    assert [e[0] for e in stage.events] == ["send"] and stage.events[0][1].endswith("workflow-windows.v1")
    assert stage.state.dirty(stage.table) == {"wf-a": 0} and not stage.lock.locked()
    stage.state.save()
    stage.table.data["wf-a"].last_offset = 10_000  # a later batch: not in what was written
    (_, key, value), = [e for e in stage.events if e[0] == "state"]
    assert key == "wf-a" and decode(value).last_offset == len(batch) - 1
    assert [e for e in stage.events if e[0] == "history"]  # the closed window, kept for late samples


def test_the_commit_takes_the_states_between_batches_after_a_flush(stage, monkeypatch):
    """The consumer's commit (faust_fixes, fix 5) waits for a batch in progress, flushes the
    producer, takes the states and chooses the offsets, and lets the batches go on while it
    sends and commits them."""
    from streams import faust_fixes

    class Consumer:  # the parts of faust's consumer the commit uses
        app = stage.app

        def _filter_tps_with_pending_acks(self, topics):
            return ["tp"]

        def _filter_committable_offsets(self, tps):
            stage.events.append(("offsets chosen", stage.lock.locked()))
            return {"tp": 42}

        async def _handle_attached(self, offsets):
            pass

        async def _commit_offsets(self, offsets, start_new_transaction=True):
            stage.events.append(("committed", offsets, stage.lock.locked()))
            return True

        _transition = None

    stage.app.sensors.add(BeforeCommit(lambda: stage.events.append(("states taken",))))
    class WatchedLock(asyncio.Lock):
        """The stage's lock, telling when someone waits for it."""

        def __init__(self) -> None:
            super().__init__()
            self.awaited = asyncio.Event()

        async def acquire(self) -> bool:
            if self.locked():
                self.awaited.set()
            return await super().acquire()

    consumer = Consumer()
    consumer.diag = SimpleNamespace(set_flag=lambda flag: None, unset_flag=lambda flag: None)
    assert stage.app.gpufleet_commit_locks == [stage.lock]

    async def scenario():
        lock = stage.lock = WatchedLock()
        stage.app.gpufleet_commit_locks = [lock]
        async with lock:  # a batch between its first change and the last of its records
            waiting = asyncio.create_task(faust_fixes._force_commit_between_batches(consumer))
            awaited = asyncio.create_task(lock.awaited.wait())
            await asyncio.wait({waiting, awaited}, return_when=asyncio.FIRST_COMPLETED)
            assert awaited.done() and not waiting.done()  # the commit waits at the lock
            stage.events.append(("batch sent",))
        assert await waiting is True

    asyncio.run(scenario())
    assert stage.events == [("batch sent",), ("flush",), ("states taken",), ("offsets chosen", True),
                            ("committed", {"tp": 42}, False)]


def test_a_batch_without_records_writes_its_state_without_a_flush(stage):
    asyncio.run(stage._apply_samples(0, messages(0, 30, offset=0), now=BASE_MS + 40_000))
    assert [e[0] for e in stage.events] == []  # nothing closed: nothing sent, nothing to wait for
    assert stage.state.dirty(stage.table) == {"wf-a": 0}


def test_the_trace_stage_sends_its_analysis_before_the_state_that_says_the_trace_is_done(monkeypatch):
    from streams import faust_fixes
    from streams.stages.traces import TraceStage
    from streams.stages.window_step import Decoded
    from tests.support.kernel_events import end, kernel_events

    app = faust.App("test-trace-ordering", broker="kafka://127.0.0.1:1", store="memory://", autodiscover=False)
    stage = TraceStage(app, StreamSettings(bootstrap="127.0.0.1:1"), Codec())
    events: list[tuple] = []

    async def send(codec, topic, spec, record):
        events.append(("send", spec.name))

    async def flush():
        events.append(("flush",))

    monkeypatch.setattr(stage_state, "send", send)
    monkeypatch.setattr(app.producer, "flush", flush)
    writes = []

    def send_changelog(partition, key, value, **kwargs):
        events.append(("state", key, dict(value or {})))
        writes.append(asyncio.get_running_loop().create_future())
        writes[-1].set_result(None)
        return writes[-1]

    monkeypatch.setattr(stage.table, "send_changelog", send_changelog)

    async def a_batch_then_a_commit():
        async with stage.state.batch():
            batch = [Decoded(i, name, r) for i, (name, r) in enumerate(kernel_events() + [end()])]
            await stage.emit([], stage.step.events(0, batch, 10), 10)
        assert "state" not in [e[0] for e in events]  # the commit writes it
        assert await faust_fixes._force_commit_between_batches(CommittingConsumer(app, events)) is True

    asyncio.run(a_batch_then_a_commit())
    kinds = [e[0] for e in events]
    assert kinds.index("flush") < kinds.index("state") and "send" not in kinds[kinds.index("flush"):]
    assert [e for e in events if e[0] == "state"][-1][2]["done"] is True


class CommittingConsumer:
    """The parts of faust's consumer the commit (faust_fixes, fix 5) uses, recording what it does."""

    def __init__(self, app, events: list) -> None:
        self.app, self.events = app, events
        self.diag = SimpleNamespace(set_flag=lambda flag: None, unset_flag=lambda flag: None)
        self._transition = None

    def _filter_tps_with_pending_acks(self, topics):
        return ["tp"]

    def _filter_committable_offsets(self, tps):
        return {"tp": 42}

    async def _handle_attached(self, offsets):
        pass

    async def _commit_offsets(self, offsets, start_new_transaction=True):
        self.events.append(("committed", offsets))
        return True

    async def crash(self, exc):
        self.events.append(("crashed", str(exc)))


class Writes:
    """The stage's state writes as the producer hands them back: futures the test resolves (the
    broker's acknowledgement), with an event when the commit has written them and one when it
    waits on every one of them."""

    def __init__(self) -> None:
        self.futures: list[asyncio.Future] = []
        self.written, self.awaited = asyncio.Event(), asyncio.Event()


class Write(asyncio.Future):
    """One write's acknowledgement, telling ``writes`` when something waits on it."""

    def __init__(self, writes: Writes) -> None:
        super().__init__()
        self.writes, self.waited_on = writes, False

    def add_done_callback(self, fn, *, context=None) -> None:
        super().add_done_callback(fn, context=context)
        self.waited_on = True
        if all(getattr(f, "waited_on", False) for f in self.writes.futures):
            self.writes.awaited.set()


def writes_acknowledged_later(stage, monkeypatch) -> Writes:
    writes = Writes()

    def send_changelog(partition, key, value, value_serializer=None):
        fut = Write(writes)
        writes.futures.append(fut)
        writes.written.set()
        stage.events.append(("state", key))
        return fut

    monkeypatch.setattr(stage.table, "send_changelog", send_changelog)
    monkeypatch.setattr(stage.history, "send_changelog", send_changelog)
    return writes


async def a_batch_then_a_commit(stage, writes: Writes) -> asyncio.Task:
    """A batch that closes a window, then the consumer's commit (faust_fixes), run until it has
    written the states: the task of the commit, waiting on their acknowledgements."""
    from streams import faust_fixes

    # (the stage's state writes its changes when the commit starts: streams.stages.state)
    await stage._apply_samples(0, messages(0, 80, offset=0), now=BASE_MS + 90_000)
    commit = asyncio.create_task(faust_fixes._force_commit_between_batches(CommittingConsumer(stage.app,
                                                                                               stage.events)))
    await writes.written.wait()  # the commit writes the states
    return commit


def test_offsets_are_committed_only_once_the_states_before_them_are_durable(stage, monkeypatch):
    """A commit that went ahead of the state writes it follows, with the worker killed before
    the broker had them, would leave the new owner a state without samples the committed
    offsets had passed."""
    writes = writes_acknowledged_later(stage, monkeypatch)

    async def scenario():
        commit = await a_batch_then_a_commit(stage, writes)
        waiting = asyncio.ensure_future(writes.awaited.wait())  # the commit waits on every write it made ...
        await asyncio.wait({waiting, commit}, return_when=asyncio.FIRST_COMPLETED)  # ... or it went on
        assert waiting.done() and ("committed", {"tp": 42}) not in stage.events
        for fut in writes.futures:
            fut.set_result(None)
        assert await commit is True

    asyncio.run(scenario())
    kinds = [e[0] for e in stage.events]
    assert kinds.count("state") == 2 and kinds[-1] == "committed"


def test_a_state_write_that_failed_stops_the_commit_and_the_worker(stage, monkeypatch):
    """Offsets past a state that never reached its changelog would lose what the state held:
    the worker stops instead (its partitions go to a worker that reads on from the last
    durable state)."""
    writes = writes_acknowledged_later(stage, monkeypatch)
    futures = writes.futures

    async def scenario():
        commit = await a_batch_then_a_commit(stage, writes)
        futures[0].set_result(None)
        futures[1].set_exception(RuntimeError("the changelog's leader is gone"))
        assert await commit is False

    asyncio.run(scenario())
    kinds = [e[0] for e in stage.events]
    assert "committed" not in kinds and kinds[-1] == "crashed", stage.events


def test_the_scheduler_sends_its_requests_before_the_state_that_made_them_is_written(monkeypatch):
    """The profile scheduler's state says which workflows it asked to profile: written before
    the request is durable, a new owner restoring it would never ask again. Like every stage,
    its changes are written by the commit, after the producer's flush."""
    from streams.stages import profile_schedule as stage

    app = faust.App("test-schedule-ordering", broker="kafka://127.0.0.1:1", store="memory://", autodiscover=False)
    stage.register(app, StreamSettings(bootstrap="127.0.0.1:1"), Codec())
    events: list[tuple] = []

    async def send(codec, topic, spec, record):
        events.append(("send", spec.name, record.get("workflow_id")))

    monkeypatch.setattr(stage_state, "send", send)
    table = app.tables["profile-schedule"]
    monkeypatch.setattr(table, "send_changelog", lambda partition, key, value, **kw: events.append(("state", key)))
    codec = Codec()
    import time

    report = {"source_partition": 0, "at": int(time.time() * 1000), "running": ["wf-a"], "finished": []}
    message = SimpleNamespace(value=codec.encode("ScheduleReport", report), offset=0, partition=0, key=None,
                              topic="gpufleet.profile-schedule.v1")

    async def one_batch():
        async def batches():
            yield [SimpleNamespace(message=message)]

        agent = app.agents["profile-scheduler"]
        await agent.fun(SimpleNamespace(take_events=lambda n, within: batches()))

    asyncio.run(one_batch())
    assert events == [("send", "gpufleet.profile-requests.v1", "wf-a")]  # the state waits for the commit
    app.sensors.on_commit_initiated(None)
    assert events[1:] and {e[0] for e in events[1:]} == {"state"}
    assert ("state", "wf:wf-a") in events
