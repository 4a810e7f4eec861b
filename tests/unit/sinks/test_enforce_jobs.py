"""The enforcer's action, without a broker: what it runs, when it only records, how a failing
command ends (retried, then ACTION_FAILED and a dead letter), and the claim before a command."""

from __future__ import annotations

import subprocess

import pytest

from schemas.codec import Codec
from sinks.enforce_jobs import Enforcer
from streams.enforcement.ladder import Ladder
from tests.support.samples import BASE_MS

CODEC = Codec()
LADDER = Ladder(name="idle", command=("release-gpus", "{scheduler_job_id}", "{team}"), act=True)


class Producer:
    """What the enforcer writes, decoded, in order; flush says when each was made durable."""

    def __init__(self) -> None:
        self.records: list[tuple[str, dict]] = []
        self.flushed = 0

    def produce(self, topic, value, key=None):
        self.records.append((topic, CODEC.decode(value)[1]))

    def flush(self, timeout=None):
        self.flushed = len(self.records)
        return 0


def due(**fields) -> dict:
    return {"event_id": "idle_allocated:wf-a:0:ACTION_DUE", "alert_id": "idle_allocated:wf-a:0",
            "step": "ACTION_DUE", "policy": "idle", "detector": "idle_allocated", "workflow_id": "wf-a",
            "owner": "alice", "team": "vision", "cluster": None, "scheduler_job_id": "4242", "since": BASE_MS,
            "due_at": BASE_MS + 900_000, "action_at": BASE_MS + 900_000, "dry_run": False, "gpus": 2,
            "reason": "idle", "command": [], "exit_code": None, "attempt": 0, "at": BASE_MS, **fields}


def enforcer(runner, act=True, ladder=LADDER) -> tuple[Enforcer, Producer, list]:
    calls = []

    def run(command, **kwargs):
        calls.append((command, producer.flushed, len(producer.records)))
        return runner(command, **kwargs)

    e = Enforcer("127.0.0.1:1", (ladder,), act=act, retries=2, retry_backoff_s=0, runner=run)
    producer = e.producer = e.loop.producer = Producer()
    return e, producer, calls


def ok(command, **kwargs):
    return subprocess.CompletedProcess(command, 0, "", "")


def steps(producer) -> list[str]:
    return [r.get("step", "DEAD_LETTER") if topic.endswith("enforcement.v1") else "DEAD_LETTER"
            for topic, r in producer.records]


def test_the_action_runs_once_after_a_durable_claim():
    e, producer, calls = enforcer(ok)
    e._settle(due())
    assert steps(producer) == ["ACTING", "ACTED"]
    (command, flushed, written), = calls
    assert command == ["release-gpus", "4242", "vision"] and flushed == written == 1  # the claim was durable first
    assert producer.records[-1][1]["exit_code"] == 0 and e.stats.acted == 1


@pytest.mark.parametrize("act, record, why", [
    (False, due(), "this enforcer was started without --act"),
    (True, due(dry_run=True), "the ladder is a dry run"),
])
def test_a_dry_run_records_what_it_would_run_and_runs_nothing(act, record, why):
    e, producer, calls = enforcer(ok, act=act)
    e._settle(record)
    assert calls == [] and steps(producer) == ["WOULD_ACT"]
    assert why in producer.records[0][1]["reason"] and producer.records[0][1]["command"][1] == "4242"


def test_a_failing_command_is_retried_then_failed_and_dead_lettered():
    e, producer, calls = enforcer(lambda c, **k: subprocess.CompletedProcess(c, 3, "", "scancel: job not found"))
    e._settle(due())
    assert len(calls) == 3  # the first try and 2 retries
    assert steps(producer) == ["ACTING", "ACTION_FAILED", "DEAD_LETTER"]
    failed = producer.records[1][1]
    assert failed["exit_code"] == 3 and "scancel: job not found" in failed["reason"] and failed["attempt"] == 3
    assert producer.records[2][1]["stage"] == "enforcer" and e.stats.failed == 1


def test_a_command_that_hangs_or_is_missing_fails_with_the_reason():
    def hangs(command, timeout, **kwargs):
        raise subprocess.TimeoutExpired(command, timeout)

    e, producer, _ = enforcer(hangs)
    e._settle(due())
    assert "no answer within 60 s" in producer.records[1][1]["reason"]
    e, producer, _ = enforcer(subprocess.run, ladder=Ladder(name="idle", command=("/nonexistent/release",), act=True))
    e._settle(due())
    assert steps(producer) == ["ACTING", "ACTION_FAILED", "DEAD_LETTER"]


def test_no_command_runs_for_an_unknown_ladder_or_an_unsafe_id():
    e, producer, calls = enforcer(ok)
    e._settle(due(policy="other"))
    e._settle(due(scheduler_job_id="--signal=KILL"))
    assert calls == [] and steps(producer) == ["ACTION_FAILED", "DEAD_LETTER"] * 2
    assert "no ladder named 'other'" in producer.records[0][1]["reason"]
    assert "not safe to put in a command" in producer.records[2][1]["reason"]


def test_a_claim_or_a_cancellation_read_before_the_end_stops_the_action():
    """Read in order: the action due, then a claim another enforcer (or this one, before a
    crash) wrote after it; or the worker's cancellation. Neither leaves anything to run."""
    from types import SimpleNamespace

    e, _, _ = enforcer(ok)

    def message(record, offset):
        return SimpleNamespace(value=lambda: CODEC.encode("EnforcementEvent", record), partition=lambda: 0,
                               offset=lambda: offset, key=lambda: b"wf-a")

    e._read(message(due(), 1))
    assert list(e.due) == ["idle_allocated:wf-a:0"]
    e._read(message(due(step="ACTING", event_id="x"), 2))
    assert e.due == {} and "idle_allocated:wf-a:0" in e.settled
    e._read(message(due(), 3))  # read again after a rebalance: settled already
    assert e.due == {}
    other = due(alert_id="idle_allocated:wf-b:0", workflow_id="wf-b")
    e._read(message(other, 4))
    e._read(message({**other, "step": "CANCELLED"}, 5))
    assert e.due == {} and e.stats.cancelled == 1
