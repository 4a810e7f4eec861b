"""Fixes for faust-streaming 0.15.3 that the worker cannot run without.

After a restart the worker's consumer can be handed a partition's messages twice (a race
between changelog recovery and fetching: faust-streaming/faust#596, #221). Two things then
go wrong in ``Consumer._new_offset``, which commits the first run of *consecutive* acked
offsets:

1. Both copies are acked, so the acked offsets hold duplicates and the committed offset
   advances by one message per commit (robinhood/faust#625): they are removed before faust
   looks (the second copies are harmless: a state skips what it applied already).
2. Where the two copies interleave, the consumer drops messages below the highest offset it
   has handed out as copies: a few offsets are never acked and the commit stops at the first
   for good (one restart in two in tests/integration/test_alert_restart.py). When the head of
   a partition's acked offsets has stayed out of reach for ``STALLED_COMMITS`` commits, the
   partition is read again from its committed offset (what was applied is skipped as a replay).
3. At the end of a recovery faust resumes the stream partitions with the flow running, seeks
   them to their committed offsets, and only then clears the streams' buffers. Messages
   fetched and handed to the streams meanwhile (from the committed offset on: the seek has
   happened in the Kafka client) are thrown away with the buffers, while the client's
   position has passed them: they are never read again, nothing of theirs is acked, and the
   partition's lag never drains (test_worker_restart.py, 2 runs in 5 once messages were
   handed over faster, below). The flow is now stopped before the seek, so nothing is handed
   over between the seek and the clearing; faust resumes it after.

4. When the fetcher hands over a message whose offset jumps ahead of the last one read (a
   fetch issued before a seek, landing after it), faust takes the jump for a legitimate gap
   (compaction, transaction markers), records it, and later commits past it: the messages in
   the jump are never processed nor read again (a restarted worker lost a stretch of samples
   under the fleet fault test). On topics registered in ``CONTIGUOUS`` (not compacted, no
   transactions: their offsets have no gaps) no gap is recorded; the stream that reads them
   (``streams.stages.in_order``) seeks back to the first missing offset and applies messages only
   in order, and the commit never passes an offset that was not processed.

5. The commit writes state before it commits offsets (``streams.stages.io.BeforeCommit``),
   but its timer fires also in the middle of a stage's batch, between the batch's changes to a
   state and the delivery of their records: a new owner restoring that state after a crash
   skips the batch, and its records never reach their topics (the fleet fault test lost a
   re-emitted window so). The commit now first takes the locks the stages register on the app
   (``app.gpufleet_commit_locks``), each held by a batch from its first change of a state until
   its records are sent, then flushes the producer, then takes the states (encoded then:
   ``on_commit_initiated``) and chooses the offsets; the batches go on while those are sent.

6. Faust commits offsets as soon as it has chosen them, while the table changes written
   before them (``send_changelog``: queued in the producer's buffer) may not have reached the
   broker: a worker killed then leaves committed offsets past a lost state. Every table write
   of the stages is kept (``state_writes``); the commit commits only once the broker has
   acknowledged each one issued before it chose its offsets. One that failed stops the worker
   without committing: its partitions go to a worker that reads on from the last durable state.

7. A stream partition that no offset was ever committed for (every partition of a new
   deployment) is not sought at the end of a recovery: the client seeks only to committed
   offsets above 0. The messages fetched for it meanwhile are cleared with the stream
   buffers (3.) while the client's position has passed them, and the commits that follow
   start after them: the first ticks of a new topic were never read (the fleet fault test,
   in CI and here under load: the first window of one workflow short of 8 or 12 GPU-seconds).
   Such a partition is now sought to its first offset, and ``start_offset`` tells the window
   stage where its messages start, so that it takes them in order from there.

8. At a rebalance recovery reads each changelog partition a worker keeps from where its last
   recovery ended, over the table in memory: entries written since come back as written, those
   never written (a window closed since the last commit) stay. After a revocation whose commit
   could not write (a killed broker), such a mix counted a window's samples twice (the fleet
   fault test: 480 GPU-s for 240). The stages empty their tables at each revocation
   (``streams.stages.state``); ``recover_whole`` has their changelogs read whole.

9. Faust asks the Kafka client for the records of the partitions it reads now, and hands it
   its own live set of them, which the client looks at when records come, up to a second
   later; meanwhile a rebalance may have paused them all, and to the client an empty set
   means every partition. Records of paused changelog partitions, fetched again after
   recovery sought them to their start, were then taken from the client, found while the
   flow was stopped and dropped: the client's position stood at their end, and recovery
   waited for them for good, committing nothing (a worker joining: once in about five full
   test runs, in tests/integration/test_many_workers.py; at the first join of a loop of joins
   and leaves under load).
   The client is now given a view of the set that is never empty to it: when faust reads
   no partition, the client hands over no record.

10. Faust drops a revoked partition's acked offsets before the batches in flight finish; those
   ack after it, and their offsets are committed at the next generation where the partition
   stays. The stages forget at each revocation what no commit wrote (8.), so those commits
   passed states never written: the next recovery skipped the batch's samples (the soak, seed
   29: two windows re-emitted with 56 and 28 of 240 and 120 GPU-s). At each revocation, after
   the stages forgot, ``forget_acks`` drops every acked offset not committed and makes the
   messages handed over before it ack nothing: they are read again from the last commit.

And one for speed: the consumer's drain loop hands each message to the streams inside
``Service.wait_first(deliver, suspend_flow.wait())``, a race that lets a rebalance stop a
delivery waiting on a full stream buffer. The race costs four tasks and an ``asyncio.wait``
per message, 83 us measured here: more than decoding the message's samples. Most deliveries
never wait (the buffer has room), and those need no race: the delivery is run a first step
in place, and only one that has to wait goes on inside the race, as before.
"""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager

