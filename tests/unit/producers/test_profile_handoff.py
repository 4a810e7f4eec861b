"""The profile directory between the agent and the hook: private to its user, one file per message."""

from __future__ import annotations

import os
import stat

import pytest

from producers.agent.gpus.attribute_process import ProcessAttributor, workflow_of_environment
from producers.profiling.handoff import Handoff, HandoffError, default_dir, private_dir


def test_the_default_is_per_user_and_created_private(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUFLEET_PROFILE_DIR", raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    assert default_dir() == tmp_path / f"gpufleet-profile-{os.getuid()}"
    made = private_dir(default_dir())
    assert stat.S_IMODE(made.stat().st_mode) == 0o700


def test_a_directory_of_ours_that_others_may_write_is_made_private(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    private_dir(shared)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o700


def test_a_link_planted_in_its_place_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "profile").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(HandoffError, match="not a directory"):
        private_dir(tmp_path / "profile")


def test_a_directory_of_another_user_is_refused_unless_we_are_root(tmp_path, monkeypatch):
    """As a non-root user meeting a directory someone else made first (the uid is simulated)."""
    theirs = tmp_path / "profile"
    theirs.mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: theirs.stat().st_uid + 1)
    with pytest.raises(HandoffError, match=r"belongs to uid \d+, not to this user"):
        private_dir(theirs)


def test_a_request_a_trace_and_an_error_go_through_in_files_readable_by_their_owner_only(tmp_path):
    agent, hook = Handoff(tmp_path / "p"), Handoff(tmp_path / "p")
    hook.announce(os.getpid(), 3, "slurm-42", torch="2.5")
    assert agent.hooks() == [{"pid": os.getpid(), "rank": 3, "workflow_id": "slurm-42", "torch": "2.5"}]
    agent.ask(os.getpid(), {"request_id": "od/1", "steps": 5})
    assert hook.take_request(os.getpid()) == {"request_id": "od/1", "steps": 5}
    assert hook.take_request(os.getpid()) is None  # taken once
    hook.trace_part("od/1", os.getpid()).write_text("{}")
    assert agent.trace("od/1", os.getpid()) is None  # not until it is complete
    hook.trace_done("od/1", os.getpid())
    assert agent.trace("od/1", os.getpid()).read_text() == "{}"
    hook.fail("od/2", os.getpid(), "no optimizer step")
    assert agent.error("od/2", os.getpid()) == "no optimizer step" and agent.error("od/2", os.getpid()) is None
    for path in (tmp_path / "p").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path


def test_the_hook_and_the_agent_name_a_slurm_job_alike(tmp_path):
    """The hook once announced a Slurm job as its bare id while the agent said slurm-<id>:
    a profile request then found no rank."""
    env = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "0", "USER": "ana"}
    proc = tmp_path / "proc"
    (proc / "77").mkdir(parents=True)
    (proc / "77" / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()))
    (proc / "77" / "stat").write_text("77 (python) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 12345 0 0")
    agent_says = ProcessAttributor(proc=proc).attribute(77).workflow_id
    assert agent_says == workflow_of_environment(env)[0] == "slurm-4242"
