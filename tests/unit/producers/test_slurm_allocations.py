"""What gpufleet's Slurm prolog and epilog write, and what the agent reads of it."""

from __future__ import annotations

import threading

import pytest

from producers.agent.allocations.allocation import Allocation, gpus_of
from producers.agent.allocations.slurm import SlurmAllocations, SlurmDirectory, allocation_from_environment
from producers.agent.allocations.slurm_facts import JobFacts, time_limit_s
from producers.agent.gpus.reading import GpuReading

ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_USER": "ana", "SLURM_JOB_ACCOUNT": "vision", "SLURM_JOB_PARTITION": "gpu",
       "SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "2,3", "SLURM_NODELIST": "node-7", "SLURM_CLUSTER_NAME": "east"}


class Reader:
    """What the scheduler says of the job (``producers.agent.allocations.slurm_facts``), as a test sets it."""

    def __init__(self, **facts) -> None:
        self.facts = facts

    def read(self, job_id: str, ended: bool = False) -> JobFacts:
        return JobFacts(job_id, **self.facts)


def squeue(answer: dict | None):
    if answer is None:  # the controller could not be asked
        return Reader(unknown=["user", "account", "partition", "qos", "name", "time_limit", "start", "end",
                               "end_state"], problems=["squeue is not installed here"])
    return Reader(**answer)


def test_the_prolog_reads_the_job_from_its_environment_and_the_scheduler():
    known = {"name": "train resnet", "qos": "high", "time_limit_s": 86400, "started_ms": 1_796_000_000_000,
             "ended_ms": 1_796_086_400_000, "nodes": "node-7", "state": "RUNNING", "display_id": "4242"}
    a = allocation_from_environment(ENV, squeue(known))
    assert (a.workflow_id, a.job_id, a.gpus, a.owner, a.team, a.partition) == (
        "slurm-4242", "4242", ("2", "3"), "ana", "vision", "gpu")
    assert (a.name, a.qos, a.time_limit_s, a.nodes, a.cluster) == ("train resnet", "high", 86400, "node-7", "east")
    assert a.started_ms == 1_796_000_000_000 and a.unknown == ()
    assert a.ended_ms is None  # a prolog's job has not ended, whatever its projected end


def test_without_the_scheduler_the_environment_gives_what_it_has_and_the_rest_is_unknown():
    a = allocation_from_environment({**ENV, "SLURM_JOB_GPUS": ""}, squeue(None))
    assert a.gpus == ("2", "3") and a.qos is None and a.started_ms is None  # CUDA_VISIBLE_DEVICES then
    assert (a.owner, a.team, a.partition) == ("ana", "vision", "gpu")  # slurmd's environment
    assert set(a.unknown) == {"qos", "name", "time_limit", "start"} and "not installed" in a.problem


def test_an_array_task_is_its_own_workflow_with_its_raw_id():
    a = allocation_from_environment({**ENV, "SLURM_JOB_ID": "125"}, squeue({"display_id": "123_4"}))
    assert (a.workflow_id, a.job_id) == ("slurm-123_4", "125")


@pytest.mark.parametrize("job", ["", "12; rm -rf /", "../../etc", "1" * 30])
def test_a_job_id_that_is_not_one_is_refused(job):
    with pytest.raises(ValueError, match="not a Slurm job id"):
        allocation_from_environment({**ENV, "SLURM_JOB_ID": job}, squeue(None))


@pytest.mark.parametrize("text,seconds", [("UNLIMITED", None), ("5:00", 300), ("1:00:00", 3600),
                                          ("2-00:00:00", 172800), ("0:30", 30), ("INVALID", None)])
def test_time_limits_as_squeue_prints_them(text, seconds):
    assert time_limit_s(text) == seconds


