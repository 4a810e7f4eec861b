"""The consumer commits past offsets that were acked twice (robinhood/faust#625), re-reads a
partition whose head never reached the stream instead of never committing again, and hands a
message to the streams without a race of four tasks when the delivery need not wait."""

import asyncio
import inspect
import re
import warnings
from collections import defaultdict

import pytest
from faust.tables.recovery import Recovery
from faust.transport.consumer import Consumer
from faust.types import TP
from mode import Service

from streams import faust_fixes

TOPIC_PARTITION = TP("gpu-samples.v1", 0)


@pytest.fixture(autouse=True)
def fixed():
    """Each test runs with the fixes applied, and Faust is as it was after it."""
    with faust_fixes.applied():
        yield


def test_revert_leaves_faust_as_it_was():
    names = ("_new_offset", "wait_first", "perform_seek", "_add_gap")
    faust_fixes.revert()
    before = {n: Consumer.__dict__.get(n) for n in names}
    assert Consumer.wait_first is Service.wait_first  # inherited, not the fix
    with faust_fixes.applied():
        assert Consumer._new_offset is faust_fixes._new_offset_fixed
    assert {n: Consumer.__dict__.get(n) for n in names} == before
    faust_fixes.apply()  # as the fixture expects to find it


class Offsets:
    """Just the state ``Consumer._new_offset`` reads, and ``seek``."""

    def __init__(self, committed, acked):
        self._committed_offset = {TOPIC_PARTITION: committed}
        self._acked = {TOPIC_PARTITION: list(acked)}
        self._acked_index = {TOPIC_PARTITION: set(acked)}
        self._gap = defaultdict(lambda: None)
        self.seeks = []

    async def seek(self, tp, offset):
        self.seeks.append((tp, offset))


def test_duplicated_acks_no_longer_hold_the_commit_back():
    acked = [744, 745, 745, 746, 746, 747, 747]  # as seen after a restart: every message twice
    assert faust_fixes._original_new_offset(Offsets(744, acked), TOPIC_PARTITION) == 746  # faust: 2 at a time
    assert Consumer._new_offset is faust_fixes._new_offset_fixed
    assert Consumer._new_offset(Offsets(744, acked), TOPIC_PARTITION) == 748


def test_gaps_still_hold_the_commit_back():
    assert Consumer._new_offset(Offsets(9, [10, 11, 11, 13]), TOPIC_PARTITION) == 12


async def commits(consumer, n):
    out = []
    for _ in range(n):
        out.append(Consumer._new_offset(consumer, TOPIC_PARTITION))
        await asyncio.sleep(0)  # the re-read, if one was asked for, runs here
    return out


def test_a_head_that_never_arrives_is_read_again_after_some_commits():
    consumer = Offsets(748, range(751, 1600))  # 748..750 were dropped: faust waits for them for ever
    assert asyncio.run(commits(consumer, faust_fixes.STALLED_COMMITS - 1)) == [None] * (faust_fixes.STALLED_COMMITS - 1)
    assert consumer.seeks == []
    assert asyncio.run(commits(consumer, 1)) == [None]
    assert consumer.seeks == [(TOPIC_PARTITION, 748)]
    # Read again, the missing messages are acked and the commit goes on.
    consumer._acked[TOPIC_PARTITION] += [748, 749, 750]
    assert asyncio.run(commits(consumer, 1)) == [1600]


def test_a_head_that_arrives_in_time_is_not_read_again():
    consumer = Offsets(748, range(751, 800))
    asyncio.run(commits(consumer, faust_fixes.STALLED_COMMITS - 1))
    consumer._acked[TOPIC_PARTITION] += [748, 749, 750]
    assert asyncio.run(commits(consumer, 1)) == [800]
    consumer._committed_offset[TOPIC_PARTITION] = 800  # as the commit leaves it
    consumer._acked[TOPIC_PARTITION] += list(range(802, 900))  # a new gap starts its own count
    asyncio.run(commits(consumer, faust_fixes.STALLED_COMMITS - 1))
    assert consumer.seeks == []


class DrainLoop(Service):
    """What the fast ``wait_first`` reads of the consumer: its flow and its stop."""

    flow_active = True
    wait_first = faust_fixes._wait_first_fast


async def deliver(queue: asyncio.Queue, item) -> str:
    await queue.put(item)  # waits while the stream's buffer is full, as faust's delivery does
    return f"delivered {item}"


