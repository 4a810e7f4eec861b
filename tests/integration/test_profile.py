"""On-demand profiling end to end on the real broker: `gpufleet profile` -> the agent -> a real
PyTorch training loop under the hook -> the trace on Kafka -> the worker's analysis -> the
findings printed; and every way it can fail ends with a reason, never a hang.

PyTorch is not a dependency of gpufleet (it is the optional 'profiling' extra): `make test`
installs it into .venv-torch for the training process; without it these tests are skipped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.profile import hosts_of, profile
from tests.support.integration import wait_until, worker_process

ROOT = Path(__file__).resolve().parents[2]
TORCH_PYTHON = Path(os.environ.get("GPUFLEET_TORCH_PYTHON", ROOT / ".venv-torch" / "bin" / "python"))

pytestmark = pytest.mark.skipif(not TORCH_PYTHON.exists(),
                                reason=f"no PyTorch environment at {TORCH_PYTHON} (make test creates it)")


def gpufleet(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "gpufleet", *args], capture_output=True, text=True,
                          check=False, **kwargs)


# How the training script is started: (command before the script, environment, ranks it runs).
LAUNCHERS = {
    "python": ([str(TORCH_PYTHON), "-W", "ignore"], {"RANK": "0", "GPUFLEET_WORKFLOW_ID": "wf-train"}, 1),
    # torchrun starts the ranks and sets RANK/LOCAL_RANK; the launcher process is not a rank.
    "torchrun": ([str(TORCH_PYTHON), "-W", "ignore", "-m", "torch.distributed.run", "--standalone",
                  "--nproc_per_node", "2"], {"GPUFLEET_WORKFLOW_ID": "wf-train"}, 2),
    # A Slurm job that sets nothing of gpufleet's: the agent calls it slurm-<id>, and so must the hook.
    "slurm": ([str(TORCH_PYTHON), "-W", "ignore"], {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "0"}, 1),
}


@pytest.fixture
def training(request, kafka, prefix, tmp_path):
    """A training job with the hook (started as ``request.param`` says, plain python by
    default), the agent of its host and a worker, all running."""
    command, launcher_env, ranks = LAUNCHERS[getattr(request, "param", "python")]
    profile_dir = tmp_path / "profile"
    env = {k: v for k, v in os.environ.items() if k not in ("GPUFLEET_WORKFLOW_ID", "SLURM_JOB_ID")}
    env = {**env, "GPUFLEET_PROFILE_DIR": str(profile_dir), **launcher_env}
    trainer = subprocess.Popen([*command, str(ROOT / "tests/integration/small_training.py"), "--seconds", "240"],
                               env=env, stdout=(tmp_path / "trainer.log").open("w"), stderr=subprocess.STDOUT)
    log = (tmp_path / "agent.log").open("w")
    agent = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", "--data-dir", str(tmp_path), "agent", "--source", "sim",
         "--host", "gpu-host-000", "--hosts", "1", "--gpus-per-host", "2", "--workflows", "1",
         "--bootstrap", kafka.bootstrap, "--topic-prefix", prefix, "--profile-dir", str(profile_dir)],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        with worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker"):
            wait_until(lambda: len(list(profile_dir.glob("hook-*.json"))) >= ranks, 120,
                       f"the hooks of {ranks} training process(es)")
            yield {"bootstrap": kafka.bootstrap, "prefix": prefix, "trainer": trainer, "dir": profile_dir}
    finally:
        for proc in (agent, trainer):
            proc.terminate()
            proc.wait(30)
        log.close()


def test_profile_a_running_training_loop_and_print_the_findings(training):
    run = gpufleet("profile", "wf-train", "--host", "gpu-host-000", "--steps", "5", "--timeout", "120",
                   "--bootstrap", training["bootstrap"], "--topic-prefix", training["prefix"], timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "profiling wf-train for 5 steps on gpu-host-000" in out
    trace_id = next(line.split(" - ")[1] for line in out.splitlines() if "rank 0: trace published" in line)
    assert trace_id.startswith("profile/od-") and trace_id.endswith("/gpu-host-000/rank0")
    assert "gpu-host-000 rank 0: analysed" in out
    assert f"{trace_id}: GPU idle" in out  # the analysis of the trace the hook captured
    # What the agent saw meanwhile, sampling at 10 Hz instead of 1 Hz while the capture ran.
    seen = re.search(r"during the capture: (\d+) host samples over ([\d.]+) s \(one every (\d+) ms\), .*host CPU", out)
    assert seen, out
    print(seen.group(0))
    # The agent ticks at once when a capture starts, and every 100 ms while it runs: a mean
    # interval under the normal 1000 ms means it sampled faster (it stamps each tick's interval).
    ticks, interval_ms = int(seen.group(1)), int(seen.group(3))
    assert ticks >= 1 and interval_ms < 1000, seen.group(0)
    assert "Findings:" in out or "No antipattern found in these traces." in out
    assert not list(training["dir"].glob("trace-*")), "the agent removes a trace once it is published"


def test_failures_end_with_reasons_and_nothing_hangs(training):
    common = ("--bootstrap", training["bootstrap"], "--topic-prefix", training["prefix"])
    # A workflow with no hooked process on the named host.
    run = gpufleet("profile", "wf-elsewhere", "--host", "gpu-host-000", "--timeout", "60", *common, timeout=120)
    assert run.returncode == 1 and "gpu-host-000: failed - workflow wf-elsewhere has no process with" in run.stdout
    # A host that never answers: no agent runs there. The command gives up at its --timeout
    # (the subprocess' own timeout would fail this test if it hung).
    run = gpufleet("profile", "wf-train", "--host", "ghost-7", "--timeout", "6", *common, timeout=60)
    assert run.returncode == 1 and "ghost-7: the host never answered" in run.stdout
    # A workflow no agent reports running, and no host named.
    run = gpufleet("profile", "wf-unknown", *common, timeout=60)
    assert run.returncode != 0 and "not running on any host" in run.stderr
    assert hosts_of(training["bootstrap"], "wf-unknown", training["prefix"]) == []

    # The training process dies once its capture is accepted (a crash in the hook's process).
    def kill_on_accept(status):
        if status["state"] == "ACCEPTED":
            training["trainer"].kill()

    outcome = profile(training["bootstrap"], "wf-train", ["gpu-host-000"], steps=100_000, timeout_s=60,
                      prefix=training["prefix"], on_status=kill_on_accept)
    assert not outcome.ok
    (where, reason), = outcome.failed.items()
    assert where == "gpu-host-000 rank 0" and "exited before its trace was written" in reason


@pytest.mark.parametrize("training", ["torchrun"], indirect=True)
def test_under_torchrun_the_ranks_are_profiled_not_the_launcher(training):
    hooks = [json.loads(p.read_text()) for p in training["dir"].glob("hook-*.json")]
    assert sorted(h["rank"] for h in hooks) == [0, 1]
    assert training["trainer"].pid not in {h["pid"] for h in hooks}  # the launcher is no rank
    run = gpufleet("profile", "wf-train", "--host", "gpu-host-000", "--steps", "3", "--timeout", "120",
                   "--bootstrap", training["bootstrap"], "--topic-prefix", training["prefix"], timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    for rank in (0, 1):
        assert f"gpu-host-000 rank {rank}: analysed" in run.stdout
        assert f"/gpu-host-000/rank{rank}: GPU idle" in run.stdout


@pytest.mark.parametrize("training", ["slurm"], indirect=True)
def test_a_slurm_job_known_only_by_slurms_variables_is_profiled(training):
    run = gpufleet("profile", "slurm-4242", "--host", "gpu-host-000", "--steps", "3", "--timeout", "120",
                   "--bootstrap", training["bootstrap"], "--topic-prefix", training["prefix"], timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "gpu-host-000 rank 0: analysed" in run.stdout