def test_prolog_and_epilog_leave_what_the_agent_and_dcgm_exporter_read(tmp_path):
    d = SlurmDirectory(tmp_path)
    other = Allocation(scheduler="slurm", job_id="7", workflow_id="slurm-7", gpus=("3",), started_ms=500)
    job = allocation_from_environment(ENV, squeue(None))
    d.started(job, now_ms=1_000)
    d.started(other, now_ms=1_100)
    # dcgm-exporter's HPC job mapping: a file per GPU index, the ids of the jobs on it a line each
    assert (tmp_path / "2").read_text() == "4242\n" and (tmp_path / "3").read_text() == "4242\n7\n"
    source = SlurmAllocations(tmp_path)
    now = source.read(2_000)
    assert [a.job_id for a in now.current] == ["4242", "7"] and now.ended == ()
    assert now.current[0].started_ms is None  # the scheduler could not say: unknown, never the prolog's clock
    assert "start" in now.current[0].unknown
    ended = d.ended(allocation_from_environment(ENV, squeue(None), ended=True), now_ms=9_000)
    assert ended.ended_ms is None and "end" in ended.unknown and ended.owner == "ana"
    assert not (tmp_path / "2").exists() and (tmp_path / "3").read_text() == "7\n"
    later = source.read(9_500)
    assert [a.job_id for a in later.current] == ["7"] and [a.job_id for a in later.ended] == ["4242"]
    assert source.read(9_600).ended == later.ended  # told again until the agent has spooled it
    source.forget(later.ended)
    assert source.read(9_700).ended == ()


def test_the_epilog_takes_the_schedulers_end_time_but_never_one_that_cannot_be(tmp_path):
    d = SlurmDirectory(tmp_path)
    d.started(Allocation(scheduler="slurm", job_id="1", workflow_id="slurm-1", gpus=("0",), started_ms=1_000), 1_000)
    ended = d.ended(Allocation(scheduler="slurm", job_id="1", workflow_id="slurm-1", gpus=("0",), ended_ms=5_000,
                               end_state="CANCELLED", cancelled_by="ana"), now_ms=5_400)
    assert (ended.ended_ms, ended.started_ms, ended.end_state, ended.cancelled_by) == (5_000, 1_000, "CANCELLED", "ana")
    d.started(Allocation(scheduler="slurm", job_id="2", workflow_id="slurm-2", gpus=("0",), started_ms=1_000), 1_000)
    ended = d.ended(Allocation(scheduler="slurm", job_id="2", workflow_id="slurm-2", gpus=("0",), ended_ms=99_000),
                    now_ms=6_000)
    assert ended.ended_ms is None and ended.unknown == ("end",) and "in the future" in ended.problem
    d.started(Allocation(scheduler="slurm", job_id="3", workflow_id="slurm-3", gpus=("0",), started_ms=8_000), 8_000)
    ended = d.ended(Allocation(scheduler="slurm", job_id="3", workflow_id="slurm-3", gpus=("0",), ended_ms=7_000),
                    now_ms=9_000)
    assert ended.ended_ms is None and "before its start" in ended.problem


def test_what_the_prolog_could_not_learn_and_the_epilog_did_is_known_at_the_end(tmp_path):
    d = SlurmDirectory(tmp_path)
    d.started(allocation_from_environment(ENV, squeue(None)), 1_000)
    epilog = allocation_from_environment(ENV, squeue({"qos": "exempt", "started_ms": 900, "ended_ms": 5_000,
                                                      "end_state": "COMPLETED", "exit_code": 0, "exit_signal": 0,
                                                      "display_id": "4242", "unknown": ["name", "time_limit"]}),
                                          ended=True)
    ended = d.ended(epilog, now_ms=5_500)
    assert (ended.qos, ended.started_ms, ended.ended_ms, ended.end_state) == ("exempt", 900, 5_000, "COMPLETED")
    assert set(ended.unknown) == {"name", "time_limit"}


def test_a_damaged_record_is_skipped_not_fatal(tmp_path, caplog):
    d = SlurmDirectory(tmp_path)
    d.started(Allocation(scheduler="slurm", job_id="1", workflow_id="slurm-1", gpus=("0",)), 1_000)
    (tmp_path / ".jobs" / "2.json").write_text("{not json")
    (tmp_path / ".jobs" / "3.json").write_text('{"scheduler": "slurm"}')
    assert [a.job_id for a in SlurmAllocations(tmp_path).read(2_000).current] == ["1"]
    assert "no allocation record" in caplog.text