from faust.exceptions import ProducerSendError
from faust.transport.consumer import CONSUMER_COMMITTING, Consumer, ensure_TP
from faust.types.tuples import ack_lock
from mode import Service
from mode.services import WaitResults

from streams.faust_fixes.review import UPGRADING, NotAsReviewed, differences

log = logging.getLogger(__name__)

STALLED_COMMITS = 3
_original_new_offset = Consumer._new_offset
_rereads: set = set()  # keeps the re-read tasks alive until they finish


def _new_offset_fixed(self, tp):
    acked = self._acked[tp]
    if len(acked) > 1:
        unique = sorted(set(acked))
        if len(unique) != len(acked):
            acked[:] = unique
    offset = _original_new_offset(self, tp)
    committed = self._committed_offset[tp]
    # tp -> commits in a row with the head out of reach, kept on the consumer
    stalled = self.__dict__.setdefault("_gpufleet_stalled", {})
    if offset is None and acked and committed is not None and min(acked) - committed > 1:
        stalled[tp] = stalled.get(tp, 0) + 1
        if stalled[tp] >= STALLED_COMMITS:
            del stalled[tp]
            log.warning("%s[%d]: offsets %d..%d never reached the stream while later ones were "
                        "processed; reading the partition again from %d", tp.topic, tp.partition,
                        committed, min(acked) - 1, committed)
            task = asyncio.ensure_future(self.seek(tp, committed))
            _rereads.add(task)
            task.add_done_callback(_rereads.discard)
    else:
        stalled.pop(tp, None)
    return offset


_original_wait_first = Service.wait_first  # the consumer's own: it does not override it


@types.coroutine
def _resumed(coro, step):
    """Drives ``coro`` on from where its first ``send`` stopped, having yielded ``step``."""
    while True:
        try:
            sent = yield step
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # noqa: BLE001 -- thrown in by the task (a cancellation): passed on
            try:
                step = coro.throw(exc)
            except StopIteration as done:
                return done.value
        else:
            try:
                step = coro.send(sent)
            except StopIteration as done:
                return done.value


async def _rest_of(coro, step):
    return await _resumed(coro, step)


async def _wait_first_fast(self, *coros, timeout=None):
    """``wait_first`` for the drain loop's race of a delivery against a flow stop, without
    the race when the delivery completes at once."""
    if (len(coros) != 2 or timeout is not None or not asyncio.iscoroutine(coros[0])
            or not self.flow_active or self.should_stop):
        return await _original_wait_first(self, *coros, timeout=timeout)
    deliver, suspended = coros
    try:
        step = deliver.send(None)
    except StopIteration as done:
        suspended.close()
        return WaitResults([deliver], [done.value], False)
    except BaseException:
        suspended.close()
        raise
    return await _original_wait_first(self, _rest_of(deliver, step), suspended)


