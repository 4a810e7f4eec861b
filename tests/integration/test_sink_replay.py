"""A sink that dies after inserting a batch but before committing it does not double rows."""

from __future__ import annotations

import threading

from producers.publish_kafka import Publisher
from schemas.topics import GPU_SAMPLES
from sinks.consume_to_clickhouse import ClickHouseSink
from sinks.write_clickhouse import ClickHouseWriter
from tests.integration.helpers import CODEC, committed_everything, wait_until
from tests.unit.samples import BASE_MS, sample


class CrashBeforeCommit(ClickHouseSink):
    """Our sink, dying at the worst moment: rows are in ClickHouse, offsets not committed."""

    def _commit(self) -> None:
        raise SystemExit("simulated crash between insert and commit")


def test_replayed_batch_is_not_inserted_twice(kafka, prefix, chdb_client, database):
    topic = prefix + GPU_SAMPLES.name
    samples = [sample(workflow_id=f"wf-{i % 5}", event_time=BASE_MS + i) for i in range(3000)]
    pub = Publisher(kafka.bootstrap, CODEC)
    pub.publish(GPU_SAMPLES, samples, topic=topic)
    assert pub.flush() == 0
    writer = ClickHouseWriter(chdb_client, database)
    group = f"{prefix}sink"

    def count():
        return chdb_client.query(f"SELECT count() FROM {database}.gpu_samples").result_rows[0][0]

    crashing = CrashBeforeCommit(kafka.bootstrap, writer, group_id=group, topic_prefix=prefix,
                                 tables=(writer_table(),), batch_rows=1000, batch_wait_s=2.0)
    writer.ensure_tables()
    crashing.consumer.subscribe([topic], on_assign=crashing._on_assign)
    try:
        crashing.run_batch(threading.Event())
        raise AssertionError("the sink should have crashed")
    except SystemExit:
        pass
    finally:
        crashing.consumer.close()
    inserted_before_crash = count()
    assert inserted_before_crash > 0
    assert not committed_everything(kafka.bootstrap, group, GPU_SAMPLES, topic)

    stop = threading.Event()
    sink = ClickHouseSink(kafka.bootstrap, writer, group_id=group, topic_prefix=prefix,
                          tables=(writer_table(),), batch_wait_s=0.3)
    thread = threading.Thread(target=sink.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: committed_everything(kafka.bootstrap, group, GPU_SAMPLES, topic), 60,
                   "the restarted sink to commit everything")
    finally:
        stop.set()
        thread.join(30)
    assert count() == len(samples)
    # The restarted sink inserted only what the crashed one had not.
    assert sum(sink.stats.rows.values()) == len(samples) - inserted_before_crash


def writer_table():
    from sinks.clickhouse_ddl import GPU_SAMPLES_TABLE

    return GPU_SAMPLES_TABLE
