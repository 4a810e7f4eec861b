"""Creates gpufleet's topics on a broker, idempotently, from the declarations in ``topics``."""

from __future__ import annotations

import time
from collections.abc import Iterable

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from schemas.topics import ALL_TOPICS, TopicSpec


def create_topics(bootstrap: str, topics: Iterable[tuple[str, int, bool]], timeout: float = 30.0) -> list[str]:
    """Create each ``(name, partitions, compacted)`` that does not exist yet; return the names created."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=timeout).topics)
    wanted = [
        NewTopic(name, num_partitions=partitions, replication_factor=1,
                 config={"cleanup.policy": "compact"} if compacted else {})
        for name, partitions, compacted in topics if name not in existing
    ]
    if not wanted:
        return []
    created = []
    for name, future in admin.create_topics(wanted, operation_timeout=timeout).items():
        try:
            future.result(timeout)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise
    wait_until_served(admin, [t.topic for t in wanted], timeout)
    return created


def wait_until_served(admin: AdminClient, names: list[str], timeout: float = 30.0) -> None:
    """Return once every partition of ``names`` answers for its offsets.

    A topic exists as soon as ``create_topics`` answers, but for a moment its partitions
    have no leader, and then a leader in the metadata that does not serve the partition yet:
    a client asking for offsets in that instant is told NOT_LEADER_FOR_PARTITION. Asking
    for each partition's end offset until all answer covers both.
    """
    deadline = time.monotonic() + timeout
    waiting_for = sorted(names)
    while waiting_for:
        topics = admin.list_topics(timeout=max(deadline - time.monotonic(), 1.0)).topics
        if all(n in topics and topics[n].error is None and topics[n].partitions for n in waiting_for):
            query = {TopicPartition(n, p): OffsetSpec.latest() for n in waiting_for for p in topics[n].partitions}
            failed = set()
            for tp, future in admin.list_offsets(query, request_timeout=5).items():
                try:
                    future.result()
                except KafkaException:
                    failed.add(tp.topic)
            waiting_for = sorted(failed)
            if not waiting_for:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"partitions not served after {timeout:g}s: {waiting_for}")
        time.sleep(0.1)


def ensure_topics(
    bootstrap: str,
    specs: Iterable[TopicSpec] = ALL_TOPICS,
    prefix: str = "",
    timeout: float = 30.0,
) -> list[str]:
    """Create the declared topics (under ``prefix``) that do not exist yet; return the names created."""
    return create_topics(bootstrap, [(prefix + s.name, s.partitions, s.compacted) for s in specs], timeout)
