"""A sink that dies after inserting a batch but before committing it does not double rows."""

from __future__ import annotations

import threading
import time

from producers.publish_kafka import Publisher
from schemas.topics import GPU_SAMPLES
from sinks.consume_to_clickhouse import ClickHouseSink
from sinks.write_clickhouse import ClickHouseWriter
from tests.integration.helpers import CODEC, committed_everything, wait_until
from tests.unit.samples import BASE_MS, batch_samples, sample


class CrashBeforeCommit(ClickHouseSink):
    """Our sink, dying at the worst moment: rows are in ClickHouse, offsets not committed."""

    def _commit(self, messages) -> None:
        raise SystemExit("simulated crash between insert and commit")


def test_replayed_batch_is_not_inserted_twice(kafka, prefix, chdb_client, database):
    topic = prefix + GPU_SAMPLES.name
    samples = [sample(workflow_id=f"wf-{i % 5}", event_time=BASE_MS + i) for i in range(3000)]
    batched = [sample(workflow_id=f"wf-b{j % 3}", gpu_index=g, gpu_uuid=f"GPU-{g}", event_time=BASE_MS + j * 1000)
               for j in range(200) for g in range(4)]
    pub = Publisher(kafka.bootstrap, CODEC)
    pub.publish(GPU_SAMPLES, samples[:1500], topic=topic)
    pub.publish(GPU_SAMPLES, batch_samples(batched), topic=topic, schema="GpuSampleBatch")  # 4 a message
    pub.publish(GPU_SAMPLES, samples[1500:], topic=topic)
    samples += batched
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
        deadline = time.monotonic() + 60  # the first batches may come up empty while the group forms
        while time.monotonic() < deadline:
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
    # The rollups fed by materialized views on insert are exact too.
    rolled, seconds = chdb_client.query(
        f"SELECT sum(samples), sum(gpu_seconds) FROM {database}.gpu_hours_hourly").result_rows[0]
    assert rolled == len(samples) and seconds == len(samples)  # 1 s per sample, share 1


def writer_table():
    from sinks.clickhouse_ddl import GPU_SAMPLES_TABLE

    return GPU_SAMPLES_TABLE
