"""The fleet under faults, on a real 3-broker cluster: 3 workers and 2 sinks under a steady
simulated load; one broker, then one worker, then one sink is killed and started again.
Afterwards every published sample is counted exactly once (in gpu_samples, and as GPU-seconds
per workflow in workflow_windows FINAL), one row per window, each alert episode notified at
most once, and nothing dead-lettered.

The two sinks share one embedded ClickHouse, which allows one process per data directory, so
they run as threads of this process: the one "killed" stops dead after an insert and before
its commit (its thread never returns; the group drops it once it has not polled for 10 s), the
worst moment for a sink. With a ClickHouse server they would be processes like the workers."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import signal
import threading
from collections import Counter, defaultdict

import pytest

from gpufleet.local import kafka as local_kafka
from kafka_client.admin import ensure_topics
from producers.publish_kafka import Publisher
from producers.simulate.fleet import HEALTHY, IDLE, build_fleet
from schemas.topics import ALERTS, DEAD_LETTERS, GPU_SAMPLES, WORKFLOW_WINDOWS
from sinks.consume_to_clickhouse import ClickHouseSink
from sinks.write_clickhouse import ClickHouseWriter
from tests.support.consumer_groups import group_members
from tests.support.integration import (
    CODEC,
    Hook,
    committed_everything,
    read_topic,
    start_notifier,
    wait_until,
    worker_process,
)
from tests.support.samples import BASE_MS

PARTITIONS = 6
TICKS_PER_S = 20
# A job idle from its start counts as starting for its first minute here (15 in production).
WORKER_OPTIONS = ("--detector-min-s", "120", "--idle-partition-s", "5", "--startup-max-s", "60")


class DyingSink(ClickHouseSink):
    """Stops dead after its next insert, before committing, once ``die`` is set."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.die = threading.Event()
        self.dead = threading.Event()
        self.release = threading.Event()

    def run(self, stop):
        try:
            return super().run(stop)
        except SystemExit:
            return self.stats

    def _commit(self, messages) -> None:
        if self.die.is_set():
            self.dead.set()
            self.release.wait()  # never polls again: the group drops it
            raise SystemExit("this sink died between an insert and its commit")
        super()._commit(messages)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("fleet") / "kafka"
    info = local_kafka.start(data_dir, brokers=3, heap="384m")
    yield info
    local_kafka.stop(data_dir)


def start_sink(cls, cluster, prefix, client, database):
    # A sink that stops polling leaves the group after 10 s (the default is 5 minutes).
    sink = cls(cluster.bootstrap, ClickHouseWriter(client, database), group_id=f"{prefix}sink", topic_prefix=prefix,
               batch_wait_s=0.3, consumer_overrides={"max.poll.interval.ms": 10_000, "session.timeout.ms": 10_000})
    stop = threading.Event()
    thread = threading.Thread(target=sink.run, args=(stop,), daemon=True)
    thread.start()
    return sink, stop, thread


def members(cluster, group):
    return len([m for m in group_members(cluster.bootstrap, group) if m])