async def race(loop: DrainLoop, queue: asyncio.Queue, item, suspend_flow: asyncio.Event):
    return await loop.wait_first(deliver(queue, item), suspend_flow.wait())


def test_a_delivery_with_room_in_the_buffer_runs_in_place_without_tasks():
    async def scenario():
        loop = DrainLoop()
        queue = asyncio.Queue(maxsize=10)
        results = [await race(loop, queue, i, asyncio.Event()) for i in range(5)]
        return results, [queue.get_nowait() for _ in range(5)]

    created = []

    async def main():
        asyncio.get_running_loop().set_task_factory(
            lambda loop, coro, **kw: created.append(coro) or asyncio.Task(coro, loop=loop, **kw))
        outcome = await scenario()
        return outcome, list(created)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the unused suspend_flow.wait() is closed, not left un-awaited
        (results, delivered), created = asyncio.run(main())
    assert [r.results for r in results] == [[f"delivered {i}"] for i in range(5)]
    assert delivered == [0, 1, 2, 3, 4]
    assert created == []  # faust's race would have made four tasks per message


def test_a_delivery_that_waits_finishes_once_the_buffer_has_room():
    async def scenario():
        loop = DrainLoop()
        queue = asyncio.Queue(maxsize=1)
        await race(loop, queue, "first", asyncio.Event())
        pending = asyncio.ensure_future(race(loop, queue, "second", asyncio.Event()))
        await asyncio.sleep(0.01)
        assert not pending.done()  # the buffer is full: the delivery waits
        assert queue.get_nowait() == "first"
        result = await asyncio.wait_for(pending, 1)
        return result, queue.get_nowait()

    result, second = asyncio.run(scenario())
    assert result.results == ["delivered second"] and not result.stopped
    assert second == "second"


def test_a_delivery_that_waits_is_abandoned_when_the_flow_stops():
    async def scenario():
        loop = DrainLoop()
        queue = asyncio.Queue(maxsize=1)
        suspend_flow = asyncio.Event()
        await race(loop, queue, "first", suspend_flow)
        pending = asyncio.ensure_future(race(loop, queue, "second", suspend_flow))
        await asyncio.sleep(0.01)
        suspend_flow.set()  # a rebalance
        result = await asyncio.wait_for(pending, 1)
        return result, queue

    result, queue = asyncio.run(scenario())
    assert result.results == [True]  # the flow stop won the race
    assert queue.get_nowait() == "first" and queue.empty()  # "second" was never put


def test_an_error_in_the_delivery_reaches_the_drain_loop():
    async def failing():
        raise ValueError("cannot decode")

    async def scenario():
        return await DrainLoop().wait_first(failing(), asyncio.Event().wait())

    with pytest.raises(ValueError, match="cannot decode"):
        asyncio.run(scenario())


def test_fix_is_installed_on_the_consumer():
    assert Consumer.wait_first is faust_fixes._wait_first_fast


def test_faust_still_hands_messages_over_as_the_fix_expects():
    """The fix relies on the drain loop racing ``callback(message)`` against the flow stop and
    on the consumer using ``wait_first`` nowhere else; a faust release that changes either
    must be looked at again before it is allowed in pyproject.toml."""
    drain = inspect.getsource(Consumer._drain_messages)
    race = r"self\.wait_first\(\s*callback\(message\),\s*self\.suspend_flow\.wait\(\)\s*\)"
    assert len(re.findall(race, drain)) == 1
    consumer_module = inspect.getsource(inspect.getmodule(Consumer))
    assert len(re.findall(r"\.wait_first\(", consumer_module)) == 1
    # Recovery resumes the flow after every seek to committed offsets (the flow stops for it).
    recovery = inspect.getsource(Recovery)
    after_seek = r"perform_seek\(\).*?\n(.*?\n){0,6}.*?flow_control\.resume\(\)\s+consumer\.resume_flow\(\)"
    assert len(re.findall(r"perform_seek\(", recovery)) == len(re.findall(after_seek, recovery)) == 2


class Seeking:
    """What ``perform_seek`` touches: the flow, and the client's seek to committed offsets."""

    def __init__(self, flow_active=True):
        self.flow_active = flow_active
        self.calls = []
        self._read_offset = {TOPIC_PARTITION: 799}
        self._committed_offset = {}

    def stop_flow(self):
        self.calls.append("stop_flow")
        self.flow_active = False

    async def seek_to_committed(self):
        self.calls.append(f"seek_to_committed (flow {'running' if self.flow_active else 'stopped'})")
        return {TOPIC_PARTITION: 360}


