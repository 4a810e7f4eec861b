"""The agent's tick where it reads the scheduler's allocations (Slurm's prolog records here):
whose each GPU is, what a job that never opens its GPUs is charged, and its end."""

from __future__ import annotations

import pytest

from producers.allocations import Allocation
from producers.attribute_process import ProcessAttributor
from producers.host_agent import AgentSettings, HostAgent
from producers.sample_nvml import NvmlSampler
from producers.slurm_allocations import SlurmAllocations, SlurmDirectory
from producers.spool import Spool
from schemas.codec import Codec
from schemas.sample_columns import rows_of
from schemas.validate_sample import UNALLOCATED, validate_sample
from tests.support.fake_nvml import FakeGpu, FakeNvml, FakeProcess
from tests.support.proc_tree import make_process

CODEC = Codec()
T0 = 1_767_225_600_000


class Clock:
    def __init__(self) -> None:
        self.ms = T0

    def __call__(self) -> float:
        return self.ms / 1000


def spooled(spool) -> list[tuple[str, str, dict]]:
    """(topic, record name, record) in spool order, GpuSampleColumns as their samples."""
    out = []
    for r in spool.read(spool.cursor(), limit=100_000):
        name, record = CODEC.decode(r.value)
        if name == "GpuSampleColumns":
            out += [(r.topic, "GpuSample", s) for s in rows_of(record)]
        else:
            out.append((r.topic, name, record))
    return out


def job(job_id: str, gpus: tuple[str, ...], started_ms: int, **kw) -> Allocation:
    return Allocation(scheduler="slurm", job_id=job_id, workflow_id=f"slurm-{job_id}", gpus=gpus,
                      started_ms=started_ms, owner=f"user-{job_id}", team="vision", partition="gpu", qos="normal",
                      name=f"job {job_id}", time_limit_s=3600, nodes="node-7", **kw)


@pytest.fixture
def world(tmp_path):
    proc = tmp_path / "proc"
    make_process(proc, 201, {"SLURM_JOB_ID": "77", "USER": "someone-else"})
    make_process(proc, 101, {"GPUFLEET_WORKFLOW_ID": "wf-a"})
    gpus = [
        FakeGpu("GPU-0", util=90, processes=[FakeProcess(201, sm_util=90)], minor=0),
        FakeGpu("GPU-1", util=0, mem_used=0, processes=[], minor=1),  # job 77's, never opened
        FakeGpu("GPU-2", util=40, processes=[FakeProcess(101, sm_util=40)], minor=2),  # job 88's; wf-a runs there
        FakeGpu("GPU-3", util=0, mem_used=0, minor=3),  # nobody's
    ]
    sampler = NvmlSampler(FakeNvml(gpus))
    sampler.open()
    slurm = SlurmDirectory(tmp_path / "slurm")
    clock = Clock()
    spool = Spool(tmp_path / "spool")
    agent = HostAgent(AgentSettings("node-7", interval_s=1.0, cluster="east"), spool, CODEC, nvml=sampler,
                      attributor=ProcessAttributor(proc=proc), clock=clock,
                      allocations=SlurmAllocations(tmp_path / "slurm"))
    return agent, spool, slurm, clock


def samples_of(records, workflow=None) -> list[dict]:
    return [r for _, name, r in records if name == "GpuSample" and workflow in (None, r["workflow_id"])]


def test_the_scheduler_decides_whose_each_gpu_is(world):
    agent, spool, slurm, clock = world
    agent.tick()  # a tick before the jobs: the agent has a last tick to reach back from
    spool.acknowledge(spool.cursor(), 0)
    slurm.started(job("77", ("0", "1"), started_ms=T0 + 200), now_ms=T0 + 400)
    slurm.started(job("88", ("2",), started_ms=T0 + 300), now_ms=T0 + 500)
    clock.ms = T0 + 1000
    agent.tick()
    records = spooled(spool)
    by = {(s["gpu_uuid"], s["workflow_id"]): s for s in samples_of(records) if s["event_time"] == T0 + 1000}
    assert set(by) == {("GPU-0", "slurm-77"), ("GPU-1", "slurm-77"), ("GPU-2", "slurm-88"), ("GPU-3", UNALLOCATED)}
    untouched = by[("GPU-1", "slurm-77")]
    assert (untouched["process_count"], untouched["share"], untouched["utilization_pct"]) == (0, 1.0, 0.0)
    # Owner and team are the scheduler's (the Slurm user and account), not the process's USER.
    assert (untouched["owner"], untouched["team"]) == ("user-77", "vision") == (
        by[("GPU-0", "slurm-77")]["owner"], by[("GPU-0", "slurm-77")]["team"])
    # A process of another workflow on job 88's GPU: named on the job's sample; wf-a gets none of it.
    assert by[("GPU-2", "slurm-88")]["foreign_workflow_id"] == "wf-a" and by[("GPU-2", "slurm-88")]["share"] == 1.0
    assert by[("GPU-0", "slurm-77")]["foreign_workflow_id"] is None
    assert all(validate_sample(s) is None for s in by.values())
    started = {r["workflow_id"]: r for topic, name, r in records
               if name == "WorkflowEvent" and r["event_time"] == T0 + 1000}
    assert set(started) == {"slurm-77", "slurm-88"}
    assert started["slurm-88"]["event"] == "STARTED" and started["slurm-88"]["pids"] == []
    e = started["slurm-77"]
    assert (e["scheduler"], e["scheduler_job_id"], e["owner"], e["team"], e["scheduler_partition"],
            e["scheduler_qos"], e["job_name"], e["time_limit_s"], e["allocated_at"], e["attribution"]) == (
        "slurm", "77", "user-77", "vision", "gpu", "normal", "job 77", 3600, T0 + 200, "allocation:slurm")
    assert e["gpu_uuids"] == ["GPU-0", "GPU-1"] and e["pids"] == [201]


