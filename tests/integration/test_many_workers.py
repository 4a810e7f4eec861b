"""Several workers in one group: a partition whose samples stopped closes its windows even
on a worker that owns nothing else, and windows and alerts stay exact when a worker joins
and when one is killed with SIGKILL."""

from __future__ import annotations

import signal
import uuid
from collections import defaultdict

from confluent_kafka import Producer

from kafka_client.admin import ensure_topics
from kafka_client.config import producer_config
from producers.publish_kafka import Publisher
from producers.simulate.fleet import build_fleet
from schemas.topics import ALERTS, GPU_SAMPLES, WORKFLOW_SUMMARIES, WORKFLOW_WINDOWS
from tests.support.consumer_groups import group_members
from tests.support.integration import (
    CODEC,
    committed_everything,
    read_topic,
    wait_until,
    worker_process,
)
from tests.support.samples import BASE_MS, sample


def records(bootstrap, topic, partitions, name):
    return [r for *_, n, r in read_topic(bootstrap, topic, partitions) if n == name]


def test_a_worker_that_owns_only_a_quiet_partition_closes_its_windows(kafka, tmp_path):
    prefix = f"t{uuid.uuid4().hex[:10]}."
    ensure_topics(kafka.bootstrap, prefix=prefix, partitions=2)
    samples_topic = prefix + GPU_SAMPLES.name
    app_id = f"{prefix}worker"
    options = ("--idle-partition-s", "5", "--workflow-ended-s", "120")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with worker_process(kafka.bootstrap, prefix, tmp_path / "a", app_id, *options), \
            worker_process(kafka.bootstrap, prefix, tmp_path / "b", app_id, *options):
        def one_partition_each():
            members = group_members(kafka.bootstrap, app_id)
            owned = [{p for t, p in m if t == samples_topic} for m in members]
            return len(owned) == 2 and sorted(map(sorted, owned)) == [[0], [1]]

        wait_until(one_partition_each, 90, "two workers owning one sample partition each")
        producer = Producer(producer_config(kafka.bootstrap))
        for t in range(400):
            producer.produce(samples_topic, partition=0, key=b"wf-busy", value=CODEC.encode(
                "GpuSample", sample(workflow_id="wf-busy", event_time=BASE_MS + t * 1000)))
            if t < 90:  # then its samples stop: the partition goes quiet
                producer.produce(samples_topic, partition=1, key=b"wf-quiet", value=CODEC.encode(
                    "GpuSample", sample(workflow_id="wf-quiet", event_time=BASE_MS + t * 1000)))
        assert producer.flush(30) == 0

        def quiet_windows():
            got = {w["window_start"] for w in records(kafka.bootstrap, prefix + WORKFLOW_WINDOWS.name, 2,
                                                      "WorkflowWindow") if w["workflow_id"] == "wf-quiet"}
            return got if got == {BASE_MS, BASE_MS + 60_000} else None

        wait_until(quiet_windows, 90, "both windows of the workflow on the quiet partition")
        summaries = wait_until(lambda: [s for s in records(kafka.bootstrap, prefix + WORKFLOW_SUMMARIES.name, 2,
                                                           "WorkflowSummary") if s["workflow_id"] == "wf-quiet"],
                               60, "the summary of the workflow that stopped")
    assert summaries[0]["gpu_seconds"] == 90.0


class Group:
    """A simulated fleet's samples, published a stretch at a time to ``prefix``'s samples topic,
    and the group of workers that reads them."""

    options = ("--detector-min-s", "120", "--idle-partition-s", "5")

    def __init__(self, kafka, prefix: str) -> None:
        self.fleet = build_fleet(seed=21, hosts=2, gpus_per_host=4, workflows=6)
        self.bootstrap, self.prefix = kafka.bootstrap, prefix
        self.pub = Publisher(kafka.bootstrap, CODEC)
        self.app_id = f"{prefix}worker"
        self.samples_topic = prefix + GPU_SAMPLES.name

    def publish(self, first_s: int, last_s: int) -> None:
        self.pub.publish(GPU_SAMPLES, [s for t in range(first_s, last_s)
                                       for s in self.fleet.samples_at(t, BASE_MS, 1000)], topic=self.samples_topic)
        assert self.pub.flush() == 0

    def members(self) -> int:
        return len([m for m in group_members(self.bootstrap, self.app_id) if m])

    def committed(self) -> bool:
        return committed_everything(self.bootstrap, self.app_id, GPU_SAMPLES, self.samples_topic)

    def worker(self, data_dir):
        data_dir.mkdir()
        return worker_process(self.bootstrap, self.prefix, data_dir, self.app_id, *self.options)


