"""Creates gpufleet's topics on a broker, idempotently, from the declarations in ``topics``."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from schemas.topics import ALL_TOPICS, TopicSpec


def ensure_topics(
    bootstrap: str,
    specs: Iterable[TopicSpec] = ALL_TOPICS,
    prefix: str = "",
    timeout: float = 30.0,
) -> list[str]:
    """Create the topics that do not exist yet; return the names created."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=timeout).topics)
    wanted = []
    for spec in specs:
        name = prefix + spec.name
        if name in existing:
            continue
        config = {"cleanup.policy": "compact"} if spec.compacted else {}
        wanted.append(NewTopic(name, num_partitions=spec.partitions, replication_factor=1, config=config))
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
