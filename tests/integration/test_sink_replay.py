"""A sink that dies after inserting a batch but before committing it does not double rows."""

from __future__ import annotations

import threading

from confluent_kafka import Producer

from kafka_client.config import producer_config
from producers.publish_kafka import Publisher
from schemas.sample_columns import columns_of
from schemas.topics import DEAD_LETTERS, GPU_SAMPLES
from sinks.consume_to_clickhouse import ClickHouseSink
from sinks.write_clickhouse import ClickHouseWriter
from tests.support.integration import CODEC, committed_everything, read_topic, run_until_it_dies, wait_until
from tests.support.samples import BASE_MS, batch_samples, sample


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
    inserted_before_crash, sink = crash_then_resume(kafka, prefix, writer)
    count = sample_count(chdb_client, database)
    assert count() == len(samples)
    # The restarted sink inserted only what the crashed one had not.
    assert sum(sink.stats.rows.values()) == len(samples) - inserted_before_crash
    # Older formats (a sample or a batch of records a message) are decoded in Python.
    assert sink.stats.samples_in_python > 0 and sink.stats.samples_in_sql == 0
    # The rollups fed by materialized views on insert are exact too.
    rolled, seconds = chdb_client.query(
        f"SELECT sum(samples), sum(gpu_seconds) FROM {database}.gpu_hours_hourly").result_rows[0]
    assert rolled == len(samples) and seconds == len(samples)  # 1 s per sample, share 1


def sample_count(client, database):
    return lambda: client.query(f"SELECT count() FROM {database}.gpu_samples").result_rows[0][0]


def crash_then_resume(kafka, prefix, writer, batch_rows=1000):
    """A sink that crashes after its first insert, before its commit; then one that reads on to
    the end, in batches of the same ``batch_rows`` messages at most (so which batches hold what does
    not hang on how fast the broker hands them over). Returns the samples stored before the crash
    and the second sink."""
    topic = prefix + GPU_SAMPLES.name
    group = f"{prefix}sink"
    count = sample_count(writer.client, writer.database)
    crashing = CrashBeforeCommit(kafka.bootstrap, writer, group_id=group, topic_prefix=prefix,
                                 tables=(writer_table(),), batch_rows=batch_rows, batch_wait_s=2.0)
    writer.ensure_tables()
    run_until_it_dies(crashing, topic)
    inserted_before_crash = count()
    assert inserted_before_crash > 0
    assert not committed_everything(kafka.bootstrap, group, GPU_SAMPLES, topic)

    stop = threading.Event()
    sink = ClickHouseSink(kafka.bootstrap, writer, group_id=group, topic_prefix=prefix,
                          tables=(writer_table(),), batch_rows=batch_rows, batch_wait_s=0.3)
    thread = threading.Thread(target=sink.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: committed_everything(kafka.bootstrap, group, GPU_SAMPLES, topic), 60,
                   "the restarted sink to commit everything")
    finally:
        stop.set()
        thread.join(30)
    return inserted_before_crash, sink


def test_agent_blocks_are_stored_once_through_a_crash_and_a_bad_one_is_a_dead_letter(
        kafka, prefix, chdb_client, database):
    """The agents' GpuSampleColumns messages, which ClickHouse decodes and checks itself
    (``sinks.insert_sample_columns``): exactly once through a crash before the commit; a batch
    holding a bad block falls back to the Python path, which dead-letters that block only."""
    topic = prefix + GPU_SAMPLES.name
    pub = Publisher(kafka.bootstrap, CODEC)
    blocks = [b for t in range(100) for b in columns_of(
        [sample(workflow_id=f"wf-{w}", gpu_index=g, gpu_uuid=f"GPU-{g}", event_time=BASE_MS + t * 1000)
         for w in range(3) for g in range(4)])]
    bad = columns_of([sample(workflow_id="wf-bad", utilization_pct=140.0, event_time=BASE_MS)])
    pub.publish(GPU_SAMPLES, blocks[:150], topic=topic, schema="GpuSampleColumns")
    pub.publish(GPU_SAMPLES, bad, topic=topic, schema="GpuSampleColumns")
    assert pub.flush() == 0
    ((bad_partition, bad_offset, *_),) = [m for m in read_topic(kafka.bootstrap, topic, GPU_SAMPLES.partitions)
                                          if m[2] == b"wf-bad"]
    clock = Producer(producer_config(kafka.bootstrap))  # a worker's clock: no key, no samples
    clock.produce(topic, CODEC.encode("PartitionClock", {"event_time": BASE_MS, "worker": "w", "sent_at": BASE_MS}))
    # A job's end from its scheduler, after its samples (an agent that reads allocations): no samples either.
    clock.produce(topic, CODEC.encode("WorkflowEvent", {
        "workflow_id": "wf-1", "event": "ENDED", "event_time": BASE_MS + 150_000, "host": "h", "gpu_uuids": [],
        "pids": [], "attribution": "allocation:slurm", "scheduler": "slurm"}), key=b"wf-1")
    assert clock.flush(30) == 0
    pub.publish(GPU_SAMPLES, blocks[150:], topic=topic, schema="GpuSampleColumns")
    assert pub.flush() == 0
    writer = ClickHouseWriter(chdb_client, database)
    inserted_before_crash, sink = crash_then_resume(kafka, prefix, writer, batch_rows=100)
    stored = chdb_client.query(f"SELECT workflow_id, count(), uniqExact(kafka_offset) FROM {database}.gpu_samples "
                               "GROUP BY workflow_id ORDER BY workflow_id").result_rows
    assert stored == [(f"wf-{w}", 400, 100) for w in range(3)]
    assert sum(sink.stats.rows.values()) == 1200 - inserted_before_crash
    assert sink.stats.samples_in_sql > 0  # the restarted sink's batches went through ClickHouse's parser
    dead = [r for *_, n, r in read_topic(kafka.bootstrap, prefix + DEAD_LETTERS.name, DEAD_LETTERS.partitions)
            if n == "DeadLetter"]
    # Dead letters are at least once, as every output: one the crashed sink made durable before
    # its insert is made again by its successor, which reads the batch again (when the bad block
    # was in the crashed batch: as the broker hands the partitions over). The record's identity
    # (its topic, partition and offset) makes them one.
    assert {(d["source_topic"], d["source_partition"], d["source_offset"], d["reason"]) for d in dead} == {
        (topic, bad_partition, bad_offset, "sample 0 of the block: utilization_pct 140.0 is outside 0..100")}
    assert 1 <= len(dead) <= 2


def writer_table():
    from sinks.clickhouse_ddl import GPU_SAMPLES_TABLE

    return GPU_SAMPLES_TABLE
