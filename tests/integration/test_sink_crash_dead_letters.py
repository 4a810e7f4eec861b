"""A record the sink cannot store is dead-lettered even when the sink is killed between its
insert and its commit: a restarted sink resumes after the highest offset stored (read from the
table), so a record before it is never read again, and its dead letter must already be on the
broker when the rows after it are stored. On the real broker, the kill as kill -9 does it: what
the producer had not delivered is gone."""

from __future__ import annotations

import uuid

from confluent_kafka import Producer

from kafka_client.admin import ensure_topics
from kafka_client.config import producer_config
from producers.publish_kafka import Publisher
from schemas.topics import DEAD_LETTERS, GPU_SAMPLES
from sinks.consume_to_clickhouse import ClickHouseSink
from sinks.write_clickhouse import ClickHouseWriter
from tests.support.integration import CODEC, read_topic, run_until_it_dies, running_sink, wait_until
from tests.support.samples import BASE_MS, sample


class KilledBeforeCommit(ClickHouseSink):
    """Rows are in ClickHouse; then the process dies: records its producer had not delivered are
    lost with it, and nothing is committed."""

    def _commit(self, messages) -> None:
        self.loop.producer.purge()
        raise SystemExit("killed between the insert and the commit")


def test_a_bad_record_is_dead_lettered_through_a_kill_between_the_insert_and_the_commit(
        kafka, chdb_client, database):
    prefix = f"t{uuid.uuid4().hex[:10]}."
    ensure_topics(kafka.bootstrap, prefix=prefix, partitions=1)  # the bad record and the samples on one partition
    topic = prefix + GPU_SAMPLES.name
    raw = Producer(producer_config(kafka.bootstrap))
    raw.produce(topic, value=b"this is not avro")
    assert raw.flush(30) == 0
    pub = Publisher(kafka.bootstrap, CODEC)
    pub.publish(GPU_SAMPLES, [sample(event_time=BASE_MS + t * 1000) for t in range(20)], topic=topic)
    assert pub.flush() == 0
    writer = ClickHouseWriter(chdb_client, database)
    writer.ensure_tables()

    def stored() -> int:
        return chdb_client.query(f"SELECT count() FROM {database}.gpu_samples").result_rows[0][0]

    killed = KilledBeforeCommit(kafka.bootstrap, writer, group_id=f"{prefix}sink", topic_prefix=prefix,
                                batch_rows=100, batch_wait_s=2.0)
    run_until_it_dies(killed, topic)
    assert stored() == 20  # the samples after the bad record are stored: a restart resumes after them

    with running_sink(kafka.bootstrap, prefix, chdb_client, database):
        letters = wait_until(lambda: read_topic(kafka.bootstrap, prefix + DEAD_LETTERS.name, 1), 30,
                             "the bad record's dead letter")
    assert [(r["source_topic"], r["source_offset"], r["value"]) for *_, r in letters] == [
        (topic, 0, b"this is not avro")], letters
    assert stored() == 20
