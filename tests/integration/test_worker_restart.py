"""A worker killed mid-window resumes from its changelog and still emits that window once, correctly."""

from __future__ import annotations

import signal

from producers.publish_kafka import Publisher
from producers.simulate.fleet import build_fleet
from schemas.topics import GPU_SAMPLES, WORKFLOW_WINDOWS
from tests.support.integration import (
    CODEC,
    committed_everything,
    read_topic,
    wait_until,
    worker_process,
)
from tests.support.samples import BASE_MS, assert_window_matches, expected_windows


def publish(kafka, prefix, fleet, ticks):
    pub = Publisher(kafka.bootstrap, CODEC)
    samples = [s for t in ticks for s in fleet.samples_at(t, BASE_MS, 1000)]
    pub.publish(GPU_SAMPLES, samples, topic=prefix + GPU_SAMPLES.name)
    assert pub.flush() == 0
    return samples


def windows_on_topic(kafka, prefix):
    return [r for *_, name, r in read_topic(kafka.bootstrap, prefix + WORKFLOW_WINDOWS.name,
                                            WORKFLOW_WINDOWS.partitions) if name == "WorkflowWindow"]


def test_killed_worker_resumes_mid_window(kafka, prefix, tmp_path):
    fleet = build_fleet(seed=5, hosts=2, gpus_per_host=4, workflows=4)
    app_id = f"{prefix}worker"
    topic = prefix + GPU_SAMPLES.name
    # Ticks 0..89: window 0 closes (watermark 79 s), window 1 is half full when the worker dies.
    first = publish(kafka, prefix, fleet, range(90))
    with worker_process(kafka.bootstrap, prefix, tmp_path, app_id) as worker:
        wait_until(lambda: len(windows_on_topic(kafka, prefix)) >= len(fleet.workflows), 90, "window 0")
        wait_until(lambda: committed_everything(kafka.bootstrap, app_id, GPU_SAMPLES, topic), 60,
                   "the worker to commit every sample")
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)

    rest = publish(kafka, prefix, fleet, range(90, 200))
    with worker_process(kafka.bootstrap, prefix, tmp_path, app_id) as worker:
        n = len(fleet.workflows) * 3
        wait_until(lambda: len(windows_on_topic(kafka, prefix)) >= n, 120, "windows 1 and 2 after restart")
        # ... and its consumer lag drains: a restarted worker once committed one offset per second.
        wait_until(lambda: committed_everything(kafka.bootstrap, app_id, GPU_SAMPLES, topic), 60,
                   "the restarted worker to commit every sample")
        assert worker.poll() is None

    seen = [CODEC.decode(CODEC.encode("GpuSample", s))[1] for s in first + rest]
    expected = {k: v for k, v in expected_windows(seen).items() if k[1] < BASE_MS + 180_000}
    emitted = windows_on_topic(kafka, prefix)
    keys = sorted((w["workflow_id"], w["window_start"]) for w in emitted)
    assert keys == sorted(expected), "every window exactly once, none lost across the kill"
    for w in emitted:
        # Window 1 straddles the kill: half its samples were only in the recovered state.
        assert_window_matches(w, expected[(w["workflow_id"], w["window_start"])])
