"""A group member is closed by leaving first (``kafka_client.leave_group``), on the real broker:
its partitions are revoked through its own callbacks by an ordinary poll, before ``close()``
is called, so that librdkafka never serves a revocation inside ``close()`` (where one can wait
for good while confluent-kafka holds the GIL: the whole process stopped with it). Also for a
member that stalled past ``max.poll.interval.ms``, as a sink held up by ClickHouse does."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer

from kafka_client.admin import create_topics
from kafka_client.config import consumer_config
from kafka_client.leave_group import leave_and_close
from tests.support.consumer_groups import group_members
from tests.support.integration import wait_until


class Member(Consumer):
    """A consumer that records its rebalance callbacks, and whether ``close()`` had been called
    when each came."""

    def __init__(self, config: dict, topic: str) -> None:
        super().__init__(config)
        self.closing = False
        self.events: list[tuple[str, int, bool]] = []
        self.subscribe([topic], on_assign=self._event("assign"), on_revoke=self._event("revoke"),
                       on_lost=self._event("lost"))

    def _event(self, kind: str):
        return lambda consumer, partitions: self.events.append((kind, len(partitions), self.closing))

    def close(self) -> None:
        self.closing = True
        super().close()


def topic_and_group(kafka) -> tuple[str, str]:
    topic = f"t{uuid.uuid4().hex[:10]}"
    create_topics(kafka.bootstrap, [(topic, 4, False)])
    return topic, f"{topic}-group"


def assigned(member: Member) -> bool:
    member.consume(num_messages=10, timeout=0.2)
    return bool(member.assignment())


def test_a_member_leaves_its_group_before_it_closes(kafka):
    topic, group = topic_and_group(kafka)
    member = Member(consumer_config(kafka.bootstrap, group), topic)
    wait_until(lambda: assigned(member), 60, "the member to be given the partitions")

    leave_and_close(member)

    assert member.events == [("assign", 4, False), ("revoke", 4, False)], member.events  # none inside close()
    assert member.closing


def test_a_member_that_stalled_past_its_poll_interval_leaves_before_it_closes(kafka):
    topic, group = topic_and_group(kafka)
    # 6 s: the least session timeout the broker allows, which the poll interval may not be under
    config = consumer_config(kafka.bootstrap, group, **{"max.poll.interval.ms": 6000, "session.timeout.ms": 6000})
    member = Member(config, topic)
    wait_until(lambda: assigned(member), 60, "the member to be given the partitions")

    # It stops polling (a batch held up): the group drops it while it still holds its partitions.
    wait_until(lambda: not any(group_members(kafka.bootstrap, group)), 60, "the group to drop the stalled member")
    leave_and_close(member)

    kinds = [(kind, closing) for kind, _, closing in member.events]
    assert kinds[0] == ("assign", False) and kinds[1:] == [(kinds[1][0], False)], member.events
    assert kinds[1][0] in ("revoke", "lost"), member.events
