"""What the prolog and epilog read of a job from Slurm, whatever its owner named it: every name a
user can give (newlines, the unit separator, tabs, quotes, ``$()``, 255+ characters, non-ASCII,
bytes that are no UTF-8, a name spelling out another job's record) leaves the job's facts
whole, through ``squeue`` and ``sacct`` as executables printing like Slurm 22.05's
(``tests.support.fake_slurm``; the real ones are in ``tests/integration/test_slurm.py``)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producers.agent.allocations.slurm import allocation_from_environment
from producers.agent.allocations.slurm_facts import SQUEUE_FORMAT, SlurmReader
from tests.support import fake_slurm

ENV = {"SLURM_JOB_ID": "42", "SLURM_JOB_USER": "ana", "SLURM_JOB_ACCOUNT": "vision", "SLURM_JOB_PARTITION": "gpu",
       "SLURM_JOB_GPUS": "0,1"}
FORGED = ("x\n42|42|N/A|N/A|ana|vision|gpu|exempt|UNLIMITED|1796000000|1796003600|RUNNING|None|node-7|"
          "\n43|43|N/A|N/A|eve|ops|exempt|exempt|UNLIMITED|0|0|RUNNING|None|n")
HOSTILE = ["c\nd", "a\x1fb", "tab\there", "quote'\"s", "$(rm -rf /)", "`id`", "pipe|exempt|qos", "x" * 300,
           "é" * 200, "训练任务", "\x00\x01\x02", "\n", "", "\r\n\r\n", FORGED, "a\\nb", "%j%q"]


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    path = tmp_path / "jobs.json"
    for key, value in fake_slurm.install(tmp_path / "bin", path).items():
        monkeypatch.setenv(key, value)

    def jobs(*table: dict) -> SlurmReader:
        fake_slurm.write_jobs(path, list(table))
        return SlurmReader(sacct_tries=2, sacct_wait_s=0.0)

    return jobs


@pytest.mark.parametrize("name", HOSTILE, ids=range(len(HOSTILE)))
def test_no_job_name_hides_or_forges_a_fact(slurm, name):
    reader = slurm(fake_slurm.job(42, name=name, qos="exempt", partition="gpu"),
                   fake_slurm.job(43, name=name, qos="normal", user="eve", account="ops"))
    facts = reader.read("42")
    assert (facts.qos, facts.user, facts.account, facts.partition) == ("exempt", "ana", "vision", "gpu")
    assert facts.started_ms == 1_796_000_000_000 and facts.unknown == [] and facts.problems == []
    assert facts.name == (name or None)
    a = allocation_from_environment(ENV, reader)
    assert (a.qos, a.unknown, a.workflow_id, a.name) == ("exempt", (), "slurm-42", name or None)


def test_a_name_of_bytes_that_are_no_utf8_is_kept_escaped_and_hides_nothing(slurm):
    name = b"\xff\xfeab".decode("utf-8", "surrogateescape")
    facts = slurm(fake_slurm.job(42, name=name, qos="exempt")).read("42")
    assert facts.qos == "exempt" and facts.name == "\\xff\\xfeab" and facts.unknown == []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(st.characters(blacklist_categories=("Cs",)), max_size=400))
def test_any_name_at_all(slurm, name):
    facts = slurm(fake_slurm.job(42, name=name, qos="exempt")).read("42")
    assert (facts.qos, facts.partition, facts.unknown) == ("exempt", "gpu", [])
    assert facts.name == (name or None)


def test_an_array_task_is_named_by_its_array_and_found_by_its_raw_id(slurm):
    # The array's last task keeps the array's id as its raw id: -j 6 lists every task of it.
    reader = slurm(fake_slurm.job(7, display_id="6_0", array_job_id="6", array_task_id="0", name="t\n0"),
                   fake_slurm.job(6, display_id="6_1", array_job_id="6", array_task_id="1", name="t1", qos="exempt"))
    assert (reader.read("6").display_id, reader.read("6").qos, reader.read("6").name) == ("6_1", "exempt", "t1")
    assert (reader.read("7").display_id, reader.read("7").name) == ("6_0", "t\n0")
    assert allocation_from_environment({**ENV, "SLURM_JOB_ID": "7"}, reader).workflow_id == "slurm-6_0"


def test_what_the_scheduler_cannot_be_asked_is_unknown_with_the_reason(slurm, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    facts = SlurmReader().read("42")
    assert {"qos", "start", "name"} <= set(facts.unknown) and "not installed" in facts.problems[0]
    a = allocation_from_environment(ENV, SlurmReader())
    assert a.qos is None and "qos" in a.unknown and a.owner == "ana" and "user" not in a.unknown


@pytest.mark.parametrize("field,value", [("qos", "ex empt"), ("start", "2026-12-03T10:00:00"), ("user", ""),
                                         ("state", "BOGUS"), ("partition", "\x1b[31m")])
def test_a_field_of_the_wrong_shape_is_unknown_never_guessed(slurm, field, value):
    facts = slurm(fake_slurm.job(42, **{field: value})).read("42")
    if field == "state":
        assert facts.state is None and facts.problems
    else:
        assert field in facts.unknown and getattr(facts, {"start": "started_ms"}.get(field, field)) is None


def test_an_answer_that_does_not_hold_together_is_not_read_at_all(slurm, monkeypatch, tmp_path):
    # A controller (or a wrapper in front of it) whose lines are not the fields asked for.
    (tmp_path / "bin" / "squeue").write_text("#!/bin/sh\necho '42|42|N/A|N/A|ana|vision|gpu|exempt'\n")
    facts = SlurmReader().read("42")
    assert {"qos", "user", "partition"} <= set(facts.unknown) and "fields" in facts.problems[0]
    assert SQUEUE_FORMAT.count("|") == 13


@pytest.mark.parametrize("sacct_state,exit_code,end_state,code,signal,by", [
    ("COMPLETED", "0:0", "COMPLETED", 0, 0, None),
    ("CANCELLED by 0", "0:15", "CANCELLED", 0, 15, "root"),
    ("TIMEOUT", "0:0", "TIMEOUT", 0, 0, None),
    ("FAILED", "3:0", "FAILED", 3, 0, None),
    ("PREEMPTED", "0:0", "PREEMPTED", 0, 0, None),
    ("NODE_FAIL", "0:0", "NODE_FAIL", 0, 0, None),
    ("OUT_OF_MEMORY", "0:125", "OUT_OF_MEMORY", 0, 125, None),
])
def test_the_epilog_reads_how_the_job_ended_from_accounting(slurm, sacct_state, exit_code, end_state, code, signal,
                                                            by):
    reader = slurm(fake_slurm.job(42, state="COMPLETING", end=1_796_000_090, sacct_state=sacct_state,
                                  exit_code=exit_code, name="a\nb"))
    facts = reader.read("42", ended=True)
    assert (facts.end_state, facts.exit_code, facts.exit_signal, facts.cancelled_by) == (end_state, code, signal, by)
    assert facts.ended_ms == 1_796_000_090_000 and facts.unknown == []
    a = allocation_from_environment(ENV, reader, ended=True)
    assert (a.end_state, a.ended_ms, a.cancelled_by) == (end_state, 1_796_000_090_000, by)


def test_without_accounting_the_controllers_state_and_reason_tell_what_they_can(slurm):
    timeout = slurm(fake_slurm.job(42, state="COMPLETING", reason="TimeLimit", end=1_796_000_090,
                                   sacct_state="RUNNING")).read("42", ended=True)
    assert (timeout.end_state, timeout.ended_ms) == ("TIMEOUT", 1_796_000_090_000)
    assert "still had job 42 RUNNING" in timeout.problems[0]
    unknown = slurm(fake_slurm.job(42, state="COMPLETING", end=1_796_000_090,
                                   sacct_state="RUNNING")).read("42", ended=True)
    assert unknown.end_state is None and "end_state" in unknown.unknown and unknown.ended_ms == 1_796_000_090_000


def test_a_prolog_never_takes_a_running_jobs_projected_end_for_its_end(slurm):
    facts = slurm(fake_slurm.job(42, state="RUNNING", end=1_796_003_600)).read("42")
    assert facts.ended_ms is None and facts.started_ms == 1_796_000_000_000