def test_windows_and_alerts_stay_exact_when_a_worker_joins_and_one_is_killed(kafka, prefix, tmp_path):
    group = Group(kafka, prefix)
    fleet, publish, members = group.fleet, group.publish, group.members

    publish(0, 200)
    with group.worker(tmp_path / "a") as first:
        wait_until(lambda: members() == 1, 90, "the first worker in the group")
        with group.worker(tmp_path / "b"):
            wait_until(lambda: members() == 2, 90, "the second worker to join and take partitions")
            publish(200, 400)
            wait_until(group.committed, 90, "both workers to commit the samples so far")
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            publish(400, 600)
            wait_until(group.committed, 120, "the worker left to take over and commit everything")
            last_window = BASE_MS + 8 * 60_000

            def all_windows():
                got = records(kafka.bootstrap, prefix + WORKFLOW_WINDOWS.name, WORKFLOW_WINDOWS.partitions,
                              "WorkflowWindow")
                keys = {(w["workflow_id"], w["window_start"]) for w in got}
                return got if all((w.workflow_id, last_window) in keys for w in fleet.workflows) else None

            windows = wait_until(all_windows, 90, "window 8 of every workflow")
    emissions = defaultdict(list)
    for w in windows:
        emissions[(w["workflow_id"], w["window_start"], w["version"])].append(
            {k: v for k, v in w.items() if k != "closed_at"})
    for (wf, start, version), copies in emissions.items():
        gpus = len(fleet.workflow(wf).gpus)
        assert all(c == copies[0] for c in copies), f"{wf} window {start}: a replay emitted other numbers"
        assert copies[0]["sample_count"] == 60 * gpus and copies[0]["gpu_count"] == gpus, (wf, start)
        assert version == 1, "no sample came late: every window is whole when it first closes"
    missing = {(w.workflow_id, BASE_MS + n * 60_000) for w in fleet.workflows for n in range(9)} - {
        (wf, start) for wf, start, _ in emissions}
    assert not missing, f"windows never emitted: {sorted((wf, (s - BASE_MS) // 60_000) for wf, s in missing)}"
    alerts = records(kafka.bootstrap, prefix + ALERTS.name, ALERTS.partitions, "Alert")
    episodes = defaultdict(set)
    for a in alerts:
        if a["status"] == "FIRING":
            episodes[(a["workflow_id"], a["detector"])].add(a["alert_id"])
    assert episodes and all(len(ids) == 1 for ids in episodes.values()), episodes


def test_a_worker_that_joins_and_leaves_again_and_again_never_stalls_the_other(kafka, prefix, tmp_path):
    """Each join and each leave is a rebalance in which the first worker restores the windows it
    keeps from their changelogs; none of those recoveries may wait for records the Kafka client
    took and faust dropped (``streams.faust_fixes``, fix 9: at the first join in a loop like
    this one under load, before it)."""
    group = Group(kafka, prefix)
    publish, members = group.publish, group.members
    publish(0, 200)
    with group.worker(tmp_path / "a") as first:
        wait_until(lambda: members() == 1, 90, "the first worker in the group")
        for cycle in range(3):
            with group.worker(tmp_path / f"b{cycle}"):
                wait_until(lambda: members() == 2, 90, f"join {cycle}: the second worker in the group")
                publish(200 + 90 * cycle, 260 + 90 * cycle)
                wait_until(group.committed, 90, f"join {cycle}: both workers to commit the samples so far")
            wait_until(lambda: members() == 1, 90, f"leave {cycle}: the second worker gone")
            publish(260 + 90 * cycle, 290 + 90 * cycle)
            wait_until(group.committed, 90, f"leave {cycle}: the first worker alone to commit the samples so far")
        assert "No event received for active tp" not in first.log_path.read_text()