def test_the_flow_stops_before_stream_partitions_are_sought_to_their_committed_offsets():
    consumer = Seeking()
    asyncio.run(Consumer.perform_seek(consumer))
    assert consumer.calls == ["stop_flow", "seek_to_committed (flow stopped)"]
    assert consumer._read_offset == {TOPIC_PARTITION: 360}  # faust's own part still runs
    stopped = Seeking(flow_active=False)  # faust's own call, from a fetch that came in stopped
    asyncio.run(Consumer.perform_seek(stopped))
    assert stopped.calls == ["seek_to_committed (flow stopped)"]


class NeverCommitted(Seeking):
    """A stream partition no offset was ever committed for (a new deployment's first
    assignment), with a changelog partition beside it, and the messages fetched for the stream
    partition during the recovery: handed to the stream buffers, which recovery clears after
    this seek."""

    def __init__(self):
        super().__init__()
        self.changelog = TP("app-window-state-changelog", 0)
        self.app = type("App", (), {"tables": type("Tables", (), {"changelog_topics": {self.changelog.topic}})})()
        self.position = {TOPIC_PARTITION: 120, self.changelog: 40}  # where the client's fetches got to

    async def seek_to_committed(self):
        self.calls.append("seek_to_committed")
        return {TOPIC_PARTITION: None, self.changelog: None}  # the client seeks neither (offset 0 or none)

    async def earliest_offsets(self, *tps):
        return {tp: 0 for tp in tps}

    async def _seek(self, tp, offset):
        self.position[tp] = offset


def test_a_partition_never_committed_is_read_from_its_first_offset_after_a_recovery():
    """The messages fetched during a recovery are cleared with the stream buffers and read
    again from where the partition is sought; a partition with no committed offset was not
    sought at all, and its first 2 or 3 ticks of samples were never read (the first window of
    one workflow in the fleet fault test, in CI and here under load). It is now sought to its
    first offset, and the window stage takes its messages in order from there."""
    consumer = NeverCommitted()
    asyncio.run(Consumer.perform_seek(consumer))
    assert consumer.position == {TOPIC_PARTITION: 0, consumer.changelog: 40}  # recovery seeks changelogs itself
    assert faust_fixes.start_offset(consumer, TOPIC_PARTITION) == 0
    consumer._committed_offset[TOPIC_PARTITION] = 360  # once a commit happened, from there
    assert faust_fixes.start_offset(consumer, TOPIC_PARTITION) == 360


class Gaps:
    """What ``_add_gap`` touches."""

    def __init__(self):
        from intervaltree import IntervalTree

        self._committed_offset = {TOPIC_PARTITION: 602, TP("compacted.v1", 0): 10}
        self._gap = defaultdict(IntervalTree)


def test_a_jump_in_a_contiguous_topic_is_not_recorded_as_a_gap_the_commit_may_pass():
    consumer = Gaps()
    faust_fixes.CONTIGUOUS.add(TOPIC_PARTITION.topic)
    try:
        asyncio.run(Consumer._add_gap(consumer, TOPIC_PARTITION, 603, 1260))
        asyncio.run(Consumer._add_gap(consumer, TP("compacted.v1", 0), 11, 20))
    finally:
        faust_fixes.CONTIGUOUS.discard(TOPIC_PARTITION.topic)
    assert not consumer._gap[TOPIC_PARTITION]  # the commit cannot pass 603..1259
    assert sorted((i.begin, i.end) for i in consumer._gap[TP("compacted.v1", 0)]) == [(11, 21)]  # faust's own
    # And the drain loop still records a jump as a gap through _add_gap only.
    drain = inspect.getsource(Consumer._drain_messages)
    assert len(re.findall(r"await self\._add_gap\(tp, r_offset \+ 1, offset\)", drain)) == 1


# Canaries: each patched method of faust as it is still needs its fix. A release that fixes one
# upstream makes its canary fail: the fix can then go (docs/upgrading-faust.md).

def test_canary_new_offset_upstream_still_advances_two_at_a_time_over_duplicated_acks():
    acked = [744, 745, 745, 746, 746, 747, 747]
    assert faust_fixes._original_new_offset(Offsets(744, acked), TOPIC_PARTITION) == 746  # not 748


