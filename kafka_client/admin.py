"""Creates gpufleet's topics on a cluster, idempotently, from the declarations in ``topics``.

How many copies of each partition, and how many must have a write before it is
acknowledged, follow from the cluster's size (``replication_for``); how many partitions the
topics that scale with the fleet have is a setting of the deployment (``partitions``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from kafka_client.config import Connection, client_config, connection
from schemas.topics import ALL_TOPICS, TopicSpec


class TopicsMissing(RuntimeError):
    """Topics a component needs do not exist and its principal may not create them."""


def replication_for(brokers: int) -> tuple[int, int]:
    """Replication factor and ``min.insync.replicas`` on a cluster of ``brokers``: three copies
    where there are three brokers, a write acknowledged once two have it, so that one broker
    can be lost or restarted without losing an acknowledged record or stopping writes; one
    and one on a single broker."""
    replicas = min(3, max(1, brokers))
    return replicas, (2 if replicas >= 3 else 1)


def create_topics(kafka: str | Connection, topics: Iterable[tuple], timeout: float = 30.0,
                  replication: int | None = None) -> list[str]:
    """Create each ``(name, partitions, compacted[, configs])`` that does not exist yet,
    replicated as the cluster allows (or ``replication`` times); return the names created."""
    admin = AdminClient(client_config(kafka))
    metadata = admin.list_topics(timeout=timeout)
    existing = set(metadata.topics)
    replicas, min_isr = replication_for(replication or len(metadata.brokers))
    wanted = [
        NewTopic(name, num_partitions=partitions, replication_factor=replicas,
                 config={"min.insync.replicas": str(min_isr), **({"cleanup.policy": "compact"} if compacted else {}),
                         **dict(configs[0] if configs else ())})
        for name, partitions, compacted, *configs in topics if name not in existing
    ]
    if not wanted:
        return []
    created, refused = [], []
    for name, future in admin.create_topics(wanted, operation_timeout=timeout).items():
        try:
            future.result(timeout)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].name() in ("TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED"):
                refused.append(name)
            elif exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise
    if refused:
        raise TopicsMissing(f"{len(refused)} topic(s) do not exist and {connection(kafka).security.principal} "
                            f"may not create them: {', '.join(sorted(refused))}; an administrator creates "
                            f"them (`gpufleet topics create`)")
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
    kafka: str | Connection,
    specs: Iterable[TopicSpec] = ALL_TOPICS,
    prefix: str = "",
    timeout: float = 30.0,
    partitions: int | None = None,
    replication: int | None = None,
) -> list[str]:
    """Create the declared topics (under ``prefix``) that do not exist yet, those that scale
    with the fleet with ``partitions`` each (default: as declared); return the names created.
    Topics that exist keep what they have: ``partitions_of`` tells a consumer what that is."""
    return create_topics(kafka, [(prefix + s.name, s.partitions_in(partitions), s.compacted, s.configs)
                                 for s in specs], timeout, replication)


def align_configs(kafka: str | Connection, specs: Iterable[TopicSpec] = ALL_TOPICS, prefix: str = "",
                  timeout: float = 30.0) -> list[str]:
    """Give the existing topics the settings their declarations carry (a deployment made before
    a setting was declared: the samples topic's LogAppendTime); return 'topic: key=value' for
    each one changed. Needs the right to alter the topics' configs (the administrator)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient(client_config(kafka))
    existing = set(admin.list_topics(timeout=timeout).topics)
    declared = {prefix + s.name: dict(s.configs) for s in specs if s.configs and prefix + s.name in existing}
    if not declared:
        return []
    resources = [ConfigResource("topic", name) for name in declared]
    changed = []
    for resource, future in admin.describe_configs(resources).items():
        have = future.result(timeout)
        differ = {k: v for k, v in declared[resource.name].items() if k not in have or have[k].value != v}
        if differ:
            entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in differ.items()]
            (done,) = admin.incremental_alter_configs([ConfigResource("topic", resource.name,
                                                                      incremental_configs=entries)]).values()
            done.result(timeout)
            changed += [f"{resource.name}: {k}={v}" for k, v in differ.items()]
    return changed


def brokers_in(kafka: str | Connection, timeout: float = 30.0) -> int:
    """How many brokers the cluster's metadata lists as live."""
    return len(AdminClient(client_config(kafka)).list_topics(timeout=timeout).brokers)


def partitions_of(kafka: str | Connection, names: Iterable[str], timeout: float = 30.0) -> dict[str, int]:
    """How many partitions each of the topics ``names`` has on the cluster (missing: left out)."""
    topics = AdminClient(client_config(kafka)).list_topics(timeout=timeout).topics
    return {n: len(topics[n].partitions) for n in names if n in topics and topics[n].error is None}
