"""The enforcement ladder over a planted idle job, minute by minute: two warnings, then the
action once; exemptions, a busy job, a grace period, stale or partial data, a resolved alert,
and a replay of the same windows, which decides alike and takes no step twice."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from streams.alerts.detectors import DEFAULTS
from streams.alerts.raising import AlertConfig, raise_alerts
from streams.enforcement.ladder import (
    ACTION_DUE,
    CANCELLED,
    EXEMPT,
    FIRST_WARNING,
    HELD,
    SECOND_WARNING,
    Ladder,
    PolicyError,
    climb,
    load_ladders,
    render,
)
from streams.serving.traffic import by_gpus
from streams.windows.workflow_state import WorkflowState
from tests.support.samples import BASE_MS, window

MIN = 60_000
LADDER = Ladder(name="idle-gpus", detector="idle_allocated", first_warning_min=5, second_warning_min=10,
                action_min=15, command=("scancel", "{scheduler_job_id}"), act=True)


def job(**fields) -> WorkflowState:
    return WorkflowState(**{"partition": 0, "owner": "alice@example.com", "team": "vision",
                            "scheduler_job_id": "4242", "cluster": "east", "hosts": ["gpu-host-000"],
                            "first_sample_at": BASE_MS, "scheduler_qos": "normal", "scheduler_partition": "gpu",
                            **fields})


def minute(m: int, idle: bool = True, **extra) -> dict:
    return window(**{"window_start": BASE_MS + m * MIN, "window_end": BASE_MS + (m + 1) * MIN, "gpu_count": 2,
                     "idle_gpus": 2 if idle else 0, "utilization_mean_pct": 0.0 if idle else 80.0,
                     "hosts": ["gpu-host-000"], **extra})


def run(state: WorkflowState, minutes, ladder: Ladder = LADDER, **window_extra) -> list[tuple[int, dict]]:
    """Each minute's window through the alerts, then the ladder: (minute, event)."""
    out = []
    for m, idle in minutes:
        w = minute(m, idle, **window_extra)
        raise_alerts(state, w, AlertConfig(), now_ms=w["window_end"], thresholds=DEFAULTS)
        state.job = {"max_gpus": 2}
        out += [(m, e) for e in climb(state, w, (ladder,), now_ms=w["window_end"])]
    return out


def steps(events) -> list[tuple[int, str]]:
    return [(m, e["step"]) for m, e in events]


def test_two_warnings_then_the_action_once_at_the_configured_minutes():
    state = job()
    events = run(state, [(m, True) for m in range(25)])
    # the condition began at minute 0; the window ending at minute 5 completes 5 minutes
    assert steps(events) == [(4, FIRST_WARNING), (9, SECOND_WARNING), (14, ACTION_DUE)]
    action = events[-1][1]
    assert action["command"] == ["scancel", "4242"] and action["dry_run"] is False
    assert action["due_at"] == BASE_MS + 15 * MIN and action["event_id"] == f"{action['alert_id']}:ACTION_DUE"
    first = events[0][1]
    assert first["action_at"] == BASE_MS + 15 * MIN and "will be released 15 min after it began" in first["reason"]


def test_a_replay_of_the_same_windows_decides_alike_and_repeats_nothing():
    state = job()
    events = run(state, [(m, True) for m in range(12)])
    replayed = copy.deepcopy(state)  # the state as the changelog has it, the windows read again
    assert run(replayed, [(m, True) for m in range(12)]) == []
    fresh = job()  # a worker that rebuilds it all from the start decides the same records
    assert [e for _, e in run(fresh, [(m, True) for m in range(12)])] == [e for _, e in events]


def test_a_resolved_alert_cancels_the_pending_steps():
    state = job()
    events = run(state, [(m, m < 12) for m in range(20)])
    assert steps(events) == [(4, FIRST_WARNING), (9, SECOND_WARNING), (12, CANCELLED)]


def test_dry_run_is_the_default_and_says_so():
    ladder = Ladder(name="idle", command=("scancel", "{scheduler_job_id}"))
    events = run(job(), [(m, True) for m in range(16)], ladder)
    assert steps(events)[-1] == (14, ACTION_DUE) and all(e["dry_run"] for _, e in events)
    assert "(dry run)" in events[-1][1]["reason"] and "would be released" in events[0][1]["reason"]


