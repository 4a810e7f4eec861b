"""Fixes for faust-streaming 0.15.3 that the worker cannot run without.

After a restart the worker's consumer can be handed a partition's messages twice (a race
between changelog recovery and fetching: faust-streaming/faust#596, #221). Two things then
go wrong in ``Consumer._new_offset``, which commits the first run of *consecutive* acked
offsets:

1. Both copies are acked, so the list of acked offsets holds duplicates and the committed
   offset advances by one message per commit (robinhood/faust#625). The duplicates are
   removed before faust looks. (The second copies are harmless to us: each workflow's state
   records the offset it was applied through and skips replays.)
2. Where the two copies interleave, the consumer drops messages whose offset is below the
   highest it has handed out, taking them for copies already read: a few offsets are never
   acked, and the commit stops at the first of them for good -- the group's lag never
   drains (one restart in two in tests/integration/test_alert_restart.py). When the head
   of a partition's acked offsets has stayed out of reach for ``STALLED_COMMITS`` commits
   in a row, the partition is re-read from its committed offset: the missing messages come
   again and are processed (at least once), what was applied already is skipped as a replay.
"""

from __future__ import annotations

import asyncio
import logging

from faust.transport.consumer import Consumer

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


def apply() -> None:
    """Idempotent: patch faust's consumer class once per process."""
    Consumer._new_offset = _new_offset_fixed
