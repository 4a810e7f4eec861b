"""A worker killed in the middle of an alert episode, and restarted, tells the owner once.

The worker is SIGKILLed as soon as its first alerts are on the topic (before it can commit
the samples behind them), so the restarted worker replays those windows; the episode's
state in the changelog and the notifier's sent-log must keep every message single.
"""

from __future__ import annotations

import signal
from collections import Counter

from producers.publish_kafka import Publisher
from producers.simulate.fleet import HEALTHY, build_fleet
from schemas.topics import ALERTS, GPU_SAMPLES, WORKFLOW_WINDOWS
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


def alerts_on_topic(kafka, prefix):
    return [r for *_, n, r in read_topic(kafka.bootstrap, prefix + ALERTS.name, ALERTS.partitions) if n == "Alert"]


def test_restarted_worker_sends_no_duplicate_notification(kafka, prefix, tmp_path):
    fleet = build_fleet(seed=21, hosts=2, gpus_per_host=4, workflows=4)
    wasteful = {w.workflow_id for w in fleet.workflows if w.profile is not HEALTHY}
    assert wasteful
    thread, stop, http = start_notifier(kafka.bootstrap, prefix, tmp_path)
    pub = Publisher(kafka.bootstrap, CODEC)
    app_id = f"{prefix}worker"
    # A job idle from its start counts as starting for its first minute here (15 in production).
    options = ("--detector-min-s", "120", "--idle-partition-s", "2", "--startup-max-s", "60")
    try:
        # Alerts fire when window 1 (60-120 s) closes; the episode goes on through tick 400.
        pub.publish(GPU_SAMPLES, [s for t in range(200) for s in fleet.samples_at(t, BASE_MS, 1000)],
                    topic=prefix + GPU_SAMPLES.name)
        assert pub.flush() == 0
        with worker_process(kafka.bootstrap, prefix, tmp_path, app_id, *options) as worker:
            wait_until(lambda: any(a["status"] == "FIRING" for a in alerts_on_topic(kafka, prefix)), 90,
                       "the first alerts", interval=0.1)
            worker.send_signal(signal.SIGKILL)
            worker.wait(10)
        before = [a for a in alerts_on_topic(kafka, prefix) if a["status"] == "FIRING"]

        pub.publish(GPU_SAMPLES, [s for t in range(200, 400) for s in fleet.samples_at(t, BASE_MS, 1000)],
                    topic=prefix + GPU_SAMPLES.name)
        assert pub.flush() == 0
        with worker_process(kafka.bootstrap, prefix, tmp_path, app_id, *options) as worker:
            wait_until(lambda: committed_everything(kafka.bootstrap, app_id, GPU_SAMPLES, prefix + GPU_SAMPLES.name),
                       90, "the restarted worker to commit every sample")
            last = BASE_MS + 300_000  # window 5 closes at watermark 310 s; the samples reach 399 s
            wait_until(lambda: {w["workflow_id"] for *_, n, w in read_topic(
                kafka.bootstrap, prefix + WORKFLOW_WINDOWS.name, WORKFLOW_WINDOWS.partitions)
                if n == "WorkflowWindow" and w["window_start"] == last} >= {w.workflow_id for w in fleet.workflows}, 90,
                "window 5 of every workflow")
            assert worker.poll() is None
        firing = [a for a in alerts_on_topic(kafka, prefix) if a["status"] == "FIRING"]
        episodes = {(a["workflow_id"], a["detector"]) for a in firing}
        wait_until(lambda: {(m["workflow_id"], m["detector"]) for m in Hook.received} >= episodes, 60,
                   "the notifier to deliver every episode")
    finally:
        stop.set()
        thread.join(30)
        http.shutdown()

    assert before, "the worker was killed after its first alerts"
    assert {wf for wf, _ in episodes} == wasteful
    assert all(a["status"] == "FIRING" for a in Hook.received)
    counts = Counter((m["workflow_id"], m["detector"]) for m in Hook.received)
    assert counts == Counter(dict.fromkeys(episodes, 1)), "each episode told to its owner exactly once"
    assert {a["alert_id"] for a in firing} == {m["alert_id"] for m in Hook.received}, "one alert id per episode"