def test_canary_perform_seek_upstream_still_seeks_with_the_flow_running_and_skips_never_committed():
    upstream = faust_fixes._DEFINED["perform_seek"]
    seeking = Seeking()
    seeking.seek_to_committed = lambda: _committed({TOPIC_PARTITION: 360, TP("gpu-samples.v1", 1): None})
    asyncio.run(upstream(seeking))
    assert seeking.flow_active and "stop_flow" not in seeking.calls  # fix 3: the flow is not stopped
    assert not hasattr(seeking, "seeks")  # fix 7: a partition never committed is not sought anywhere


async def _committed(offsets):
    return offsets


def test_canary_add_gap_upstream_still_records_any_jump_as_a_gap():
    from intervaltree import IntervalTree

    class Gaps:
        def __init__(self):
            self._gap = defaultdict(IntervalTree)
            self._committed_offset = {TOPIC_PARTITION: 100}

    gaps = Gaps()
    asyncio.run(faust_fixes._original_add_gap(gaps, TOPIC_PARTITION, 101, 150))
    assert len(gaps._gap[TOPIC_PARTITION]) == 1  # a jump taken for a gap the commit may pass (fix 4)


class Reading:
    """Just what ``Consumer._wait_next_records`` reads: the partitions read now, and the fetch."""

    flow_active = True

    def __init__(self, *tps):
        self.live = set(tps)
        self.app = type("App", (), {"client_only": False})()
        self.not_waiting_next_records = asyncio.Event()
        self.asked = None

    def _get_active_partitions(self):
        return self.live

    async def _getmany(self, active_partitions, timeout):
        self.asked = active_partitions
        return {}


def test_the_client_is_never_asked_for_every_partition_when_faust_reads_none():
    """Fix 9: the client looks at what it was given when records come; faust's set, emptied
    meanwhile by a rebalance, must not read to it as every partition."""
    other = TP("worker-window-history-changelog", 4)
    reading = Reading(TOPIC_PARTITION)
    records, active = asyncio.run(Consumer._wait_next_records(reading, 1.0))
    assert records == {} and active is reading.live  # faust's own check on what it yields is unchanged
    wanted = reading.asked
    assert TOPIC_PARTITION in wanted and other not in wanted
    reading.live.clear()  # the rebalance pauses everything while the fetch waits
    assert wanted and TOPIC_PARTITION not in wanted and other not in wanted
    reading.live.add(other)  # recovery resumes a changelog: wanted from then on
    assert other in wanted


def test_canary_wait_next_records_upstream_still_hands_the_client_its_live_set():
    """faust gives the client the set it pauses and resumes in place, and the client takes an
    empty set for every partition (fix 9)."""
    from aiokafka.consumer.fetcher import Fetcher

    reading = Reading(TOPIC_PARTITION)
    asyncio.run(faust_fixes._DEFINED["_wait_next_records"](reading, 1.0))
    assert reading.asked is reading.live
    assert "if partitions and tp not in partitions:" in inspect.getsource(Fetcher.fetched_records)


def test_canary_force_commit_upstream_still_takes_the_states_before_any_flush_or_lock():
    """faust's commit starts the state sensors first, with no lock taken and no flush: a state
    written then can run ahead of the records of a batch in progress (fixes 5 and 6)."""
    upstream = inspect.getsource(faust_fixes._DEFINED["force_commit"])
    body = upstream.split('"""Force offset commit."""', 1)[1]
    first = body.strip().splitlines()[0]
    assert first.startswith("sensor_state = self.app.sensors.on_commit_initiated(self)")
    assert "flush" not in body and "lock" not in body and "state_writes" not in body


def test_every_patched_method_has_a_canary():
    canaries = {
        "_new_offset": test_canary_new_offset_upstream_still_advances_two_at_a_time_over_duplicated_acks,
        "perform_seek": test_canary_perform_seek_upstream_still_seeks_with_the_flow_running_and_skips_never_committed,
        "_add_gap": test_canary_add_gap_upstream_still_records_any_jump_as_a_gap,
        "force_commit": test_canary_force_commit_upstream_still_takes_the_states_before_any_flush_or_lock,
        "wait_first": test_faust_still_hands_messages_over_as_the_fix_expects,
        "_wait_next_records": test_canary_wait_next_records_upstream_still_hands_the_client_its_live_set,
    }
    assert set(canaries) == set(faust_fixes._PATCHES)
