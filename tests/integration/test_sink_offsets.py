"""The sink resumes after its own topics' rows only: rows another prefix wrote into the same
database, or a topic deleted and created again under its name, never make it skip data."""

from __future__ import annotations

import logging
import uuid

from confluent_kafka.admin import AdminClient

from kafka_client.admin import ensure_topics, wait_until_served
from producers.publish_kafka import Publisher
from schemas.topics import GPU_SAMPLES
from sinks.clickhouse_ddl import GPU_SAMPLES_TABLE
from tests.support.integration import CODEC, committed_everything, running_sink, wait_until
from tests.support.samples import BASE_MS, sample


def publish(kafka, topic, n, host):
    """``n`` samples of one workflow (so on one partition, whatever the topic), told apart by host."""
    pub = Publisher(kafka.bootstrap, CODEC)
    pub.publish(GPU_SAMPLES, [sample(host=host, event_time=BASE_MS + i) for i in range(n)], topic=topic)
    assert pub.flush() == 0


def rows_of(client, database, host):
    return client.query(f"SELECT count() FROM {database}.gpu_samples WHERE host = '{host}'").result_rows[0][0]


def sink_until_committed(kafka, prefix, client, database, group):
    topic = prefix + GPU_SAMPLES.name
    with running_sink(kafka.bootstrap, prefix, client, database, tables=(GPU_SAMPLES_TABLE,), group_id=group):
        wait_until(lambda: committed_everything(kafka.bootstrap, group, GPU_SAMPLES, topic), 60,
                   f"the sink to commit all of {topic}")


def test_rows_of_another_prefix_do_not_move_where_the_sink_resumes(kafka, prefix, chdb_client, database):
    other = f"t{uuid.uuid4().hex[:10]}."
    ensure_topics(kafka.bootstrap, [GPU_SAMPLES], prefix=other)
    publish(kafka, other + GPU_SAMPLES.name, 1000, "wf-other")  # ours would resume where these end
    sink_until_committed(kafka, other, chdb_client, database, f"{other}sink")
    publish(kafka, prefix + GPU_SAMPLES.name, 3000, "wf-ours")
    sink_until_committed(kafka, prefix, chdb_client, database, f"{prefix}sink")
    assert rows_of(chdb_client, database, "wf-other") == 1000
    assert rows_of(chdb_client, database, "wf-ours") == 3000


def test_a_topic_created_again_is_read_from_its_start_with_a_warning(kafka, prefix, chdb_client, database, caplog):
    topic = prefix + GPU_SAMPLES.name
    group = f"{prefix}sink"
    publish(kafka, topic, 2000, "wf-first-life")
    sink_until_committed(kafka, prefix, chdb_client, database, group)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.delete_topics([topic], operation_timeout=30)[topic].result(30)
    wait_until(lambda: topic not in admin.list_topics(timeout=10).topics, 30, "the topic to be deleted")
    wait_until(lambda: ensure_topics(kafka.bootstrap, [GPU_SAMPLES], prefix=prefix) == [topic], 30,
               "the topic to be created again")
    wait_until_served(admin, [topic])
    publish(kafka, topic, 3000, "wf-second-life")  # more than before: its offsets pass the old ones
    with caplog.at_level(logging.WARNING, logger="sinks.consume_to_clickhouse"):
        sink_until_committed(kafka, prefix, chdb_client, database, group)
    assert rows_of(chdb_client, database, "wf-first-life") == 2000
    assert rows_of(chdb_client, database, "wf-second-life") == 3000
    assert any("another topic of this name" in r.getMessage() and "created again" in r.getMessage()
               for r in caplog.records)