async def _perform_seek_with_flow_stopped(self) -> None:
    """Faust's ``perform_seek`` with the flow stopped first (3.; recovery resumes it right
    after), and the stream partitions never committed sought to their first offset (7.)."""
    if self.flow_active:
        self.stop_flow()
    committed = await self.seek_to_committed()  # the client seeks only offsets above 0
    never = [tp for tp, offset in committed.items() if not (offset and offset > 0)]
    if never:
        changelogs = self.app.tables.changelog_topics  # recovery places those itself
        never = [tp for tp in never if tp.topic not in changelogs]
    first = await self.earliest_offsets(*never) if never else {}
    for tp in never:
        await self._seek(tp, first[tp])
    starts = self.__dict__.setdefault("gpufleet_first_offsets", {})
    starts.clear()
    starts.update(first)
    # faust's own bookkeeping, as it does it
    self._read_offset.update({tp: offset if offset is not None and offset >= 0 else None
                              for tp, offset in committed.items()})
    self._committed_offset.update({ensure_TP(tp): offset if offset else None
                                   for tp, offset in committed.items() if offset is not None})


def start_offset(consumer, tp) -> int | None:
    """Where the messages of stream partition ``tp`` start since the last assignment: its
    committed offset, or for a partition none was ever committed for, its first offset (7.);
    None where neither is known."""
    committed = consumer._committed_offset.get(tp)
    if committed is not None and committed > 0:
        return committed
    return consumer.__dict__.get("gpufleet_first_offsets", {}).get(tp, committed)


_original_add_gap = Consumer._add_gap
CONTIGUOUS: set[str] = set()  # topic names whose offsets never have gaps (registered by the worker)


async def _add_gap_unless_contiguous(self, tp, offset_from: int, offset_to: int) -> None:
    """``_add_gap``, except on a topic whose offsets cannot have gaps: there a jump is messages
    not (yet) read, which the commit must not pass."""
    if tp.topic in CONTIGUOUS:
        log.warning("%s[%d]: the fetcher jumped from offset %d to %d; not a gap, the stream reads "
                    "them again", tp.topic, tp.partition, offset_from - 1, offset_to)
        return
    await _original_add_gap(self, tp, offset_from, offset_to)


def state_writes(app) -> list[asyncio.Future]:
    """The table writes handed to ``app``'s producer since a commit last took them (6.): each
    stage's ``send_changelog`` futures, resolved once the broker has the write."""
    return app.__dict__.setdefault("gpufleet_state_writes", [])


class StateWriteFailed(Exception):
    """A table's change never reached its changelog: the offsets after it are not committed."""


async def _acknowledged(writes: list[asyncio.Future]) -> BaseException | None:
    """Waits for every write of ``writes``; the first failure, if any."""
    results = await asyncio.gather(*writes, return_exceptions=True)
    return next((r for r in results if isinstance(r, BaseException)), None)


class _Wanted:
    """Faust's live set of the partitions it reads now, as the Kafka client's fetch tests it
    when records come (9.): a partition is wanted while it is in the set; an empty set wants
    nothing (to the client, an empty set of partitions means all of them)."""

    __slots__ = ("live",)

    def __init__(self, live) -> None:
        self.live = live

    def __bool__(self) -> bool:
        return True

    def __contains__(self, tp) -> bool:
        return tp in self.live


async def _wait_next_records_wanted(self, timeout: float):
    """Faust's ``_wait_next_records``, the client asked for the partitions wanted when its
    records come (9.)."""
    if not self.flow_active:
        await self.wait(self.can_resume_flow)
    try:
        self.not_waiting_next_records.set()
        active_partitions = None if self.app.client_only else self._get_active_partitions()
        records = {}
        if self.app.client_only or active_partitions:
            records = await self._getmany(
                active_partitions=None if active_partitions is None else _Wanted(active_partitions),
                timeout=timeout)
        else:
            await self.sleep(1)
        return records, active_partitions
    finally:
        self.not_waiting_next_records.set()


