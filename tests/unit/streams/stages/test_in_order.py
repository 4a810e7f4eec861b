"""A partition's messages are applied in offset order only; a hole is read again."""

from streams.stages.in_order import InOrder


def test_in_order_messages_are_all_applied():
    guard = InOrder()
    assert guard.admit(0, [100, 101, 102], start=100) == ([True] * 3, None)
    assert guard.admit(0, [103], start=None) == ([True], None)


def test_a_hole_at_the_start_is_read_again_from_the_committed_offset():
    """After a rebalance the consumer was sought to 602, and a fetch issued before brings 1260 first."""
    guard = InOrder()
    assert guard.admit(0, [1260, 1261], start=602) == ([False, False], 602)
    assert guard.admit(0, [1262], start=602) == ([False], 602)  # still past the hole: seek again
    # The re-read: the hole, then what was skipped, in order.
    assert guard.admit(0, [602, 603, 604], start=602) == ([True] * 3, None)
    assert guard.admit(0, list(range(605, 1263)), start=602) == ([True] * 658, None)


def test_a_hole_in_the_middle_of_a_batch():
    guard = InOrder()
    assert guard.admit(0, [10, 11, 15, 16], start=10) == ([True, True, False, False], 12)
    assert guard.admit(0, [12, 13, 14, 15, 16], start=10) == ([True] * 5, None)


def test_copies_of_applied_messages_are_skipped():
    guard = InOrder()
    guard.admit(0, [10, 11, 12], start=10)
    assert guard.admit(0, [11, 12, 13], start=10) == ([False, False, True], None)


def test_without_a_committed_offset_the_first_message_starts_the_partition():
    guard = InOrder()
    assert guard.admit(0, [5000, 5001], start=None) == ([True, True], None)
    assert guard.admit(1, [0, 1], start=-1001) == ([True, True], None)  # OFFSET_INVALID: a new group


def test_a_new_assignment_starts_over_where_the_consumer_was_sought():
    guard = InOrder()
    guard.admit(0, [20], start=20)
    guard.reset()
    assert guard.admit(0, [15], start=15) == ([True], None)


def test_take_keeps_the_messages_to_apply():
    class M:
        def __init__(self, offset):
            self.offset = offset
    guard = InOrder()
    batch = [M(10), M(11), M(15)]
    kept, seek = guard.take(0, batch, start=10)
    assert [m.offset for m in kept] == [10, 11] and seek == 12
