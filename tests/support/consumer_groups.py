"""What the brokers say of a consumer group."""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient


def group_members(bootstrap: str, group: str) -> list[set[tuple[str, int]]]:
    """Each member's assigned partitions (empty while the group is rebalancing or gone)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        (description,) = [f.result(10) for f in admin.describe_consumer_groups([group]).values()]
    except (KafkaException, TimeoutError):  # the coordinator is loading or moving, or no group yet
        return []
    return [{(tp.topic, tp.partition) for tp in m.assignment.topic_partitions} for m in description.members]
