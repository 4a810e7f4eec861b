"""The enforcement ladder end to end, on the real broker: a worker process climbs the ladders
of a planted fleet (a job holding idle GPUs, the same on an exempt team, one under a dry-run
ladder, a busy one), and ``gpufleet enforce`` runs the action, a script that records its
arguments, exactly once; through a worker restart between the second warning and the action,
and an enforcer of a new group that reads everything again."""

from __future__ import annotations

import dataclasses
import json
import stat
import sys
from collections import Counter

from producers.publish_kafka import Publisher
from producers.simulate.fleet import HEALTHY, IDLE, build_fleet
from producers.simulate.run import SimulationPlan, run_simulation
from schemas.topics import ENFORCEMENT, GPU_SAMPLES
from sinks.enforce_jobs import Enforcer
from streams.enforcement.ladder import load_ladders
from tests.support.integration import (
    CODEC,
    read_topic,
    run_until,
    running_sink,
    wait_until,
    worker_process,
)
from tests.support.samples import BASE_MS

MINUTES = 25


def policy(path, script) -> None:
    path.write_text(f"""
[[ladder]]
name = "idle-gpus"
detector = "idle_allocated"
teams = ["vision", "research"]
exempt_teams = ["research"]
first_warning_min = 5
second_warning_min = 10
action_min = 15
command = ["{script}", "{{workflow_id}}", "{{team}}"]
act = true

[[ladder]]
name = "idle-gpus-trial"
detector = "idle_allocated"
teams = ["nlp"]
command = ["{script}", "{{workflow_id}}", "dry"]
""")


def steps(bootstrap, prefix) -> list[tuple[str, str, str]]:
    return [(r["workflow_id"], r["policy"], r["step"])
            for *_, name, r in read_topic(bootstrap, prefix + ENFORCEMENT.name, ENFORCEMENT.partitions)
            if name == ENFORCEMENT.schema]


def run_enforcer(enforcer: Enforcer, until) -> None:
    run_until(enforcer.run, until, 90, "the enforcer")


def test_two_warnings_then_the_action_exactly_once(kafka, prefix, tmp_path, chdb_client, database):
    ran = tmp_path / "ran.jsonl"
    script = tmp_path / "release-gpus"
    script.write_text(f"#!{sys.executable}\nimport json, sys\n"
                      f"open({str(ran)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    policy(tmp_path / "enforcement.toml", script)

    fleet = build_fleet(seed=12, hosts=2, gpus_per_host=4, workflows=4)
    plan = [("vision", IDLE), ("research", IDLE), ("nlp", IDLE), ("vision", HEALTHY)]
    fleet = dataclasses.replace(fleet, workflows=tuple(
        dataclasses.replace(w, team=team, profile=profile) for w, (team, profile) in zip(fleet.workflows, plan)))
    idle, exempt, trial, busy = (w.workflow_id for w in fleet.workflows)
    topic = prefix + GPU_SAMPLES.name
    # A job idle from its start counts as starting for its first minute here (15 in production).
    options = ("--enforcement", str(tmp_path / "enforcement.toml"), "--no-periodic-profiles", "--startup-max-s", "60")

    def publish(first_min: int, last_min: int) -> None:
        run_simulation(fleet, SimulationPlan(start_ms=BASE_MS + first_min * 60_000, ticks=(last_min - first_min) * 60,
                                             interval_ms=1000, speed=0), Publisher(kafka.bootstrap, CODEC), topic=topic)

    # Twelve minutes: both warnings; then the worker restarts before the action's minute.
    publish(0, 12)
    with worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker", *options):
        wait_until(lambda: (idle, "idle-gpus", "SECOND_WARNING") in steps(kafka.bootstrap, prefix), 120,
                   "the second warning")
    publish(12, MINUTES)
    with worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker", *options):
        wait_until(lambda: (idle, "idle-gpus", "ACTION_DUE") in steps(kafka.bootstrap, prefix), 120,
                   "the action to fall due after the restart")
        wait_until(lambda: (trial, "idle-gpus-trial", "ACTION_DUE") in steps(kafka.bootstrap, prefix), 60,
                   "the dry-run ladder's action")

    ladders = load_ladders(tmp_path / "enforcement.toml")
    enforcer = Enforcer(kafka.bootstrap, ladders, act=True, group_id=f"{prefix}enforcer", topic_prefix=prefix)
    run_enforcer(enforcer, lambda: enforcer.stats.acted + enforcer.stats.would_act >= 2)
    # Another enforcer, a new group that reads every record again: the claims stop it.
    again = Enforcer(kafka.bootstrap, ladders, act=True, group_id=f"{prefix}enforcer-2", topic_prefix=prefix)
    run_enforcer(again, lambda: len(again.settled) >= 2 and not again.due)

    assert [json.loads(line) for line in ran.read_text().splitlines()] == [[idle, "vision"]]  # once, no dry run
    assert again.stats.outcomes == []
    counted = Counter(steps(kafka.bootstrap, prefix))
    assert all(n == 1 for n in counted.values()), counted  # no step twice, through the restart
    assert {k for k in counted if k[0] == idle} == {
        (idle, "idle-gpus", s) for s in ("FIRST_WARNING", "SECOND_WARNING", "ACTION_DUE", "ACTING", "ACTED")}
    assert {k for k in counted if k[0] == exempt} == {(exempt, "idle-gpus", "EXEMPT")}
    assert {k for k in counted if k[0] == trial} == {
        (trial, "idle-gpus-trial", s) for s in ("FIRST_WARNING", "SECOND_WARNING", "ACTION_DUE", "WOULD_ACT")}
    assert not any(k[0] == busy for k in counted)

    # Every step is a row in ClickHouse too: who, what, why, which ladder.
    def stored():
        rows = chdb_client.query(f"SELECT workflow_id, policy, step, reason, command "
                                 f"FROM {database}.enforcement FINAL").result_rows
        return rows if len(rows) == sum(counted.values()) else None

    with running_sink(kafka.bootstrap, prefix, chdb_client, database):
        rows = wait_until(stored, 60, "the enforcement rows in ClickHouse")
    assert Counter((wf, pol, step) for wf, pol, step, _, _ in rows) == counted
    (reason, command), = [(r, c) for wf, _, step, r, c in rows if (wf, step) == (idle, "ACTED")]
    assert command == [str(script), idle, "vision"] and "GPU(s) released" in reason
