"""The consumer commits past offsets that were acked twice (robinhood/faust#625), and re-reads
a partition whose head never reached the stream instead of never committing again."""

import asyncio
from collections import defaultdict

from faust.transport.consumer import Consumer
from faust.types import TP

from streams import faust_fixes

TOPIC_PARTITION = TP("gpu-samples.v1", 0)


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
    faust_fixes.apply()
    assert Consumer._new_offset is faust_fixes._new_offset_fixed
    assert Consumer._new_offset(Offsets(744, acked), TOPIC_PARTITION) == 748


def test_gaps_still_hold_the_commit_back():
    faust_fixes.apply()
    assert Consumer._new_offset(Offsets(9, [10, 11, 11, 13]), TOPIC_PARTITION) == 12


async def commits(consumer, n):
    out = []
    for _ in range(n):
        out.append(Consumer._new_offset(consumer, TOPIC_PARTITION))
        await asyncio.sleep(0)  # the re-read, if one was asked for, runs here
    return out


def test_a_head_that_never_arrives_is_read_again_after_some_commits():
    faust_fixes.apply()
    consumer = Offsets(748, range(751, 1600))  # 748..750 were dropped: faust waits for them for ever
    assert asyncio.run(commits(consumer, faust_fixes.STALLED_COMMITS - 1)) == [None] * (faust_fixes.STALLED_COMMITS - 1)
    assert consumer.seeks == []
    assert asyncio.run(commits(consumer, 1)) == [None]
    assert consumer.seeks == [(TOPIC_PARTITION, 748)]
    # Read again, the missing messages are acked and the commit goes on.
    consumer._acked[TOPIC_PARTITION] += [748, 749, 750]
    assert asyncio.run(commits(consumer, 1)) == [1600]


def test_a_head_that_arrives_in_time_is_not_read_again():
    faust_fixes.apply()
    consumer = Offsets(748, range(751, 800))
    asyncio.run(commits(consumer, faust_fixes.STALLED_COMMITS - 1))
    consumer._acked[TOPIC_PARTITION] += [748, 749, 750]
    assert asyncio.run(commits(consumer, 1)) == [800]
    consumer._committed_offset[TOPIC_PARTITION] = 800  # as the commit leaves it
    consumer._acked[TOPIC_PARTITION] += list(range(802, 900))  # a new gap starts its own count
    asyncio.run(commits(consumer, faust_fixes.STALLED_COMMITS - 1))
    assert consumer.seeks == []