def test_jobs_sharing_a_gpu_start_and_end_at_once_without_losing_each_other(tmp_path):
    d = SlurmDirectory(tmp_path)
    jobs = [Allocation(scheduler="slurm", job_id=str(i), workflow_id=f"slurm-{i}", gpus=("0",)) for i in range(40)]
    threads = [threading.Thread(target=d.started, args=(j, 1_000)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted((tmp_path / "0").read_text().split(), key=int) == [str(i) for i in range(40)]
    threads = [threading.Thread(target=d.ended, args=(j, 2_000)) for j in jobs[:39]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (tmp_path / "0").read_text() == "39\n"


def reading(index: int, uuid: str, minor: int | None = None, parent: str | None = None) -> GpuReading:
    return GpuReading(index, uuid, "NVIDIA H100 80GB HBM3", parent_uuid=parent, minor_number=minor)


def test_slurm_indexes_name_gpus_in_the_order_of_their_device_files():
    # NVML orders GPUs by PCI bus; Slurm's gres.conf by /dev/nvidia<minor>: they can differ.
    gpus = [reading(0, "GPU-a", minor=1), reading(1, "GPU-b", minor=0), reading(2, "GPU-c", minor=3),
            reading(3, "GPU-d", minor=2)]
    job = Allocation(scheduler="slurm", job_id="1", workflow_id="slurm-1", gpus=("0", "2"))
    assert gpus_of(job, gpus) == ["GPU-b", "GPU-d"]
    no_minor = [reading(i, f"GPU-{i}") for i in range(4)]
    assert gpus_of(job, no_minor) == ["GPU-0", "GPU-2"]  # NVML's index where NVML gives no minor number
    assert gpus_of(Allocation(scheduler="slurm", job_id="1", workflow_id="slurm-1", gpus=("9",)), gpus) == []


def test_uuids_name_gpus_and_mig_instances():
    gpus = [reading(0, "MIG-x", parent="GPU-0"), reading(0, "MIG-y", parent="GPU-0"), reading(1, "GPU-1")]
    pod = Allocation(scheduler="kubernetes", job_id="u", workflow_id="k8s-pod-u", gpus=("MIG-y", "GPU-1"))
    assert gpus_of(pod, gpus) == ["MIG-y", "GPU-1"]
    whole = Allocation(scheduler="kubernetes", job_id="u", workflow_id="k8s-pod-u", gpus=("GPU-0",))
    assert gpus_of(whole, gpus) == ["MIG-x", "MIG-y"]  # a whole GPU's UUID: each of its instances


def test_the_agent_reads_a_folder_again_only_when_it_changed_or_its_time_is_too_fresh_to_trust(tmp_path):
    import os
    import time

    d, source = SlurmDirectory(tmp_path), SlurmAllocations(tmp_path)
    jobs = tmp_path / ".jobs"

    def job(i):
        return Allocation(scheduler="slurm", job_id=str(i), workflow_id=f"slurm-{i}", gpus=("0",))

    d.started(job(1), 1_000)
    assert [a.job_id for a in source.read(0).current] == ["1"]
    # A record renamed in within the same tick of a coarse file clock: the folder's time has not
    # moved, but it is recent, so the folder is read again.
    stamp = jobs.stat().st_mtime_ns
    d.started(job(2), 1_000)
    os.utime(jobs, ns=(stamp, stamp))
    assert [a.job_id for a in source.read(0).current] == ["1", "2"]
    # An old time that did not move: the folder is not read (every change renames a file in,
    # which moves it).
    old = time.time_ns() - 10_000_000_000
    os.utime(jobs, ns=(old, old))
    assert [a.job_id for a in source.read(0).current] == ["1", "2"]
    (jobs / "2.json").rename(tmp_path / "moved-away")
    os.utime(jobs, ns=(old, old))
    assert [a.job_id for a in source.read(0).current] == ["1", "2"]  # what it read, as its time says
    os.utime(jobs, None)
    assert [a.job_id for a in source.read(0).current] == ["1"]
