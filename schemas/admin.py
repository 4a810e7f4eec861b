"""Creates gpufleet's topics on a broker, idempotently, from the declarations in ``topics``."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

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
    return created


def ensure_topics(
    bootstrap: str,
    specs: Iterable[TopicSpec] = ALL_TOPICS,
    prefix: str = "",
    timeout: float = 30.0,
) -> list[str]:
    """Create the declared topics (under ``prefix``) that do not exist yet; return the names created."""
    return create_topics(bootstrap, [(prefix + s.name, s.partitions, s.compacted) for s in specs], timeout)
