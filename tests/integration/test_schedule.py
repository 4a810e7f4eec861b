"""Periodic profiling through the real worker: every running workflow is profiled, never more
than the budget at once, and a restarted worker does not profile again what was just profiled.

The test plays the agents: it answers each periodic request with a trace our hook recorded on
an H200, so the analysis lands and the scheduler's slot is freed the way it is in production.
"""

from __future__ import annotations

import time

from producers.publish_kafka import Publisher
from producers.simulate.fleet import build_fleet
from producers.simulate.run import SimulationPlan, run_simulation
from producers.traces.publish import publish_trace
from schemas.topics import GPU_SAMPLES, PROFILE_REQUESTS, trace_id_of
from tests.support.integration import CODEC, read_topic, wait_until, worker_process
from tests.support.samples import BASE_MS
from tests.support.traces import HOOK_TRACE as TRACE

OPTIONS = ("--schedule-report-s", "1", "--profile-budget", "0.25", "--profile-every-s", "3600",
           "--detector-min-s", "3600")  # no alert (and no automatic profile) in these 3 minutes


def periodic(bootstrap: str, topic: str) -> list[dict]:
    return [r for *_, name, r in read_topic(bootstrap, topic, PROFILE_REQUESTS.partitions)
            if name == "ProfileRequest" and r["reason"] == "PERIODIC"]


def test_every_workflow_is_profiled_within_the_budget_and_a_restart_repeats_none(kafka, prefix, tmp_path):
    fleet = build_fleet(seed=5, hosts=2, gpus_per_host=4, workflows=8)
    running = {w.workflow_id for w in fleet.workflows}
    budget = int(0.25 * len(running))
    run_simulation(fleet, SimulationPlan(start_ms=BASE_MS, ticks=180, interval_ms=1000, speed=0),
                   Publisher(kafka.bootstrap, CODEC), topic=prefix + GPU_SAMPLES.name)
    topic = prefix + PROFILE_REQUESTS.name
    answered: list[str] = []
    agent = Publisher(kafka.bootstrap, CODEC)
    with worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker", *OPTIONS) as worker:
        deadline = time.monotonic() + 150
        while len(answered) < len(running):
            assert time.monotonic() < deadline, f"only {len(answered)} of {len(running)} workflows were profiled"
            assert worker.poll() is None, worker.log_path.read_text()[-3000:]
            requests = periodic(kafka.bootstrap, topic)
            new = [r for r in requests if r["request_id"] not in answered]
            # Each request is answered as soon as it is seen: the ones still open are in flight.
            assert len(new) <= budget, f"{len(new)} profiles at once, over the budget of {budget}"
            for r in new:
                publish_trace(TRACE, r["workflow_id"], agent, prefix, trace_id_of(r["request_id"], "host-x", 0))
                answered.append(r["request_id"])
            agent.flush()
            time.sleep(0.5)
        profiled = [r["workflow_id"] for r in periodic(kafka.bootstrap, topic)]
        assert sorted(profiled) == sorted(running), "each workflow once"

    # A new worker takes the schedule over from the changelog: nothing is due within the hour.
    # The scheduler writes each partition's report to its changelog, then asks for what is due:
    # three rounds of reports on the changelog after the restart, and it has decided three times.
    changelog = f"{prefix}worker-profile-schedule-changelog"
    log_before = worker.log_path.stat().st_size  # both workers write to the same log
    with worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker", *OPTIONS) as worker:
        wait_until(lambda: worker.log_path.read_text().count("[^Worker]: Ready") >= 2 or worker.poll() is not None,
                   60, "the restarted worker")
        reports = len(read_topic(kafka.bootstrap, changelog, 1))
        partitions = GPU_SAMPLES.partitions
        wait_until(lambda: len(read_topic(kafka.bootstrap, changelog, 1)) >= reports + 3 * partitions
                   or worker.poll() is not None, 60, "three rounds of the restarted scheduler")
        assert worker.poll() is None
        with worker.log_path.open() as f:
            f.seek(log_before)
            restarted = f.read()
        assert "periodic profile of" not in restarted, restarted[-2000:]
        assert len(periodic(kafka.bootstrap, topic)) == len(running)
