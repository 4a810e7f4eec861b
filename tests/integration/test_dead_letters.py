"""Malformed, impossible and too-late records reach the dead-letter topic with a reason;
the worker and the sink keep running."""

from __future__ import annotations

from confluent_kafka import Producer

from kafka_client.config import producer_config
from schemas.topics import (
    DEAD_LETTERS,
    GPU_SAMPLES,
    PROFILE_RESULTS,
    PROFILE_SCHEDULE,
    WORKFLOW_WINDOWS,
)
from tests.support.integration import CODEC, read_topic, running_sink, wait_until, worker_process
from tests.support.samples import BASE_MS, sample


def ticks(start_s, end_s):
    return [sample(event_time=BASE_MS + t * 1000, utilization_pct=float(t % 90)) for t in range(start_s, end_s)]


def test_bad_records_are_dead_lettered_and_processing_goes_on(kafka, prefix, tmp_path, chdb_client, database):
    topic = prefix + GPU_SAMPLES.name
    # One producer, so that the records keep this order on the workflow's partition.
    producer = Producer(producer_config(kafka.bootstrap))

    def send(records=(), raw=None):
        for r in records:
            producer.produce(topic, key=b"wf-a", value=CODEC.encode("GpuSample", r))
        if raw is not None:
            producer.produce(topic, key=b"wf-a", value=raw)

    send(ticks(0, 80))  # watermark 70 s: window 0 closed
    send([sample(event_time=BASE_MS + 5_000)])  # beyond the update horizon (5 s) of window 0
    send([sample(event_time=BASE_MS + 80_500, utilization_pct=-5.0)])
    send(raw=b"this is not avro")
    send(raw=CODEC.encode("GpuSample", sample())[:-9])  # truncated
    send(ticks(80, 140))  # window 1 must still close
    # The worker's own topics: a record a stage cannot use is dead-lettered there too.
    producer.produce(prefix + PROFILE_RESULTS.name, key=b"wf-a", value=b"\x00\x00\x00\x00\x63garbage")
    producer.produce(prefix + PROFILE_SCHEDULE.name, key=b"0", value=CODEC.encode("GpuSample", sample()))
    assert producer.flush(30) == 0

    with running_sink(kafka.bootstrap, prefix, chdb_client, database):
        with worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker",
                            "--update-horizon-s", "5") as worker:
            def worker_dead_letters():
                got = [r for *_, n, r in read_topic(kafka.bootstrap, prefix + DEAD_LETTERS.name, 1)
                       if n == "DeadLetter" and r["stage"] == "window-utilization"]
                return got if len(got) >= 4 else None

            def windows_0_and_1():
                got = [r for *_, n, r in read_topic(kafka.bootstrap, prefix + WORKFLOW_WINDOWS.name,
                                                    WORKFLOW_WINDOWS.partitions) if n == "WorkflowWindow"]
                return got if len(got) >= 2 else None

            def control_dead_letters():
                got = {r["stage"]: r for *_, n, r in read_topic(kafka.bootstrap, prefix + DEAD_LETTERS.name, 1)
                       if n == "DeadLetter" and r["stage"] in ("root-cause", "profile-scheduler")}
                return got if len(got) == 2 else None

            letters = wait_until(worker_dead_letters, 90, "4 dead letters from the worker")
            control = wait_until(control_dead_letters, 60, "dead letters from the root-cause and scheduler stages")
            windows = wait_until(windows_0_and_1, 60, "windows 0 and 1")
            assert worker.poll() is None, "the worker must survive bad input"
        wait_until(lambda: chdb_client.query(f"SELECT count() FROM {database}.dead_letters").result_rows[0][0] >= 7,
                   60, "dead letters from the worker and the sink in ClickHouse")

    assert "unknown schema id 99" in control["root-cause"]["reason"]
    assert control["profile-scheduler"]["reason"] == "expected ScheduleReport, got GpuSample"
    reasons = sorted(r["reason"] for r in letters)
    assert len(letters) == 4, reasons
    assert any("late sample" in r and "more than the update horizon (5000 ms) behind the watermark" in r
               and "no window takes it (a true measurement, kept in gpu_samples by the sink)" in r for r in reasons)
    assert any("utilization_pct -5.0 is outside 0..100" in r for r in reasons)
    assert any("not a gpufleet Avro message: it starts with byte 0x" in r for r in reasons)
    assert any("corrupt GpuSample v" in r and "payload" in r for r in reasons)
    for r in letters:
        assert r["source_topic"] == topic and r["value"] and r["source_offset"] >= 80

    # Window 0 was not changed by the late sample; window 1 closed after the bad records.
    by_start = {w["window_start"]: w for w in windows}
    assert by_start[BASE_MS]["sample_count"] == 60
    assert by_start[BASE_MS + 60_000]["sample_count"] == 60  # 60..119; the -5 % sample is not in it

    # The sink refused the same three undecodable/impossible records (the late one is a valid sample
    # for the raw table), and stored none of them.
    rows = chdb_client.query(f"SELECT stage, reason FROM {database}.dead_letters FINAL").result_rows
    assert sum(1 for stage, _ in rows if stage == "clickhouse-sink") == 3
    assert chdb_client.query(
        f"SELECT countIf(utilization_pct < 0), count() FROM {database}.gpu_samples").result_rows[0] == (0, 141)
    assert chdb_client.query(  # the late sample beside the tick of the same second: both measured, both kept
        f"SELECT count() FROM {database}.gpu_samples WHERE event_time = fromUnixTimestamp64Milli({BASE_MS + 5_000})"
    ).result_rows[0][0] == 2


