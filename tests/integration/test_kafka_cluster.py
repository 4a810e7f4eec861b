"""A 3-node local cluster: topics replicated three times (a write needs two copies), the
deployment's partition count, and a node killed with SIGKILL neither stops producers and
consumers nor loses an acknowledged record; restarted, it rejoins."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from gpufleet.local import kafka as local_kafka
from kafka_client.admin import ensure_topics
from kafka_client.config import consumer_config, producer_config
from schemas.topics import ALL_TOPICS, DEAD_LETTERS, GPU_SAMPLES, OWNER_ACTIONS, PROFILE_SCHEDULE
from tests.support.integration import wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("cluster") / "kafka"  # where `gpufleet --data-dir` looks
    info = local_kafka.start(data_dir, brokers=3, heap="384m")
    yield info
    local_kafka.stop(data_dir)


def test_the_cli_reports_every_node(cluster):
    out = subprocess.run([sys.executable, "-m", "gpufleet", "--data-dir", str(cluster.data_dir.parent), "kafka",
                          "status"], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert [line.split(":")[0] for line in out.stdout.splitlines()] == ["node 1", "node 2", "node 3"]
    assert out.stdout.count("answering") == 3 and "NOT" not in out.stdout


def test_topics_are_replicated_as_the_cluster_allows_with_the_deployment_partitions(cluster):
    prefix = "rf."
    ensure_topics(cluster.bootstrap, prefix=prefix, partitions=12)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    topics = admin.list_topics(timeout=10).topics
    for spec in ALL_TOPICS:
        topic = topics[prefix + spec.name]
        want = 1 if spec in (DEAD_LETTERS, PROFILE_SCHEDULE, OWNER_ACTIONS) else 12  # one partition by design
        assert len(topic.partitions) == want, spec.name
        assert {len(p.replicas) for p in topic.partitions.values()} == {3}, spec.name
    resource = ConfigResource(ConfigResource.Type.TOPIC, prefix + GPU_SAMPLES.name)
    config = admin.describe_configs([resource])[resource].result(30)
    assert config["min.insync.replicas"].value == "2"


def test_a_killed_node_loses_no_acknowledged_record_and_rejoins(cluster):
    ensure_topics(cluster.bootstrap, [GPU_SAMPLES], prefix="kill.", partitions=6)
    topic = "kill." + GPU_SAMPLES.name
    producer = Producer(producer_config(cluster.bootstrap, **{"linger.ms": 5}))
    acked: list[bytes] = []

    def send(n, first):
        for i in range(first, first + n):
            producer.produce(topic, key=str(i % 17).encode(), value=str(i).encode(),
                             on_delivery=lambda err, msg: acked.append(msg.value()) if err is None else None)
            producer.poll(0)

    send(3000, 0)
    assert producer.flush(60) == 0
    # Kill the node leading the most partitions: they must move to the two left.
    leaders = [p.leader for p in AdminClient({"bootstrap.servers": cluster.bootstrap})
               .list_topics(timeout=10).topics[topic].partitions.values()]
    victim = max(set(leaders), key=leaders.count)
    killed_at = time.monotonic()
    assert local_kafka.kill_node(cluster.data_dir, victim, signal.SIGKILL)
    send(3000, 3000)
    assert producer.flush(120) == 0, "writes go on with two of three copies"
    moving_again_s = time.monotonic() - killed_at
    assert len(acked) == 6000

    consumer = Consumer(consumer_config(cluster.bootstrap, "kill-reader"))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(6)])
    seen: set[bytes] = set()
    deadline = time.monotonic() + 60
    while len(seen) < 6000 and time.monotonic() < deadline:
        for m in consumer.consume(1000, timeout=1):
            if not m.error():
                seen.add(m.value())
    consumer.close()
    assert seen == set(acked), "every acknowledged record is read back with a node down"

    local_kafka.start_node(cluster.data_dir, victim)
    local_kafka.wait_for(cluster.data_dir, timeout=120)
    wait_until(lambda: victim in local_kafka.live_brokers(cluster.bootstrap), 60, f"node {victim} to rejoin")
    print(f"producers moving again {moving_again_s:.1f} s after the SIGKILL")