@pytest.mark.parametrize("state, ladder, why", [
    (job(team="research"), Ladder(name="l", exempt_teams=("research",)), "team research is exempt"),
    (job(owner="bo"), Ladder(name="l", exempt_owners=("bo",)), "owner bo is exempt"),
    (job(), Ladder(name="l", exempt_workflows=("wf-*",)), "matches an exempt pattern"),
    (job(cmdline="python -m ipykernel_launcher -f k.json"), Ladder(name="l"), "an interactive job"),
    (job(scheduler_qos="high"), Ladder(name="l", exempt_qos=("high",)), "quality of service high is exempt"),
    (job(scheduler_partition="debug"), Ladder(name="l", exempt_partitions=("debug",)), "partition debug is exempt"),
    # a workflow of no scheduler (its processes named it) has no QoS to be unknown
    (job(scheduler_job_id=None, scheduler_qos=None, team="research"),
     Ladder(name="l", exempt_qos=("high",), exempt_teams=("research",)), "team research is exempt"),
])
def test_an_exempt_job_never_reaches_the_action(state, ladder, why):
    events = run(state, [(m, True) for m in range(30)], ladder)
    assert steps(events) == [(4, EXEMPT)] and why in events[0][1]["reason"]


@pytest.mark.parametrize("state, ladder, fact", [
    # The prolog could not read the QoS (a job name with a newline broke the old reader): the
    # job may be exempt, so nothing is done, not even a warning, and the reason is on record.
    (job(scheduler_qos=None, unknown_facts=["qos"], scheduler_problem="squeue's answer for job 4242 cannot be read"),
     Ladder(name="l", exempt_qos=("exempt",), command=("scancel", "{scheduler_job_id}"), act=True), "qos"),
    # An older agent's events name no unknown fact: a scheduler's job without a QoS is unknown all the same.
    (job(scheduler_qos=None), Ladder(name="l", exempt_qos=("exempt",)), "qos"),
    (job(scheduler_partition=None, unknown_facts=["partition"]), Ladder(name="l", exempt_partitions=("debug",)),
     "partition"),
    (job(owner=None), Ladder(name="l", exempt_owners=("bo",)), "user"),
    (job(team=None), Ladder(name="l", exempt_teams=("research",)), "account"),
])
def test_a_job_whose_exemption_facts_are_unknown_is_held_and_never_acted_on(state, ladder, fact):
    events = run(state, [(m, True) for m in range(40)], ladder)
    assert steps(events) == [(4, HELD)], events
    reason = events[0][1]["reason"]
    assert f"its {fact}" in reason and "nothing is done until it is known" in reason
    if state.scheduler_problem:
        assert state.scheduler_problem in reason


def test_a_held_job_climbs_once_its_facts_are_known():
    state = job(scheduler_qos=None, unknown_facts=["qos"])
    ladder = Ladder(name="l", exempt_qos=("exempt",), command=("scancel", "{scheduler_job_id}"), act=True)
    held = run(state, [(m, True) for m in range(6)], ladder)
    state.scheduler_qos = "normal"  # a later life-cycle event read it
    later = run(state, [(m, True) for m in range(6, 20)], ladder)
    assert steps(held) == [(4, HELD)] and steps(later) == [(6, FIRST_WARNING), (9, SECOND_WARNING),
                                                          (14, ACTION_DUE)]
    exempt = job(scheduler_qos=None, unknown_facts=["qos"])
    run(exempt, [(m, True) for m in range(6)], ladder)
    exempt.scheduler_qos = "exempt"
    assert steps(run(exempt, [(m, True) for m in range(6, 20)], ladder)) == [(6, EXEMPT)]


def test_a_job_with_enough_busy_gpus_is_spared():
    ladder = Ladder(name="partial", detector="partial_use", busy_fraction=0.5)
    state = job()
    out = []
    for m in range(30):  # 1 of 4 GPUs idle: partial use fires, 75 % busy spares it
        w = window(window_start=BASE_MS + m * MIN, window_end=BASE_MS + (m + 1) * MIN, gpu_count=4, idle_gpus=1,
                   hosts=["gpu-host-000"])
        raise_alerts(state, w, AlertConfig(), now_ms=0, thresholds=DEFAULTS)
        out += climb(state, w, (ladder,), now_ms=0)
    assert [e["step"] for e in out] == [EXEMPT] and "75% of its GPUs are busy" in out[0]["reason"]


def test_the_ladder_starts_after_the_grace_period():
    ladder = Ladder(name="l", grace_after_start_min=20)
    events = run(job(), [(m, True) for m in range(40)], ladder)
    assert steps(events) == [(24, FIRST_WARNING), (29, SECOND_WARNING), (34, ACTION_DUE)]


def test_partial_or_stale_data_holds_the_action_until_a_whole_window():
    state = job(hosts=["gpu-host-000", "gpu-host-001"])  # the life cycle says two hosts
    events = run(state, [(m, True) for m in range(18)])
    assert steps(events) == [(4, FIRST_WARNING), (9, SECOND_WARNING), (14, HELD)]
    assert "no samples from gpu-host-001" in events[-1][1]["reason"]
    w = minute(18, hosts=["gpu-host-000", "gpu-host-001"])
    raise_alerts(state, w, AlertConfig(), now_ms=0, thresholds=DEFAULTS)
    assert [e["step"] for e in climb(state, w, (LADDER,), now_ms=0)] == [ACTION_DUE]


