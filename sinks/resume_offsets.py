"""Where the ClickHouse sink resumes each partition it is given: Kafka's id of each topic (the
incarnation its rows are stored under), the plan that starts a partition after the rows
ClickHouse holds of it, and the asking again of a cluster whose leader or coordinator moved.

A topic's rows are stored under its id only: an id the cluster cannot say for now (its
controller away, as after a broker's kill) is asked again, and a sink that still has none stops
(``TopicIdUnknown``) rather than store rows under none. Stored under none, they would be
another incarnation's to every later reader: read again from the committed offset, not resumed
after, and out of the fence that keeps a previous reader's late insert from being stored twice
(found by the soak: every topic's id timed out at a sink's first assignment, and rows were
stored without one until its next). An id the cluster refuses for good (no right to describe the
topic) is left out, and each reader stores that topic's rows under none alike.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import TimeoutError as FutureTimeout

from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

from kafka_client.commit_offsets import TRANSIENT
from sinks.write_clickhouse import Position

log = logging.getLogger(__name__)

# What a broker or coordinator that moved (a node killed, a leader elected) answers for a while:
# what a commit is tried again after, and a partition's leader not known yet.
_MOVED = TRANSIENT | {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE}


def _for_now(error: KafkaError) -> bool:
    """An answer the cluster gives while it moves: asking again later may be answered."""
    return error.retriable() or error.code() in _MOVED


class TopicIdUnknown(RuntimeError):
    """Kafka did not say a topic's id within the time it was asked for: no row of it is stored."""


def topic_ids(admin: AdminClient, topics: list[str], timeout: float = 30.0, retry_s: float = 60.0,
              pause_s: float = 0.2, grace_s: float = 10.0) -> dict[str, str]:
    """Kafka's id of each topic: a topic deleted and created again under the same name gets a
    new one. Those the cluster cannot describe for now are asked again until ``retry_s`` has
    passed, then ``TopicIdUnknown``; one it refuses for good is left out (logged). Each answer is
    waited for ``grace_s`` past the request's ``timeout``."""
    out: dict[str, str] = {}
    left, deadline = sorted(topics), time.monotonic() + retry_s
    while left:
        later: dict[str, str] = {}  # topic -> why it has no id for now
        for name, future in admin.describe_topics(TopicCollection(left), request_timeout=timeout).items():
            try:
                # (waited for past the request's own timeout, which answers it: found by the soak,
                # a wait as long as the request's ran out first and stopped the sink)
                out[name] = str(future.result(timeout + grace_s).topic_id)
            except FutureTimeout:
                later[name] = f"no answer in {timeout + grace_s:g} s"
            except KafkaException as exc:
                if _for_now(exc.args[0]):
                    later[name] = exc.args[0].str()
                else:
                    log.warning("%s: no topic id (%s); its rows are stored without one", name, exc)
        left = sorted(later)
        if left and time.monotonic() > deadline:
            raise TopicIdUnknown(
                f"Kafka did not say the id of {', '.join(left)} in {retry_s:g} s ({later[left[0]]}): "
                "no row is stored without its topic's id; start the sink again once the cluster answers")
        if left:
            log.info("no id yet for %s (%s); asking again", ", ".join(left), later[left[0]])
            time.sleep(pause_s)
    return out


def retried(call, what: str, timeout: float = 60.0):
    """``call()``, asked again while the cluster answers that a leader or coordinator moved
    (a rebalance callback that raised would stop the sink: found by the fleet fault test, a
    broker killed while partitions were being assigned)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except KafkaException as exc:
            error = exc.args[0]
            if not _for_now(error) or time.monotonic() > deadline:
                raise
            log.info("%s: %s; asking again", what, error.str())
            time.sleep(0.2)


class OffsetsDisagree(RuntimeError):
    """ClickHouse holds rows of a topic partition beyond its end in Kafka; the text says where."""


def resume_plan(assigned: list[tuple[str, int]], topic_ids: dict[str, str], stored: dict[Position, int],
                committed: dict[tuple[str, int], int], ends: dict[tuple[str, int], int],
                ) -> tuple[dict[tuple[str, int], int], list[str]]:
    """Where to start each assigned ``(topic, partition)`` that ClickHouse is ahead of Kafka's
    committed offset on (the others start at the committed offset), and the warnings to log.
    ``stored``: the next offset after the rows in ClickHouse per topic incarnation and
    partition; ``ends``: each partition's end offset (only where ClickHouse holds rows)."""
    seek, warnings = {}, []
    for topic, partition in assigned:
        topic_id = topic_ids.get(topic, "")
        resume = stored.get(Position(topic, topic_id, partition))
        others = sorted(p.topic_id for p in stored if (p.topic, p.partition) == (topic, partition)
                        and p.topic_id != topic_id)
        if others and resume is None:
            warnings.append(
                f"{topic}[{partition}]: ClickHouse holds rows of another topic of this name (id "
                f"{', '.join(others)}; this one is {topic_id or 'unknown'}): it was deleted and created "
                "again, or this is another Kafka cluster; those rows are kept, and this partition is read "
                "from its committed offset" if any(others) else
                f"{topic}[{partition}]: ClickHouse holds rows of this topic stored without its id (Kafka did not "
                f"say it then; this one is {topic_id or 'unknown'}): they cannot be told from another "
                "incarnation's, so this partition is read from its committed offset")
        if resume is None:
            continue
        end = ends[(topic, partition)]
        if resume > end:
            raise OffsetsDisagree(
                f"{topic}[{partition}] (id {topic_id or 'unknown'}) ends at offset {end} in Kafka, but ClickHouse "
                f"holds its rows up to offset {resume - 1}: the partition's log was truncated after they "
                "were stored (data lost in Kafka). Not resuming: check the brokers, then delete the rows "
                "beyond the end or start the sink with another --group-id and --database")
        kafka = committed.get((topic, partition), OFFSET_INVALID)
        if kafka < 0 or resume > kafka:
            seek[(topic, partition)] = resume
    return seek, warnings
