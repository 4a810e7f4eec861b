from producers.agent.gpus.attribute_process import UNATTRIBUTED, AttributionKeys, ProcessAttributor
from tests.support.proc_tree import make_process


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


def test_framework_from_the_library_a_process_has_loaded(tmp_path):
    """No version variable: the framework is the one whose library is mapped, its version the
    dist-info beside it, read through the process's root (a container's files)."""
    proc = tmp_path / "proc"
    make_process(proc, 60, {"GPUFLEET_WORKFLOW_ID": "wf"})
    site = "opt/venv/lib/python3.12/site-packages"
    (proc / "60" / "root" / site / "torch-2.11.0+cu130.dist-info").mkdir(parents=True)
    (proc / "60" / "maps").write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f02-7f03 rw-p 00000000 00:00 0 \n"
        f"7f04-7f05 r-xp 00000000 08:01 2 /{site}/torch/lib/libtorch_cuda.so\n")
    make_process(proc, 61, {"GPUFLEET_WORKFLOW_ID": "wf", "PYTORCH_VERSION": "2.4.0"})
    (proc / "61" / "maps").write_text(f"7f04-7f05 r-xp 00000000 08:01 2 /{site}/torch/lib/libtorch_cuda.so\n")
    make_process(proc, 62, {"GPUFLEET_WORKFLOW_ID": "wf"})  # no maps readable: nothing known
    a = ProcessAttributor(proc=proc)
    assert (a.attribute(60).framework, a.attribute(60).framework_version) == ("pytorch", "2.11.0+cu130")
    assert (a.attribute(61).framework, a.attribute(61).framework_version) == ("pytorch", "2.4.0")  # the env wins
    assert (a.attribute(62).framework, a.attribute(62).framework_version) == (None, None)



def test_the_rank_comes_from_the_launcher_environment(tmp_path):
    make_process(tmp_path, 70, {"GPUFLEET_WORKFLOW_ID": "wf", "RANK": "11", "LOCAL_RANK": "3"})  # torchrun
    make_process(tmp_path, 71, {"SLURM_JOB_ID": "5", "SLURM_PROCID": "7"})  # srun
    make_process(tmp_path, 72, {"GPUFLEET_WORKFLOW_ID": "wf", "RANK": "not-a-number"})
    a = ProcessAttributor(proc=tmp_path)
    assert [a.attribute(pid).rank for pid in (70, 71, 72)] == [11, 7, None]


def test_the_schedulers_qos_and_partition_are_read_for_the_ladders_exemptions(tmp_path):
    make_process(tmp_path, 30, {"SLURM_JOB_ID": "9", "SLURM_JOB_QOS": "high", "SLURM_JOB_PARTITION": "debug"})
    make_process(tmp_path, 31, {"GPUFLEET_WORKFLOW_ID": "wf"})
    a = ProcessAttributor(proc=tmp_path)
    assert (a.attribute(30).qos, a.attribute(30).partition) == ("high", "debug")
    assert (a.attribute(31).qos, a.attribute(31).partition) == (None, None)


def test_an_array_tasks_processes_are_the_tasks_workflow(tmp_path):
    # Slurm gives every task of an array its own raw id; squeue and sacct name it <array>_<task>.
    make_process(tmp_path, 40, {"SLURM_JOB_ID": "125", "SLURM_ARRAY_JOB_ID": "123", "SLURM_ARRAY_TASK_ID": "4"})
    info = ProcessAttributor(proc=tmp_path).attribute(40)
    assert (info.workflow_id, info.scheduler_job_id) == ("slurm-123_4", "125")