def test_a_job_without_the_id_its_command_needs_is_held_not_acted_on():
    events = run(job(scheduler_job_id=None), [(m, True) for m in range(20)])
    assert steps(events)[-1] == (14, HELD) and "needs scheduler_job_id" in events[-1][1]["reason"]


def test_hostile_ids_never_reach_a_command():
    assert render(("scancel", "{scheduler_job_id}"), {"scheduler_job_id": "77"}) == ["scancel", "77"]
    for hostile in ("--signal=KILL", "1; rm -rf /", "../../etc", "a b", ""):
        with pytest.raises(ValueError, match="not safe"):
            render(("scancel", "{scheduler_job_id}"), {"scheduler_job_id": hostile})


def test_a_policy_file_is_checked(tmp_path):
    policy = tmp_path / "enforcement.toml"
    policy.write_text('[[ladder]]\nname = "idle"\ncommand = ["scancel", "{scheduler_job_id}"]\nact = true\n')
    (ladder,) = load_ladders(policy)
    assert ladder.act and ladder.action_min == 15
    for text, says in [('[[ladder]]\nname = "x"\nact = true\n', "acts but has no command"),
                       ('[[ladder]]\nname = "x"\ncommand = ["rm", "{home}"]\n', "names home"),
                       ('[[ladder]]\nname = "x"\nfirst_warning_min = 20\n', "in that order"),
                       ('[[ladder]]\nname = "x"\nactt = true\n', "unknown field"),
                       ('[[ladder]]\nname = "x"\n[[ladder]]\nname = "x"\n', "same name")]:
        policy.write_text(text)
        with pytest.raises(PolicyError, match=says):
            load_ladders(policy)


def test_a_warning_carries_the_right_size_advice():
    """The owner is told what to ask for instead: here, fewer GPUs (half of them at 0 %)."""
    state = job()
    out = []
    for m in range(6):
        w = minute(m)
        raise_alerts(state, w, AlertConfig(), now_ms=0, thresholds=DEFAULTS)
        state.job = {"max_gpus": 4, "gpu_seconds": 240.0 * (m + 1), "zero_util_gpu_seconds": 120.0 * (m + 1),
                     "util_weighted": 0.0, "mem_peak": 0.9, "model": "NVIDIA H100 80GB HBM3"}
        out += climb(state, w, (LADDER,), now_ms=0)
    (first,) = out
    assert first["step"] == FIRST_WARNING and "Right-sizing: ask for 2 GPUs" in first["reason"]


SHIPPED = Path(__file__).resolve().parents[4] / "docker" / "config" / "enforcement.toml"


def run_replica(state: WorkflowState, minutes, ladders, serving: dict) -> list[tuple[int, dict]]:
    """As ``run``, for a declared replica whose engine's metrics are not read: each window judged
    by its GPUs (``streams.serving.traffic.by_gpus``), as the window step judges it."""
    out = []
    for m, idle in minutes:
        w = minute(m, idle, utilization_max_pct=0.0 if idle else 80.0)
        w["serving"] = by_gpus(serving, w)
        raise_alerts(state, w, AlertConfig(), now_ms=w["window_end"], thresholds=DEFAULTS)
        state.job = {"max_gpus": 2}
        out += [(m, e) for e in climb(state, w, ladders, now_ms=w["window_end"])]
    return out


def test_a_job_declaring_itself_a_replica_is_not_taken_off_the_shipped_idle_ladders():
    """The idle-allocation detector stands aside for a replica, and what declares one is the job's
    own (``GPUFLEET_SERVICE`` in its environment, a pod's label): under the policy gpufleet ships,
    a job whose GPUs sit at 0 % reaches the action whether or not it says it serves, and no later
    than the same job saying nothing; a replica that works is never warned."""
    ladders = load_ladders(SHIPPED)
    plain = run(job(), [(m, True) for m in range(150)], ladders[0])
    said = run_replica(job(), [(m, True) for m in range(150)], ladders, {"service": "chat"})
    assert [s for _, s in steps(plain)] == [FIRST_WARNING, SECOND_WARNING, ACTION_DUE]
    assert [s for _, s in steps(said)] == [FIRST_WARNING, SECOND_WARNING, ACTION_DUE], said
    assert steps(said)[-1][0] <= steps(plain)[-1][0]
    assert said[-1][1]["command"] == ["scancel", "4242"] and said[-1][1]["detector"] == "idle_replica"
    working = run_replica(job(), [(m, m % 20 == 0) for m in range(150)], ladders, {"service": "chat"})
    assert working == []
