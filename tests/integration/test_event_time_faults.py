"""Bad clocks and late hosts on the real broker, worker and sink: a sample from the future is
dead-lettered without moving any watermark, and a host that was cut off and sends its backlog
later completes its windows instead of losing them."""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict

import pytest

from producers.publish_kafka import Publisher
from producers.simulate.fleet import HEALTHY, build_fleet
from schemas.topics import ALERTS, DEAD_LETTERS, GPU_SAMPLES, WORKFLOW_WINDOWS
from tests.support.integration import (
    CODEC,
    committed_everything,
    read_topic,
    running_sink,
    wait_until,
    worker_process,
)
from tests.support.samples import BASE_MS, sample

MINUTE = 60_000


def gpu_seconds(samples, before_ms):
    out: dict[str, float] = defaultdict(float)
    for s in samples:
        if s["event_time"] < before_ms:
            out[s["workflow_id"]] += s["interval_ms"] / 1000 * (s.get("share") or 1.0)
    return dict(out)


def stored(client, database, before_ms):
    rows = client.query(
        f"SELECT workflow_id, sum(gpu_seconds), max(version), count() FROM {database}.workflow_windows FINAL "
        f"WHERE window_start < fromUnixTimestamp64Milli({before_ms}) GROUP BY workflow_id").result_rows
    return {wf: (seconds, version, n) for wf, seconds, version, n in rows}


