"""Workflows that stop get one WorkflowSummary each, equal to the totals of their samples,
even on partitions where nothing else arrives (idle partitions follow the busy ones)."""

from __future__ import annotations

import pytest

from producers.publish_kafka import Publisher
from producers.simulate.fleet import HEALTHY, build_fleet
from schemas.topics import GPU_SAMPLES, WORKFLOW_EVENTS, WORKFLOW_SUMMARIES
from tests.support.integration import CODEC, read_topic, running_sink, wait_until, worker_process
from tests.support.samples import BASE_MS


def test_stopped_workflows_are_summarised(kafka, prefix, tmp_path, chdb_client, database):
    fleet = build_fleet(seed=21, hosts=3, gpus_per_host=4, workflows=6)
    continuing = {w.workflow_id for w in fleet.workflows if w.profile is HEALTHY}
    stopping = {w.workflow_id for w in fleet.workflows} - continuing
    assert continuing and stopping
    pub = Publisher(kafka.bootstrap, CODEC)
    first = [s for t in range(180) for s in fleet.samples_at(t, BASE_MS, 1000)]
    later = [s for t in range(180, 360) for s in fleet.samples_at(t, BASE_MS, 1000) if s["workflow_id"] in continuing]
    pub.publish(GPU_SAMPLES, first + later, topic=prefix + GPU_SAMPLES.name)
    assert pub.flush() == 0

    def summaries():
        got = {r["workflow_id"]: r for *_, n, r in read_topic(
            kafka.bootstrap, prefix + WORKFLOW_SUMMARIES.name, WORKFLOW_SUMMARIES.partitions) if n == "WorkflowSummary"}
        return got if set(got) >= stopping else None

    with running_sink(kafka.bootstrap, prefix, chdb_client, database):
        with worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker", "--workflow-ended-s", "60",
                            "--idle-partition-s", "2", "--detector-min-s", "60", "--startup-max-s", "60") as worker:
            got = wait_until(summaries, 120, "summaries of the stopped workflows")
            assert worker.poll() is None
        wait_until(lambda: chdb_client.query(f"SELECT count() FROM {database}.workflow_summaries FINAL")
                   .result_rows[0][0] >= len(stopping), 60, "summaries in ClickHouse")

    assert set(got) == stopping  # the healthy ones are still running
    seen = [CODEC.decode(CODEC.encode("GpuSample", s))[1] for s in first]
    for wf in stopping:
        mine = [s for s in seen if s["workflow_id"] == wf]
        seconds = sum(s["interval_ms"] for s in mine) / 1000
        s = got[wf]
        assert s["windows"] == 3 and s["first_window_start"] == BASE_MS and s["last_window_end"] == BASE_MS + 180_000
        assert s["gpu_seconds"] == pytest.approx(seconds)
        assert s["utilization_mean_pct"] == pytest.approx(sum(x["utilization_pct"] for x in mine) / len(mine), rel=1e-6)
        assert s["wasted_gpu_seconds"] == pytest.approx(sum(1 - x["utilization_pct"] / 100 for x in mine), rel=1e-6)
        assert s["max_gpus"] == len(fleet.workflow(wf).gpus)
    idle = [w.workflow_id for w in fleet.workflows if w.profile.name == "idle"]
    assert got[idle[0]]["alerts_fired"] == ["idle_allocated"]  # one alert for its one cause


def test_a_workflow_its_agent_reported_ended_is_summarised(kafka, prefix, tmp_path):
    fleet = build_fleet(seed=21, hosts=3, gpus_per_host=4, workflows=6)
    idle = next(w for w in fleet.workflows if w.profile.name == "idle")
    continuing = {w.workflow_id for w in fleet.workflows if w.profile is HEALTHY}
    pub = Publisher(kafka.bootstrap, CODEC)
    first = [s for t in range(180) for s in fleet.samples_at(t, BASE_MS, 1000)]
    later = [s for t in range(180, 300) for s in fleet.samples_at(t, BASE_MS, 1000) if s["workflow_id"] in continuing]
    pub.publish(GPU_SAMPLES, first + later, topic=prefix + GPU_SAMPLES.name)
    host = idle.gpus[0].host
    event = {"workflow_id": idle.workflow_id, "host": host, "owner": idle.owner, "team": idle.team,
             "gpu_uuids": [g.uuid for g in idle.gpus], "pids": [1], "cmdline": None, "framework": None,
             "framework_version": None, "scheduler_job_id": None, "attribution": "env:GPUFLEET_WORKFLOW_ID"}
    pub.publish(WORKFLOW_EVENTS, [{**event, "event": "STARTED", "event_time": BASE_MS},
                                  {**event, "event": "ENDED", "event_time": BASE_MS + 181_000}],
                topic=prefix + WORKFLOW_EVENTS.name)
    assert pub.flush() == 0

    def summaries():
        got = {r["workflow_id"]: r for *_, n, r in read_topic(
            kafka.bootstrap, prefix + WORKFLOW_SUMMARIES.name, WORKFLOW_SUMMARIES.partitions) if n == "WorkflowSummary"}
        return got or None

    # Silence alone would take 10 minutes of event time: only the reported end summarises now.
    with worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker", "--idle-partition-s", "2") as worker:
        got = wait_until(summaries, 120, "the summary of the workflow whose agent said ENDED")
        assert worker.poll() is None
    assert set(got) == {idle.workflow_id}
    s = got[idle.workflow_id]
    assert s["end_reason"] == "its hosts reported it ended" and s["windows"] == 3
    assert s["utilization_mean_pct"] == 0.0 and s["wasted_gpu_seconds"] == pytest.approx(180 * len(idle.gpus))
