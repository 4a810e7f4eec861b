"""A fix for faust-streaming 0.15.3 that the worker cannot run without.

After a restart the worker's consumer can be handed a partition's messages twice (a race
between changelog recovery and fetching: faust-streaming/faust#596). Both copies are acked,
so the consumer's list of acked offsets holds duplicates, and ``Consumer._new_offset`` --
which commits the first run of *consecutive* offsets -- then advances the committed offset
by one message per commit (robinhood/faust#625): processing goes on, but the group's lag
never drains and every further restart replays more. The second copies are harmless to us
(each workflow's state records the offset it was applied through and skips replays); the
duplicates in the acked list are not. ``apply()`` removes them before faust looks.
"""

from __future__ import annotations

from faust.transport.consumer import Consumer

_original_new_offset = Consumer._new_offset


def _new_offset_without_duplicates(self, tp):
    acked = self._acked[tp]
    if len(acked) > 1:
        unique = sorted(set(acked))
        if len(unique) != len(acked):
            acked[:] = unique
    return _original_new_offset(self, tp)


def apply() -> None:
    """Idempotent: patch faust's consumer class once per process."""
    Consumer._new_offset = _new_offset_without_duplicates
