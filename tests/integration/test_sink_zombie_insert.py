"""A sink that lost its partitions while its insert was held up (past the poll interval: the
group gave them to another sink) still stores that batch when the insert goes through; its
commit is refused. Found by the soak (12,023 samples stored twice, 255,440 published): the next
sink had read what ClickHouse held when it was given the partitions, before that insert landed,
and read on from the committed offset, storing the same offsets again in batches of other
bounds (so another deduplication token). On the real broker and the embedded ClickHouse, the
held insert made to land between the next sink's assignment and its first insert."""

from __future__ import annotations

import uuid

from kafka_client.admin import ensure_topics
from producers.publish_kafka import Publisher
from schemas.topics import GPU_SAMPLES
from sinks.consume_to_clickhouse import ClickHouseSink
from sinks.write_clickhouse import ClickHouseWriter
from tests.support.integration import CODEC, run_until_it_dies, running_sink, wait_until
from tests.support.samples import BASE_MS, sample


class HeldUp(ClickHouseSink):
    """Takes its first batch, then stops polling before its insert (the group drops it)."""

    held: tuple = ()

    def _write(self, messages) -> None:
        self.held = tuple(messages)
        raise SystemExit("held up before the insert")

    def insert_at_last(self) -> None:
        """The held insert goes through; the commit after it is refused (the partitions moved)."""
        self._commit = lambda messages: None
        ClickHouseSink._write(self, list(self.held))


class Next(ClickHouseSink):
    """The sink the group gives the partitions to; the held insert lands right after."""

    before_first_insert = None

    def _on_assign(self, consumer, partitions) -> None:
        super()._on_assign(consumer, partitions)
        if partitions and self.before_first_insert is not None:
            self.before_first_insert()
            self.before_first_insert = None


def test_a_batch_stored_by_the_partitions_previous_reader_after_the_next_ones_assignment_is_not_stored_again(
        kafka, chdb_client, database):
    prefix = f"t{uuid.uuid4().hex[:10]}."
    ensure_topics(kafka.bootstrap, prefix=prefix, partitions=1)
    topic = prefix + GPU_SAMPLES.name
    pub = Publisher(kafka.bootstrap, CODEC)
    pub.publish(GPU_SAMPLES, [sample(event_time=BASE_MS + t * 1000) for t in range(300)], topic=topic)
    assert pub.flush() == 0
    writer = ClickHouseWriter(chdb_client, database)
    writer.ensure_tables()
    group = f"{prefix}sink"
    held = HeldUp(kafka.bootstrap, writer, group_id=group, topic_prefix=prefix, batch_rows=100, batch_wait_s=2.0)
    run_until_it_dies(held, topic)
    assert 0 < len(held.held) <= 100

    def stored() -> tuple[int, int]:
        return tuple(chdb_client.query(f"SELECT count(), uniqExact(kafka_offset) FROM {database}.gpu_samples"
                                       ).result_rows[0])

    Next.before_first_insert = held.insert_at_last
    with running_sink(kafka.bootstrap, prefix, chdb_client, database, sink_class=Next, batch_rows=64):
        wait_until(lambda: stored()[1] == 300, 60, "every offset stored")
    assert stored() == (300, 300)
