"""A small topic read whole by every process that needs it (``kafka_client.whole_topic``: the
owners' actions, for each notifier and the enforcer), on the real broker: every record in
order, then what comes; and a topic whose records all expired is read to its end at once (it
holds nothing to wait for: the enforcer would otherwise run no action, ever, on a quiet site);
and the owners' actions are kept for good."""

from __future__ import annotations

import uuid

from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from kafka_client.admin import align_configs, create_topics
from kafka_client.config import client_config, producer_config
from kafka_client.whole_topic import WholeTopic
from schemas.topics import OWNER_ACTIONS


def test_the_topic_is_read_whole_then_as_it_comes_and_read_to_its_end_once_its_records_expired(kafka):
    topic = f"t{uuid.uuid4().hex[:10]}.gpufleet.owner-actions.v1"
    create_topics(kafka.bootstrap, [(topic, 1, False)])
    producer = Producer(producer_config(kafka.bootstrap))

    def write(*values: bytes) -> None:
        for value in values:
            producer.produce(topic, partition=0, value=value)
        assert producer.flush(30) == 0

    write(b"a", b"b", b"c")
    taken: list[bytes] = []
    reader = WholeTopic(kafka.bootstrap, topic, f"{topic}-reader", lambda m: taken.append(m.value()))
    try:
        assert reader.read_to_end(timeout_s=30) and taken == [b"a", b"b", b"c"]
        write(b"d")
        assert reader.read_to_end(timeout_s=30) and taken == [b"a", b"b", b"c", b"d"]
    finally:
        reader.close()

    # retention took every record: the partition starts and ends at offset 4
    admin = AdminClient(client_config(kafka.bootstrap))  # (kept: its futures resolve through it)
    (deleted,) = admin.delete_records([TopicPartition(topic, 0, 4)]).values()
    assert deleted.result(30).low_watermark == 4
    taken.clear()
    reader = WholeTopic(kafka.bootstrap, topic, f"{topic}-reader", lambda m: taken.append(m.value()))
    try:
        assert reader.read_to_end(timeout_s=10) and taken == []
        write(b"e")
        assert reader.read_to_end(timeout_s=30) and taken == [b"e"]
    finally:
        reader.close()


def test_the_owners_actions_are_kept_for_good_and_an_older_deployment_is_aligned(kafka, prefix):
    """An exemption may run for a month and an acknowledged alert for longer, past the broker's
    default retention (7 days): then a notifier or an enforcer started later would read the
    topic whole without them, and act on an exempt job."""
    topic = prefix + OWNER_ACTIONS.name
    admin = AdminClient(client_config(kafka.bootstrap))

    def retention() -> str:
        (described,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
        return described.result(30)["retention.ms"].value

    assert retention() == "-1"  # as the deployment makes it
    entries = [ConfigEntry("retention.ms", "604800000", incremental_operation=AlterConfigOpType.SET)]
    (done,) = admin.incremental_alter_configs([ConfigResource("topic", topic, incremental_configs=entries)]).values()
    done.result(30)
    assert retention() == "604800000"  # a deployment made before it was declared
    assert align_configs(kafka.bootstrap, [OWNER_ACTIONS], prefix=prefix) == [f"{topic}: retention.ms=-1"]
    assert retention() == "-1"
