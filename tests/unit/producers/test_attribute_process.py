from producers.attribute_process import UNATTRIBUTED, AttributionKeys, ProcessAttributor
from tests.unit.producers.proc_tree import make_process


def test_environment_keys_win_in_their_order(tmp_path):
    make_process(tmp_path, 10, {"SLURM_JOB_ID": "77", "GPUFLEET_WORKFLOW_ID": "train-bert", "GPUFLEET_OWNER": "ana",
                                "GPUFLEET_TEAM": "nlp", "PYTORCH_VERSION": "2.4.0"})
    info = ProcessAttributor(proc=tmp_path).attribute(10)
    assert (info.workflow_id, info.owner, info.team, info.scheduler_job_id) == ("train-bert", "ana", "nlp", "77")
    assert (info.framework, info.framework_version, info.source) == ("pytorch", "2.4.0", "env:GPUFLEET_WORKFLOW_ID")
    assert info.cmdline == "python train.py"


def test_slurm_and_kubernetes_cgroups(tmp_path):
    make_process(tmp_path, 20, cgroup="0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n")
    make_process(tmp_path, 21, cgroup="12:memory:/kubepods/burstable/pod1a2b3c4d_1111_2222_3333_444455556666/abc\n")
    a = ProcessAttributor(proc=tmp_path)
    assert (a.attribute(20).workflow_id, a.attribute(20).source) == ("slurm-4242", "slurm-cgroup")
    assert a.attribute(21).workflow_id == "k8s-pod-1a2b3c4d-1111-2222-3333-444455556666"


def test_configurable_keys(tmp_path):
    make_process(tmp_path, 30, {"MY_JOB": "j-9", "MY_USER": "bo"})
    info = ProcessAttributor(AttributionKeys(workflow=("MY_JOB",), owner=("MY_USER",)), proc=tmp_path).attribute(30)
    assert (info.workflow_id, info.owner) == ("j-9", "bo")


def test_unknown_or_gone_processes_are_unattributed(tmp_path):
    make_process(tmp_path, 40, {"HOME": "/root"})
    a = ProcessAttributor(proc=tmp_path)
    assert a.attribute(40).workflow_id == UNATTRIBUTED
    assert a.attribute(999).workflow_id == UNATTRIBUTED  # no such process (or not ours to read)


def test_a_reused_pid_is_looked_up_again(tmp_path):
    make_process(tmp_path, 50, {"GPUFLEET_WORKFLOW_ID": "first"}, start_time=100)
    a = ProcessAttributor(proc=tmp_path)
    assert a.attribute(50).workflow_id == "first"
    import shutil
    shutil.rmtree(tmp_path / "50")
    make_process(tmp_path, 50, {"GPUFLEET_WORKFLOW_ID": "second"}, start_time=200)
    assert a.attribute(50).workflow_id == "second"