def recover_whole(app, tables) -> None:
    """The next recovery reads every changelog partition of ``tables`` from its first record
    (8.): faust goes on from where its last recovery ended, over a table emptied since."""
    names = {table.changelog_topic.get_topic_name() for table in tables}
    offsets = app.tables.recovery.active_offsets
    for tp in [tp for tp in offsets if tp.topic in names]:
        del offsets[tp]


def forget_acks(consumer) -> int:
    """Every acked offset of ``consumer`` not committed yet, dropped, and the messages handed
    over and not acked made to ack nothing (10.); how many offsets were dropped."""
    with ack_lock:  # (faust's: ``Consumer.ack`` records under it)
        dropped = sum(len(offsets) for offsets in consumer._acked.values())
        consumer._acked.clear()
        consumer._acked_index.clear()
        for message in list(consumer._unacked_messages):
            message.acked = True
        consumer._unacked_messages.clear()
    return dropped


@Service.transitions_to(CONSUMER_COMMITTING)
async def _force_commit_between_batches(self, topics=None, start_new_transaction: bool = True) -> bool:
    """Faust's ``force_commit``, its first steps (the states taken, the offsets chosen) between
    the stages' batches and after the records of every batch so far are durable (5.); the
    offsets committed once the states written before them are durable (6.)."""
    async with AsyncExitStack() as held:
        for lock in getattr(self.app, "gpufleet_commit_locks", ()):
            await held.enter_async_context(lock)
        await self.app.producer.flush()
        sensor_state = self.app.sensors.on_commit_initiated(self)  # the states, encoded now
        commit_offsets = self._filter_committable_offsets(list(self._filter_tps_with_pending_acks(topics)))
        writes = state_writes(self.app)
        taken = writes[:]
        writes.clear()
    failed = await _acknowledged(taken) if taken else None
    if failed is not None:
        await self.crash(StateWriteFailed(f"a table change was not written to its changelog ({failed!r}); "
                                          "no offset is committed after it"))
        self.app.sensors.on_commit_completed(self, sensor_state)
        return False
    did_commit = False
    if commit_offsets:  # as faust's _commit_tps, for the offsets chosen above
        try:
            await self._handle_attached(commit_offsets)
        except ProducerSendError as exc:
            await self.crash(exc)
        else:
            did_commit = await self._commit_offsets(commit_offsets, start_new_transaction=start_new_transaction)
    self.app.sensors.on_commit_completed(self, sensor_state)
    return did_commit


# -- held to what was proven (review.py) ------------------------------------------------------

def check() -> list[str]:
    """What differs from what the fixes were proven on, in words (empty: all as reviewed)."""
    return differences({name: _DEFINED[name] or _original_wait_first for name in _PATCHES})


_PATCHES = {
    "_new_offset": _new_offset_fixed,
    "wait_first": _wait_first_fast,
    "perform_seek": _perform_seek_with_flow_stopped,
    "_add_gap": _add_gap_unless_contiguous,
    "_wait_next_records": _wait_next_records_wanted,
    "force_commit": _force_commit_between_batches,
}
# What the consumer class itself defines under those names (None: it inherits the method).
_DEFINED = {name: Consumer.__dict__.get(name) for name in _PATCHES}


def apply() -> None:
    """Idempotent: patch faust's consumer class (for the whole process: the worker calls it
    once, in ``streams.app.create_app``), after checking that faust is what the fixes were
    proven on. NotAsReviewed, naming the first difference, where it is not."""
    global _verified
    problems = [] if _verified else check()
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise NotAsReviewed(f"{problems[0]}{more}: the worker's fixes to faust (streams/faust_fixes/) must be "
                            f"reviewed again before it runs on this; see {UPGRADING}")
    _verified = True  # (what is installed does not change while the process runs)
    for name, fixed in _PATCHES.items():
        setattr(Consumer, name, fixed)


_verified = False


def revert() -> None:
    """Faust's consumer class as it was before ``apply``."""
    for name, defined in _DEFINED.items():
        if defined is None:
            if name in Consumer.__dict__:
                delattr(Consumer, name)
        else:
            setattr(Consumer, name, defined)


@contextmanager
def applied() -> Iterator[None]:
    """The fixes for the length of a ``with`` block (tests: nothing leaks into other tests)."""
    apply()
    try:
        yield
    finally:
        revert()
