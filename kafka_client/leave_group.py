"""Closing a consumer that reads as a member of a group, without the close that never returns.

librdkafka serves the group's last revocation inside ``close()`` when one is still due, and
the revocation's unassignment can then wait for good for a reply that never comes (an open
librdkafka defect: confluentinc/librdkafka#4884; the workaround its maintainers name in #4527
is to leave the group and wait until nothing is assigned before closing). confluent-kafka makes
that call from its rebalance callback while holding the GIL, so every thread of the process
stops with it, signal handlers included: found as a ClickHouse sink stopped after it had
stalled past ``max.poll.interval.ms`` (the fleet fault test froze whole, about once in three
runs). So a member leaves first: the revocation is served by an ordinary poll, and ``close()``
finds nothing left to revoke.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, KafkaException

log = logging.getLogger(__name__)


def leave_and_close(consumer: Consumer, timeout_s: float = 10.0) -> None:
    """Leave the group (its partitions revoked through the consumer's own callbacks), then
    close. Records fetched meanwhile are neither handled nor committed: the partitions' next
    reader reads them from the last commit."""
    try:
        consumer.unsubscribe()
        deadline = time.monotonic() + timeout_s
        while consumer.assignment():
            if time.monotonic() > deadline:
                log.warning("the group's partitions were not revoked within %g s; closing with them", timeout_s)
                break
            consumer.consume(num_messages=100, timeout=0.1)  # serves the revocation
    except (KafkaException, RuntimeError) as exc:  # (RuntimeError: the consumer is closed already)
        log.warning("could not leave the group before closing: %s", exc)
    consumer.close()
