"""The consume loop's rule without a broker: a batch whose records are not durable is not
committed (a real producer whose broker is away)."""

from __future__ import annotations

import pytest

from kafka_client.consume_loop import ConsumeLoop, NotDurable
from kafka_client.metrics import ComponentMetrics


def test_offsets_are_not_committed_while_what_the_batch_produced_is_not_durable():
    loop = ConsumeLoop("127.0.0.1:1", "g", ["t"], ComponentMetrics("test-loop"), "test", flush_timeout_s=0.5,
                       consumer_overrides={"log_level": 0})
    loop.producer = type(loop.producer)({"bootstrap.servers": "127.0.0.1:1", "log_level": 0})
    loop.dead_letter("a reason", topic="t", partition=0, offset=41, value=b"x")
    with pytest.raises(NotDurable, match=r"1 record\(s\) produced for this batch were not delivered in 0.5 s"):
        loop.commit(positions={("t", 0): 42})
    assert loop.committer.pending == {}  # the commit was never tried
    assert loop.dead_letters == 1
    loop.consumer.close()
