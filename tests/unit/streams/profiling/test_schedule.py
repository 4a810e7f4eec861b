"""The periodic profiling scheduler over simulated days of a 1,000-workflow fleet."""

import itertools
import json
import random

import pytest

from streams.profiling.schedule import ProfileScheduler, ScheduleConfig

MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR


def fleet(seed=3, workflows=1000, days=3):
    """(workflow, start, end): a third runs the whole time, the rest come and go (1-30 h)."""
    rng = random.Random(seed)
    out = []
    for n in range(workflows):
        if n % 3 == 0:
            out.append((f"wf-{n:04d}", 0, days * DAY))
        else:
            start = rng.randrange(0, days * DAY - HOUR)
            out.append((f"wf-{n:04d}", start, min(days * DAY, start + rng.randrange(HOUR, 30 * HOUR))))
    return out


def simulate(config, jobs, days=3, step=MINUTE, restart_at=None, finish_after=2 * MINUTE):
    """Run the scheduler every ``step``; profiles finish ``finish_after`` later (their status
    arrives: a 30 s capture, its upload and analysis). With 2 % of the fleet at a time that is
    capacity for 3.6 profiles per workflow per interval. Returns the profiles (workflow, time)
    and the most ever running at once."""
    scheduler = ProfileScheduler(config)
    profiles, peak, running_profiles = [], 0, {}
    for now in range(0, days * DAY, step):
        if restart_at is not None and now == restart_at:
            scheduler = ProfileScheduler(config, json.loads(json.dumps(scheduler.state)))  # via the changelog
        for wf, done in [(wf, t) for wf, t in running_profiles.items() if t <= now]:
            scheduler.finished(wf)
            del running_profiles[wf]
        running = {wf for wf, start, end in jobs if start <= now < end}
        for wf in scheduler.due(running, now):
            profiles.append((wf, now))
            running_profiles[wf] = now + finish_after
        in_flight = sum(1 for wf in running_profiles if wf in running)
        assert in_flight <= scheduler.budget(len(running)), "over the budget"
        peak = max(peak, in_flight)
    return profiles, peak


@pytest.fixture(scope="module")
def jobs():
    return fleet()


@pytest.fixture(scope="module")
def schedule(jobs):
    return simulate(ScheduleConfig(seed=7), jobs)


def test_every_workflow_is_profiled_within_the_interval_and_not_more_often(jobs, schedule):
    profiles, _ = schedule
    interval = 6 * HOUR
    by_wf = {}
    for wf, t in profiles:
        by_wf.setdefault(wf, []).append(t)
    for wf, start, end in jobs:
        times = by_wf.get(wf, [])
        if end - start >= interval:
            assert times and times[0] - start <= interval, f"{wf} waited too long for its first profile"
        # While it runs, the gaps are at least the interval and never much more.
        for a, b in itertools.pairwise(times):
            assert interval <= b - a <= interval + 30 * MINUTE, (wf, a, b)
        if times and end - times[-1] > interval + 30 * MINUTE:
            raise AssertionError(f"{wf} was not profiled again for {(end - times[-1]) / HOUR:.1f} h")
    assert len(profiles) > 1000


def test_the_budget_is_two_percent_of_the_running_workflows(schedule):
    _, peak = schedule
    assert 1 <= peak <= 0.02 * 1000


def test_the_schedule_is_deterministic_under_a_seed(jobs, schedule):
    assert simulate(ScheduleConfig(seed=7), jobs, days=1)[0] == [p for p in schedule[0] if p[1] < DAY]
    assert simulate(ScheduleConfig(seed=8), jobs, days=1)[0] != [p for p in schedule[0] if p[1] < DAY]


def test_a_restart_from_the_saved_state_changes_nothing(jobs, schedule):
    restarted, _ = simulate(ScheduleConfig(seed=7), jobs, restart_at=DAY + 17 * MINUTE)
    assert restarted == schedule[0]
    # Without the state, the restarted scheduler would profile again what was just profiled.
    fresh = ProfileScheduler(ScheduleConfig(seed=7))
    just_done = {wf for wf, t in schedule[0] if DAY - HOUR <= t < DAY}
    running = {wf for wf, start, end in jobs if start <= DAY < end}
    assert set(fresh.due(running, DAY)) & just_done


def test_a_profile_without_a_final_status_frees_its_slot_after_the_timeout():
    scheduler = ProfileScheduler(ScheduleConfig(timeout_s=600, interval_s=3600))
    running = {"wf-a", "wf-b"}
    (first,) = scheduler.due(running, 0)  # a budget of one
    assert scheduler.due(running, 599_000) == []  # its slot is held: no status came
    assert scheduler.due(running, 600_000) == list(running - {first})  # freed by the timeout
    assert scheduler.due(running, 1_200_000) == []  # and neither is due again within the hour


def report(partition, running, at, finished=()):
    return {"source_partition": partition, "at": at, "running": list(running), "finished": list(finished)}


def test_the_fleet_schedule_takes_the_union_of_fresh_partition_reports():
    from schemas.codec import Codec
    from streams.profiling.schedule import FleetSchedule

    config = ScheduleConfig(budget_fraction=0.5, min_budget=1, report_s=30, interval_s=3600, timeout_s=600)
    reports, workflows = {}, {}
    fleet = FleetSchedule(config, reports, workflows)
    (first,) = fleet.apply(report(0, ["wf-a", "wf-b"], at=0), now_ms=0)  # 2 running: a budget of one
    assert first["reason"] == "PERIODIC" and first["requester"] == "gpufleet-scheduler" and first["steps"] == 20
    assert first["request_id"] == f"periodic-{first['workflow_id']}-0" and first["deadline_ms"] == 600_000
    Codec().encode("ProfileRequest", first)  # a valid record
    # Partition 1 reports two more: four running, a budget of two, one slot free.
    (second,) = fleet.apply(report(1, ["wf-c", "wf-d"], at=1000), now_ms=1000)
    assert {first["workflow_id"], second["workflow_id"]} <= {"wf-a", "wf-b", "wf-c", "wf-d"}
    assert fleet.apply(report(None, [], at=2000), now_ms=2000) == []  # both slots held
    # A finished profile frees its slot at once.
    (third,) = fleet.apply(report(None, [], at=3000, finished=[first["workflow_id"]]), now_ms=3000)
    assert third["workflow_id"] not in (first["workflow_id"], second["workflow_id"])
    # Partition 0 stops reporting (it moved): after three report intervals its workflows no longer run.
    later = 1000 + 91_000
    fleet.apply(report(1, ["wf-c", "wf-d"], at=later), now_ms=later)
    assert {wf for wf, e in workflows.items() if e["first_seen"] is not None} == {"wf-c", "wf-d"}
    assert fleet.changed_reports == {"0", "1"} and fleet.scheduler.changed