def test_a_job_is_charged_from_the_schedulers_start_to_its_end(world):
    agent, spool, slurm, clock = world
    agent.tick()  # T0
    slurm.started(job("99", ("1", "3"), started_ms=T0 - 600), now_ms=T0 + 100)  # started before the last tick
    for t in range(1, 6):
        clock.ms = T0 + t * 1000
        agent.tick()
    slurm.ended(job("99", ("1", "3"), started_ms=T0 - 600, ended_ms=T0 + 5_400), now_ms=T0 + 5_700)
    clock.ms = T0 + 6_000
    agent.tick()
    clock.ms = T0 + 7_000
    agent.tick()
    records = spooled(spool)
    mine = samples_of(records, "slurm-99")
    # Per GPU: the first sample reaches back to the start, the last runs to the scheduler's end.
    for gpu in ("GPU-1", "GPU-3"):
        intervals = [s["interval_ms"] for s in mine if s["gpu_uuid"] == gpu]
        assert intervals == [1_600, 1_000, 1_000, 1_000, 1_000, 400]
    assert sum(s["interval_ms"] * s["share"] for s in mine) == 2 * (5_400 - (-600))  # GPUs x run time
    assert not [s for s in samples_of(records) if s["event_time"] == T0 + 7_000 and s["workflow_id"] == "slurm-99"]
    # The end goes out at once with the scheduler's end time, on the samples topic after the
    # job's last samples (the worker closes its windows when it reads it) and as a life-cycle event.
    ends = [
        (i, topic) for i, (topic, name, r) in enumerate(records) if name == "WorkflowEvent" and r["event"] == "ENDED"
    ]
    assert sorted(topic for _, topic in ends) == ["gpufleet.gpu-samples.v1", "gpufleet.workflow-events.v1"]
    last = max(i for i, (_, name, r) in enumerate(records) if name == "GpuSample" and r["workflow_id"] == "slurm-99")
    in_band, = [i for i, topic in ends if topic == "gpufleet.gpu-samples.v1"]
    assert in_band > last and records[in_band][2]["event_time"] == T0 + 5_400
    assert records[in_band][2]["scheduler"] == "slurm" and records[in_band][2]["allocated_at"] == T0 - 600
    assert not (slurm.path / ".ended" / "99.json").exists()  # spooled: the epilog's record is done


def test_an_agent_started_after_the_job_charges_from_its_own_first_tick(world):
    agent, spool, slurm, clock = world
    slurm.started(job("99", ("0", "1"), started_ms=T0 - 3_600_000), now_ms=T0 - 3_600_000)
    clock.ms = T0
    agent.tick()
    assert {s["interval_ms"] for s in samples_of(spooled(spool), "slurm-99")} == {1_000}


def test_an_end_before_the_last_tick_adds_no_sample(world):
    agent, spool, slurm, clock = world
    slurm.started(job("99", ("1", "3"), started_ms=T0), now_ms=T0)
    agent.tick()
    clock.ms = T0 + 1_000
    agent.tick()
    slurm.ended(job("99", ("1", "3"), started_ms=T0, ended_ms=T0 + 800), now_ms=T0 + 1_500)
    clock.ms = T0 + 2_000
    agent.tick()
    records = spooled(spool)
    assert [s["event_time"] for s in samples_of(records, "slurm-99")] == [T0, T0, T0 + 1_000, T0 + 1_000]
    assert [r["event_time"] for _, name, r in records if name == "WorkflowEvent" and r["event"] == "ENDED"] == [
        T0 + 800, T0 + 800]
