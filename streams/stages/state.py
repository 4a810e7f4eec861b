"""The one rule of every stage's state, in one place: the records a batch leads to are durable
before the state that applied the batch is written.

A stage's state records what it has applied (offsets, traces analysed, profiles asked for), and
a worker that takes a partition over restores it and skips what it says was done. A state
written before the records it led to reached the broker would make those records lost for good
after a crash. So a stage changes its tables and emits records only through its
``StageState``:

- ``async with state.batch():`` holds the stage's lock while a batch (or a timer) changes the
  tables and sends; ``send``, ``dead_letter`` and ``changed`` refuse to run outside it;
- ``changed(table, key, partition)`` marks an entry dirty; nothing is written then;
- the worker's commit (``faust_fixes``, fix 5) takes every stage's lock, flushes the producer
  (the records of every batch so far), then calls ``save``: the dirty entries go to their
  changelogs, once each however many batches changed them, and the offsets are committed
  only once the broker has those writes (fix 6).

At every rebalance, before the partitions are handed out again, the tables are emptied,
unsaved changes included, and recovery reads each of their changelog partitions whole
(``faust_fixes``, fix 8): every partition this worker then owns, kept or new, holds the state
as last written, and its samples are read again from the committed offsets, which that state
is never behind (what it applied past them is skipped as a replay).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import faust

from schemas.codec import Codec
from streams import faust_fixes
from streams.stages.io import BeforeCommit, send, send_dead_letter

log = logging.getLogger(__name__)


class OutsideBatch(RuntimeError):
    """A stage changed its state or emitted a record without holding its lock."""


@dataclass
class _Table:
    table: faust.Table
    encode: Callable[[object], bytes] | None  # the value's bytes on the changelog; None: the table's serializer


class StageState:
    def __init__(self, app: faust.App, stage: str, codec: Codec) -> None:
        self.app, self.stage, self.codec = app, stage, codec
        self.lock = asyncio.Lock()
        app.gpufleet_commit_locks = [*getattr(app, "gpufleet_commit_locks", []), self.lock]
        app.sensors.add(BeforeCommit(self.save))
        app.on_partitions_revoked.connect(self.on_revoked)
        self._tables: dict[str, _Table] = {}
        self._dirty: dict[tuple[str, object], int] = {}  # (table, key) -> its changelog partition

    def table(self, table: faust.Table, encode: Callable[[object], bytes] | None = None) -> faust.Table:
        """Keep ``table`` under this rule (``encode``: its values' bytes where the table's own
        serializer is not the one)."""
        self._tables[table.name] = _Table(table, encode)
        return table

    @asynccontextmanager
    async def batch(self) -> AsyncIterator[StageState]:
        """Hold the stage's lock while a batch changes state and sends what it leads to."""
        async with self.lock:
            yield self

    def _held(self, what: str) -> None:
        if not self.lock.locked():
            raise OutsideBatch(f"stage {self.stage} {what} outside a batch: hold `async with state.batch()`")

    def changed(self, table: faust.Table, key, partition: int) -> None:
        """``key``'s entry of ``table`` changed (or was deleted): written by the next commit."""
        self._held("changed its state")
        self._dirty[(table.name, key)] = partition

    async def send(self, topic: faust.TopicT, spec, record: dict) -> None:
        self._held("sent a record")
        await send(self.codec, topic, spec, record)

    async def dead_letter(self, topic: faust.TopicT, message, reason: str, now: int, stage: str | None = None) -> None:
        self._held("sent a dead letter")
        await send_dead_letter(self.codec, topic, stage or self.stage, message, reason, now)

    async def decoded(self, dlq_topic: faust.TopicT, spec, messages, now: int, stage: str | None = None) -> list[dict]:
        """The records of ``messages`` that decode as ``spec``'s schema; the others are dead
        letters with the reason (of ``stage``, this stage by default)."""
        self._held("read a batch")
        ok, errors = self.codec.decode_many([m.value for m in messages])
        bad = [(messages[i], reason) for i, reason in errors]
        records = []
        for i, name, record in ok:
            if name == spec.schema:
                records.append(record)
            else:
                bad.append((messages[i], f"expected {spec.schema}, got {name}"))
        for message, reason in bad:
            await send_dead_letter(self.codec, dlq_topic, stage or self.stage, message, reason, now)
        return records

    def dirty(self, table: faust.Table) -> dict:
        """``table``'s entries changed since the last commit: key -> partition."""
        return {key: p for (name, key), p in self._dirty.items() if name == table.name}

    def save(self) -> None:
        """The dirty entries to their changelogs (the commit calls it, under the lock, after the
        producer's flush); encoded now, so the batches can go on while the producer sends them."""
        for (name, key), partition in self._dirty.items():
            t = self._tables[name]
            value = t.table.data.get(key)
            if t.encode is None:
                write = t.table.send_changelog(partition, key, value)
            else:
                write = t.table.send_changelog(partition, key, t.encode(value), value_serializer="raw")
            faust_fixes.state_writes(self.app).append(write)
        self._dirty.clear()

    async def on_revoked(self, sender, revoked: set, **kwargs) -> None:
        """A rebalance begins (faust has let the batches in flight finish and committed what
        it could): the tables are let go of, between batches, and so are the offsets acked
        since the last commit (``faust_fixes`` fix 10)."""
        async with self.lock:
            gone = self.forget()
            dropped = faust_fixes.forget_acks(self.app.consumer)  # (what was forgotten is read again)
        if gone or dropped:
            log.info("%s: let go of %d entries and %d acked offsets not committed for the rebalance; restored "
                     "from the changelogs as last written, read again from the last commit", self.stage, gone,
                     dropped)

    def forget(self) -> int:
        """Every entry of the stage's tables, unsaved changes included, and where recovery
        would go on reading their changelogs from: it reads them whole (fix 8). Returns how
        many entries."""
        gone = 0
        for t in self._tables.values():
            gone += len(t.table.data)
            t.table.data.clear()
        self._dirty.clear()
        faust_fixes.recover_whole(self.app, [t.table for t in self._tables.values()])
        return gone