def test_a_host_cut_off_for_ten_minutes_ends_with_every_gpu_second_it_measured(
        kafka, prefix, tmp_path, chdb_client, database):
    fleet = build_fleet(seed=5, hosts=2, gpus_per_host=4, workflows=3)
    fleet = dataclasses.replace(fleet, workflows=tuple(dataclasses.replace(w, profile=HEALTHY)
                                                       for w in fleet.workflows))
    cut_host = "gpu-host-001"
    spanning = [w.workflow_id for w in fleet.workflows if len({g.host for g in w.gpus}) == 2]
    only_cut = [w.workflow_id for w in fleet.workflows if {g.host for g in w.gpus} == {cut_host}]
    assert spanning and only_cut, "the layout must have a workflow on both hosts and one on the cut-off host only"

    def ticks(first_s, last_s, host=None):
        return [s for t in range(first_s, last_s) for s in fleet.samples_at(t, BASE_MS, 1000)
                if host is None or s["host"] == host]

    def other(first_s, last_s):
        return [s for s in ticks(first_s, last_s) if s["host"] != cut_host]

    # Minutes 0-3 from everyone; 3-13 the cut-off host is silent while the other sends; then it
    # comes back and sends its backlog before its new samples, as the agent's spool does.
    order = ticks(0, 180) + other(180, 780) + ticks(180, 780, cut_host) + ticks(780, 1260)
    pub = Publisher(kafka.bootstrap, CODEC)
    pub.publish(GPU_SAMPLES, order, topic=prefix + GPU_SAMPLES.name)
    assert pub.flush() == 0
    closed_before = BASE_MS + 20 * MINUTE  # the watermark ends at 1249 s: windows up to 20 min close
    expected = gpu_seconds(order, closed_before)

    with running_sink(kafka.bootstrap, prefix, chdb_client, database), \
            worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker", "--idle-partition-s", "600"):
        def complete():
            got = stored(chdb_client, database, closed_before)
            return got if {wf: round(v[0], 6) for wf, v in got.items()} == {
                wf: round(v, 6) for wf, v in expected.items()} else None

        try:
            got = wait_until(complete, 120, "every GPU-second measured in workflow_windows")
        except AssertionError:
            per_window: dict[tuple, float] = defaultdict(float)
            for x in order:
                per_window[(x["workflow_id"], x["event_time"] // MINUTE * MINUTE)] += x["interval_ms"] / 1000
            rows = chdb_client.query(f"SELECT workflow_id, toUnixTimestamp64Milli(window_start), version, "
                                     f"gpu_seconds FROM {database}.workflow_windows FINAL").result_rows
            wrong = [(wf, (start - BASE_MS) // MINUTE, v, s, per_window[(wf, start)])
                     for wf, start, v, s in rows if abs(s - per_window[(wf, start)]) > 1e-6]
            pytest.fail(f"stored {stored(chdb_client, database, closed_before)}, published {expected}; "
                        f"windows (workflow, minute, version, stored, published) that differ: {wrong}")
    for wf in expected:
        assert got[wf][2] == 20, f"{wf}: one row per window"
    assert max(got[wf][1] for wf in spanning) >= 2, "the spanning workflow's windows were completed late"
    letters = [r for *_, n, r in read_topic(kafka.bootstrap, prefix + DEAD_LETTERS.name, 1) if n == "DeadLetter"]
    assert letters == [], [r["reason"] for r in letters]
    alerts = [r for *_, n, r in read_topic(kafka.bootstrap, prefix + ALERTS.name, ALERTS.partitions) if n == "Alert"]
    assert alerts == [], "healthy workflows whose data came late are not alerted"


def test_a_sample_from_the_future_poisons_nothing(kafka, prefix, tmp_path):
    now = int(time.time() * 1000) // MINUTE * MINUTE
    start = now - 10 * MINUTE
    workflows = ["wf-a", "wf-b", "wf-c", "wf-d"]  # on several partitions: the quiet-partition clock spreads
    pub = Publisher(kafka.bootstrap, CODEC)

    def ticks(first_s, last_s):
        return [sample(workflow_id=wf, gpu_uuid=f"GPU-{wf}", event_time=start + t * 1000)
                for t in range(first_s, last_s) for wf in workflows]

    year_ahead = sample(workflow_id="wf-a", gpu_uuid="GPU-wf-a", event_time=now + 365 * 86_400_000)
    pub.publish(GPU_SAMPLES, ticks(0, 150) + [year_ahead] + ticks(150, 400), topic=prefix + GPU_SAMPLES.name)
    assert pub.flush() == 0
    with worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker", "--idle-partition-s", "2") as worker:
        def windows():
            got = [r for *_, n, r in read_topic(kafka.bootstrap, prefix + WORKFLOW_WINDOWS.name,
                                                WORKFLOW_WINDOWS.partitions) if n == "WorkflowWindow"]
            return got if len(got) >= 6 * len(workflows) else None

        closed = wait_until(windows, 90, "windows 0-5 of every workflow")
        letters = wait_until(lambda: [r for *_, n, r in read_topic(kafka.bootstrap, prefix + DEAD_LETTERS.name, 1)
                                      if n == "DeadLetter"], 30, "the dead letter of the future sample")
        assert worker.poll() is None
    (letter,) = letters
    assert "ahead of the time Kafka received them" in letter["reason"] and "wf-a" in letter["reason"]
    by_key = {(w["workflow_id"], w["window_start"]): w for w in closed}
    for wf in workflows:
        for n in range(6):
            assert by_key[(wf, start + n * MINUTE)]["sample_count"] == 60, (wf, n)


def test_a_host_a_year_ahead_is_refused_by_the_worker_and_the_sink_alike(kafka, prefix, tmp_path, chdb_client,
                                                                          database):
    """One judgement of a sample (schemas.sample_columns.blocks_of): a host whose clock is a
    year ahead, among a normal fleet. Its client stamps its messages with its own clock; the
    samples topic keeps the broker's time instead (LogAppendTime), and the worker and the
    sink both refuse samples ahead of it with one reason, so none of them is stored anywhere
    as good data: not in gpu_samples, not in a window, not in a rollup."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, ConfigResource

    from kafka_client.config import client_config
    from schemas.sample_columns import NAME, columns_of
    from schemas.topics import key_of

    topic = prefix + GPU_SAMPLES.name
    fleet = build_fleet(seed=9, hosts=3, gpus_per_host=2, workflows=3)
    fleet = dataclasses.replace(fleet, workflows=tuple(dataclasses.replace(w, profile=HEALTHY)
                                                       for w in fleet.workflows))
    ahead_host, year = "gpu-host-002", 365 * 86_400_000
    STAGES = ("window-utilization", "clickhouse-sink")
    start = (int(time.time() * 1000) - 8 * MINUTE) // MINUTE * MINUTE
    samples = [s for t in range(420) for s in fleet.samples_at(t, start, 1000)]
    good = [s for s in samples if s["host"] != ahead_host]
    ahead = [{**s, "event_time": s["event_time"] + year} for s in samples if s["host"] == ahead_host]
    assert good and ahead
    blocks = columns_of(ahead)
    pub = Publisher(kafka.bootstrap, CODEC)
    # Half of the host's messages as a client with a right clock sends them (how it was found),
    # half as the host's own client does: stamped with its clock, a year ahead, which a broker
    # refuses on a topic that keeps the producers' times (log.message.timestamp.after.max.ms).
    pub.publish(GPU_SAMPLES, columns_of(good) + blocks[::2], topic=topic, schema=NAME)
    assert pub.flush() == 0
    skewed, refused = Producer(client_config(kafka.bootstrap)), []
    for block in blocks[1::2]:
        skewed.produce(topic, CODEC.encode(NAME, block), key=key_of(GPU_SAMPLES, block),
                       timestamp=block["event_time"][0], on_delivery=lambda err, _: err and refused.append(err))
    assert skewed.flush(30) == 0
    assert refused == [], f"the broker refused the skewed host's records: {refused[0]}"

    closed_before = start + 6 * MINUTE
    expected = gpu_seconds(good, closed_before)
    with running_sink(kafka.bootstrap, prefix, chdb_client, database), \
            worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker", "--idle-partition-s", "2"):
        wait_until(lambda: {wf: round(v[0], 6) for wf, v in stored(chdb_client, database, closed_before).items()}
                   == {wf: round(v, 6) for wf, v in expected.items()}, 120, "the good hosts' windows stored")

        q = chdb_client.query
        wait_until(lambda: committed_everything(kafka.bootstrap, f"{prefix}sink", GPU_SAMPLES, topic), 60,
                   "the sink through every sample message")
        assert q(f"SELECT count() FROM {database}.gpu_samples WHERE host = '{ahead_host}'").result_rows == [(0,)]

        def letters():
            got = [r for *_, n, r in read_topic(kafka.bootstrap, prefix + DEAD_LETTERS.name, 1) if n == "DeadLetter"]
            by_stage = defaultdict(list)
            for r in got:
                by_stage[r["stage"]].append(r)
            return by_stage if all(len(by_stage[s]) >= len(blocks) for s in STAGES) else None

        by_stage = wait_until(letters, 60, "a dead letter of each of the skewed host's messages from each stage")
    for stage in STAGES:
        assert len(by_stage[stage]) == len(blocks), stage
        assert all("ahead of the time Kafka received" in r["reason"] and ahead_host in r["reason"]
                   for r in by_stage[stage]), by_stage[stage][0]["reason"]
    assert q(f"SELECT count() FROM {database}.gpu_samples").result_rows == [(len(good),)]
    future = "now64(3) + INTERVAL 1 DAY"
    for table, column in (("gpu_samples", "event_time"), ("gpu_hours_hourly", "hour"), ("gpu_hours_daily", "day"),
                          ("workflow_windows", "window_start"), ("goodput_hourly", "period")):
        assert q(f"SELECT count() FROM {database}.{table} WHERE {column} > {future}").result_rows == [(0,)], table
    admin = AdminClient(client_config(kafka.bootstrap))
    (described,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
    assert described.result(10)["message.timestamp.type"].value == "LogAppendTime"