def test_nothing_is_lost_or_doubled_when_a_broker_a_worker_and_a_sink_are_killed(
        cluster, tmp_path, chdb_client, database):
    prefix = "faults."
    ensure_topics(cluster.bootstrap, prefix=prefix, partitions=PARTITIONS)
    fleet = build_fleet(seed=8, hosts=4, gpus_per_host=4, workflows=6)
    profiles = [IDLE] + [HEALTHY] * 5  # one workflow holds its GPUs idle: it is alerted
    fleet = dataclasses.replace(fleet, workflows=tuple(
        dataclasses.replace(w, profile=p) for w, p in zip(fleet.workflows, profiles)))
    app_id = f"{prefix}worker"
    samples_topic = prefix + GPU_SAMPLES.name
    ClickHouseWriter(chdb_client, database).ensure_tables()

    notifying, stop_notifier, http = start_notifier(cluster.bootstrap, prefix, tmp_path)

    published: list[dict] = []
    stop_publishing = threading.Event()

    def publish():
        pub = Publisher(cluster.bootstrap, CODEC)
        tick = 0
        while not stop_publishing.is_set():
            samples = list(fleet.samples_at(tick, BASE_MS, 1000))
            pub.publish(GPU_SAMPLES, samples, topic=samples_topic)
            published.extend(samples)
            tick += 1
            stop_publishing.wait(1 / TICKS_PER_S)  # the load's pace; ends at once when told to stop
        assert pub.flush(300) == 0, "every sample acknowledged"

    def worker(name):
        (tmp_path / name).mkdir()
        return stack.enter_context(worker_process(cluster.bootstrap, prefix, tmp_path / name, app_id, *WORKER_OPTIONS))

    stack = contextlib.ExitStack()
    sinks = []
    try:
        workers = [worker(n) for n in "abc"]
        wait_until(lambda: members(cluster, app_id) == 3, 120, "three workers sharing the partitions")
        dying = start_sink(DyingSink, cluster, prefix, chdb_client, database)
        sinks = [dying, start_sink(ClickHouseSink, cluster, prefix, chdb_client, database)]
        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        wait_until(lambda: len(published) > 100 * 16, 60, "the load to run")

        # A broker.
        leaders = [p.leader for p in _topic(cluster, samples_topic).partitions.values()]
        broker = max(set(leaders), key=leaders.count)
        assert local_kafka.kill_node(cluster.data_dir, broker, signal.SIGKILL)
        moving = len(published)
        wait_until(lambda: len(published) > moving + 200, 120, "producers to move with a broker down")
        local_kafka.start_node(cluster.data_dir, broker)
        local_kafka.wait_for(cluster.data_dir, 120)

        # A worker.
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait(10)
        wait_until(
            lambda: members(cluster, app_id) == 2, 120, "the two workers left to take the killed one's partitions"
        )
        worker("d")
        wait_until(lambda: members(cluster, app_id) == 3, 120, "a new worker in the group")

        # A sink.
        dying[0].die.set()
        wait_until(dying[0].dead.is_set, 60, "the sink to die between an insert and its commit")
        wait_until(lambda: members(cluster, f"{prefix}sink") == 1, 120, "the sink group to drop the dead sink")
        sinks.append(start_sink(ClickHouseSink, cluster, prefix, chdb_client, database))
        restarted = len(published)
        wait_until(lambda: len(published) > restarted + 5 * TICKS_PER_S * 16, 60, "more load after the faults")
        stop_publishing.set()
        publisher.join(300)
        last = max(s["event_time"] for s in published)
        closed_before = (last - 10_000) // 60_000 * 60_000  # every window before it has closed
        expected = defaultdict(float)
        for s in published:
            if s["event_time"] < closed_before:
                expected[s["workflow_id"]] += s["interval_ms"] / 1000
        windows_per_workflow = (closed_before - BASE_MS) // 60_000

        wait_until(lambda: committed_everything(cluster.bootstrap, app_id, GPU_SAMPLES, samples_topic), 180,
                   "the workers to commit every sample")

        def stored():
            rows = chdb_client.query(
                f"SELECT workflow_id, sum(gpu_seconds), count() FROM {database}.workflow_windows FINAL "
                f"WHERE window_start < fromUnixTimestamp64Milli({closed_before}) GROUP BY workflow_id").result_rows
            got = {wf: (round(s, 6), n) for wf, s, n in rows}
            want = {wf: (round(s, 6), windows_per_workflow) for wf, s in expected.items()}
            return got if got == want else None

        try:
            wait_until(stored, 180, "every GPU-second of every closed window in ClickHouse, one row per window")
        except AssertionError:
            pytest.fail(_differences(chdb_client, database, published, closed_before, cluster, prefix, tmp_path))
        idle = fleet.workflows[0].workflow_id
        wait_until(lambda: any((m["workflow_id"], m["detector"]) == (idle, "idle_allocated") for m in Hook.received),
                   60, "the owner of the idle workflow to be told")
        assert notifying.is_alive(), "the notifier survived the faults"
        raw = chdb_client.query(f"SELECT count() FROM {database}.gpu_samples").result_rows[0][0]
        wait_until(lambda: chdb_client.query(f"SELECT count() FROM {database}.gpu_samples").result_rows[0][0]
                   == len(published), 120, f"every raw sample stored once ({raw} of {len(published)} so far)")
    finally:
        stop_publishing.set()
        for sink, stop, thread in sinks:
            if isinstance(sink, DyingSink):
                sink.release.set()
            stop.set()
            thread.join(30)
        stack.close()
        stop_notifier.set()
        http.shutdown()

    letters = read_topic(cluster.bootstrap, prefix + DEAD_LETTERS.name, 1)
    assert letters == [], [r for *_, r in letters]
    alerts = [r for *_, n, r in read_topic(cluster.bootstrap, prefix + ALERTS.name, ALERTS.partitions) if n == "Alert"]
    episodes = defaultdict(set)
    for a in alerts:
        if a["status"] == "FIRING":
            episodes[(a["workflow_id"], a["detector"])].add(a["alert_id"])
    assert (idle, "idle_allocated") in episodes and all(len(ids) == 1 for ids in episodes.values()), episodes
    notified = Counter((m["workflow_id"], m["detector"], m["status"]) for m in Hook.received)
    assert all(n == 1 for n in notified.values()), notified
    windows = read_topic(cluster.bootstrap, prefix + WORKFLOW_WINDOWS.name, WORKFLOW_WINDOWS.partitions)
    assert windows, "windows were emitted"


