"""The local broker runner: the session broker answers; a failed start names its log."""

from __future__ import annotations

import pytest

from gpufleet.local import kafka as local_kafka


def test_session_broker_answers_and_is_recorded(kafka):
    assert local_kafka.answers_metadata(kafka.bootstrap)
    assert local_kafka.status(kafka.data_dir) == kafka


def test_a_broker_that_cannot_start_names_its_log(tmp_path):
    with pytest.raises(local_kafka.KafkaRunnerError) as err:
        local_kafka.start(tmp_path / "k2", heap="1k", timeout=60)  # a JVM that refuses to start
    message = str(err.value)
    assert str(tmp_path / "k2" / "node-1" / "broker.log") in message
    assert "Error occurred during initialization of VM" in message
    assert local_kafka.status(tmp_path / "k2") is None


def test_a_port_in_use_is_refused_before_anything_starts(kafka, tmp_path):
    busy_port = int(kafka.bootstrap.rsplit(":", 1)[1])
    with pytest.raises(local_kafka.KafkaRunnerError, match=f"port {busy_port} is in use"):
        local_kafka.start(tmp_path / "k3", port=busy_port, timeout=60)
    assert local_kafka.status(tmp_path / "k3") is None and not (tmp_path / "k3" / "node-1").exists()


def test_stop_and_status_without_a_broker(tmp_path):
    assert local_kafka.status(tmp_path) is None
    assert local_kafka.stop(tmp_path) is False


def test_created_topics_have_leaders_when_create_topics_returns(kafka, prefix):
    from confluent_kafka import Consumer, TopicPartition

    from kafka_client.admin import create_topics

    names = [f"{prefix}leaders-{i}" for i in range(3)]
    assert sorted(create_topics(kafka.bootstrap, [(n, 4, False) for n in names])) == names
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"{prefix}leaders"})
    try:
        # No retry here: offsets of every partition are readable at once.
        for name in names:
            for p in range(4):
                assert consumer.get_watermark_offsets(TopicPartition(name, p), timeout=5) == (0, 0)
    finally:
        consumer.close()
    assert create_topics(kafka.bootstrap, [(n, 4, False) for n in names]) == []


def test_topics_on_one_broker_have_one_copy(kafka, prefix):
    from confluent_kafka.admin import AdminClient

    from schemas.topics import GPU_SAMPLES

    topic = (
        AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(timeout=10).topics[prefix + GPU_SAMPLES.name]
    )
    assert {len(p.replicas) for p in topic.partitions.values()} == {1}