def test_hostile_ids_are_dead_letters_at_every_stage_and_reach_no_table(kafka, prefix, tmp_path, chdb_client, database):
    """Ids come from jobs' environments: a newline in an owner once crashed the notifier on
    every restart. At ingest they are refused, by the worker and the sink alike."""
    from producers.publish_kafka import Publisher
    from schemas.topics import HOST_SAMPLES, WORKFLOW_EVENTS

    hostile = "ana\nBcc: everyone@example.com"
    pub = Publisher(kafka.bootstrap, CODEC)
    pub.publish(GPU_SAMPLES, [*ticks(0, 75), sample(event_time=BASE_MS + 75_000, owner=hostile),
                              sample(event_time=BASE_MS + 75_000, workflow_id="wf-<script>")],
                topic=prefix + GPU_SAMPLES.name)
    event = {"workflow_id": "wf-a", "event": "STARTED", "event_time": BASE_MS, "host": "gpu-host-000",
             "owner": hostile, "team": "vision", "gpu_uuids": ["GPU-0"], "pids": [1], "cmdline": None,
             "framework": None, "framework_version": None, "scheduler_job_id": None, "attribution": "env:X"}
    pub.publish(WORKFLOW_EVENTS, [event], topic=prefix + WORKFLOW_EVENTS.name)
    host = {"event_time": BASE_MS, "interval_ms": 1000, "host": "gpu\rhost", "cpu_count": 8, "cpu_pct": 1.0,
            "memory_used_bytes": 1, "memory_total_bytes": 2, "workflows": [], "spool_dropped_total": 0}
    pub.publish(HOST_SAMPLES, [host], topic=prefix + HOST_SAMPLES.name)
    assert pub.flush() == 0

    def letters():
        got = [(r["stage"], r["reason"]) for *_, n, r in read_topic(kafka.bootstrap, prefix + DEAD_LETTERS.name, 1)
               if n == "DeadLetter"]
        return got if len(got) >= 7 else None

    with running_sink(kafka.bootstrap, prefix, chdb_client, database), \
            worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker") as worker:
        got = wait_until(letters, 90, "the dead letters of the worker and the sink")
        wait_until(lambda: chdb_client.query(f"SELECT count() FROM {database}.gpu_samples").result_rows[0][0] >= 75,
                   60, "the good samples in ClickHouse")
        assert worker.poll() is None
    by_stage = sorted(stage for stage, _ in got)
    assert by_stage == ["clickhouse-sink"] * 4 + ["window-utilization"] * 2 + ["workflow-life-cycle"], got
    assert all("has the character U+000A" in reason or "U+003C" in reason or "U+000D" in reason for _, reason in got)
    for table in ("gpu_samples", "workflows", "host_samples"):
        text = str(chdb_client.query(f"SELECT * FROM {database}.{table}").result_rows)
        assert "Bcc" not in text and "<script>" not in text and "gpu\\rhost" not in text, table