def _topic(cluster, name):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(timeout=10).topics[name]


def _differences(client, database, published, closed_before, cluster, prefix, logs) -> str:
    """Which windows ClickHouse and the published samples disagree on, every emission of them,
    the dead letters, and what the workers logged about partitions changing hands."""
    want: dict[tuple, float] = defaultdict(float)
    for s in published:
        if s["event_time"] < closed_before:
            want[(s["workflow_id"], s["event_time"] // 60_000 * 60_000)] += s["interval_ms"] / 1000
    rows = client.query(f"SELECT workflow_id, toUnixTimestamp64Milli(window_start), version, gpu_seconds "
                        f"FROM {database}.workflow_windows FINAL").result_rows
    got = {(wf, start): (v, sec) for wf, start, v, sec in rows}
    wrong = {k: (got.get(k), round(v, 3)) for k, v in want.items() if got.get(k) is None or abs(got[k][1] - v) > 1e-6}
    emitted = [(w["workflow_id"], w["window_start"], w["version"], w["gpu_seconds"], w["closed_at"])
               for *_, n, w in read_topic(cluster.bootstrap, prefix + WORKFLOW_WINDOWS.name, PARTITIONS)
               if n == "WorkflowWindow" and (w["workflow_id"], w["window_start"]) in wrong]
    letters = [r for *_, r in read_topic(cluster.bootstrap, prefix + DEAD_LETTERS.name, 1)]
    notable = re.compile(r"dropped the state|reading again|rebalance again|generation id|window-utilization:|"
                         r"first samples|starts anew|Recovery complete|Revoking|overlapping|StateWrite|Traceback")
    logged = [f"{path.parent.name}: {line.strip()[:300]}" for path in sorted(logs.glob("*/*.log"))
              for line in path.read_text(errors="replace").splitlines() if notable.search(line)]
    return (f"windows (stored version, seconds), published seconds: {wrong}; their emissions: {sorted(emitted)}; "
            f"dead letters: {letters[:5]} ({len(letters)}); the workers logged:\n" + "\n".join(logged[-150:]))
