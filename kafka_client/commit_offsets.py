"""Commits a consumer's offsets after its work is done, through rebalances and broker failures.

The consume loop (``kafka_client.consume_loop``) commits after each batch is done. A commit can fail
without anything being wrong with the work: the partitions moved to another member (a
rebalance), or the group's coordinator moved with a broker that failed. Neither may stop
the consumer: the work is done, and at worst it is read again (the sink then resumes after
its stored rows, the notifier skips what its sent-log has). Offsets whose commit failed are
committed with the next batch's.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

log = logging.getLogger(__name__)

# The partitions are being or have been given to another member.
MOVED = frozenset({KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID,
                   KafkaError._NO_OFFSET, KafkaError.FENCED_INSTANCE_ID})
# The coordinator moved or is loading (a broker failed); the commit can be tried again.
TRANSIENT = frozenset({KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                       KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.REQUEST_TIMED_OUT,
                       KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._WAIT_COORD})


class Committer:
    def __init__(self, consumer: Consumer, attempts: int = 3, backoff_s: float = 0.5) -> None:
        self.consumer = consumer
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.pending: dict[tuple[str, int], int] = {}  # offsets not committed yet

    def commit(self, messages: list, positions: dict[tuple[str, int], int] | None = None) -> bool:
        """Commit the positions after ``messages``, or the ``positions`` given (topic and
        partition -> the next offset to read), and any left from before; True if done."""
        for m in messages:
            key = (m.topic(), m.partition())
            self.pending[key] = max(self.pending.get(key, 0), m.offset() + 1)
        for key, offset in (positions or {}).items():
            self.pending[key] = offset
        if not self.pending:
            return True
        offsets = [TopicPartition(t, p, o) for (t, p), o in self.pending.items()]
        for attempt in range(self.attempts):
            try:
                self.consumer.commit(offsets=offsets, asynchronous=False)
                self.pending.clear()
                return True
            except KafkaException as exc:
                code = exc.args[0].code()
                if code in MOVED:
                    log.warning("commit refused (%s): the partitions moved to another member, which "
                                "goes on after the work done here", exc.args[0].name())
                    self.pending.clear()
                    return False
                if code not in TRANSIENT:
                    raise
                log.warning("commit failed (%s), attempt %d of %d", exc.args[0].name(), attempt + 1, self.attempts)
                time.sleep(self.backoff_s * 2**attempt)
        log.warning("offsets of %d partitions not committed yet; tried again with the next batch", len(self.pending))
        return False
