"""The consumer commits past offsets that were acked twice (robinhood/faust#625)."""

from collections import defaultdict

from faust.transport.consumer import Consumer
from faust.types import TP

from streams import faust_fixes

TOPIC_PARTITION = TP("gpu-samples.v1", 0)


class Offsets:
    """Just the state ``Consumer._new_offset`` reads."""

    def __init__(self, committed, acked):
        self._committed_offset = {TOPIC_PARTITION: committed}
        self._acked = {TOPIC_PARTITION: list(acked)}
        self._acked_index = {TOPIC_PARTITION: set(acked)}
        self._gap = defaultdict(lambda: None)


def test_duplicated_acks_no_longer_hold_the_commit_back():
    acked = [744, 745, 745, 746, 746, 747, 747]  # as seen after a restart: every message twice
    assert faust_fixes._original_new_offset(Offsets(744, acked), TOPIC_PARTITION) == 746  # faust: 2 at a time
    faust_fixes.apply()
    assert Consumer._new_offset is faust_fixes._new_offset_without_duplicates
    assert Consumer._new_offset(Offsets(744, acked), TOPIC_PARTITION) == 748


def test_gaps_still_hold_the_commit_back():
    faust_fixes.apply()
    assert Consumer._new_offset(Offsets(9, [10, 11, 11, 13]), TOPIC_PARTITION) == 12
