"""Messages of a partition applied strictly in offset order, whatever the fetcher hands over.

The window state records, per workflow, the offset it was applied through, and skips what is
at or below it as a replay. That holds only if a partition's messages are applied in order:
a message applied after a hole makes the messages of the hole look like replays when they
come. Faust's consumer can hand over such a hole (a fetch issued before a seek, landing after
it; ``streams.faust_fixes`` fix 4). ``InOrder`` tells, for each message of a partition, whether
to apply it; on a hole it names the offset to seek back to, and skips everything until that
offset comes: the skipped messages come again after it, in order.

Plain logic, no Faust: the worker asks it about each batch and does the seek.
"""

from __future__ import annotations

import logging
from itertools import compress

log = logging.getLogger(__name__)


class InOrder:
    def __init__(self) -> None:
        self._next: dict[int, int] = {}  # partition -> the offset expected next

    def reset(self) -> None:
        """A new assignment: each partition starts again where the consumer was sought."""
        self._next.clear()

    def admit(self, partition: int, offsets: list[int], start: int | None) -> tuple[list[bool], int | None]:
        """For ``offsets`` (ascending) of one partition: which to apply, and the offset to seek
        the partition back to (None: no hole). ``start``: where the partition was sought (its
        committed offset, or its first offset where none was committed: ``faust_fixes.start_offset``),
        for its first messages since ``reset``; None or negative (not known): whatever comes first.
        A batch that only brings messages past a hole asks for the seek again: messages the
        consumer had fetched before the seek can still come, and after them it drops the
        re-read as copies unless it is sought again."""
        keep, seek = [], None
        if start is not None and start < 0:  # "no committed offset" (-1001, -1): the first that comes
            start = None
        expected = self._next.get(partition, start)
        for offset in offsets:
            if expected is None or offset == expected:
                keep.append(True)
                expected = offset + 1
            elif offset < expected:
                keep.append(False)  # a copy of what was applied already
            else:
                keep.append(False)  # past a hole: it comes again once the hole is read
                if seek is None:
                    seek = expected
                    log.warning("partition %d: offset %d came before %d..%d; reading again from %d",
                                partition, offset, expected, offset - 1, expected)
        if expected is not None:
            self._next[partition] = expected
        return keep, seek

    def take(self, partition: int, messages: list, start: int | None) -> tuple[list, int | None]:
        """``admit`` for messages (anything with an ``offset``): those to apply, and the seek."""
        keep, seek = self.admit(partition, [m.offset for m in messages], start)
        return (messages if all(keep) else list(compress(messages, keep))), seek
