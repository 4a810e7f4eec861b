"""The agent's tick where it reads the scheduler's allocations (Slurm's prolog records here):
whose each GPU is, what a job that never opens its GPUs is charged, and its end."""

from __future__ import annotations

import itertools

import pytest

from producers.agent.allocations.allocation import Allocation
from producers.agent.allocations.slurm import SlurmAllocations, SlurmDirectory
from producers.agent.gpus.attribute_process import ProcessAttributor
from producers.agent.gpus.sample_nvml import NvmlSampler
from producers.agent.host_agent import AgentSettings, HostAgent
from producers.agent.spool.disk import Spool
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


@pytest.fixture(params=[0.0])
def world(tmp_path, request):
    """The agent on four GPUs; its samples held ``request.param`` seconds (0: spooled at once)."""
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
    agent = HostAgent(AgentSettings("node-7", interval_s=1.0, cluster="east", hold_s=request.param), spool, CODEC,
                      nvml=sampler,
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
    assert (started["slurm-77"]["service"], started["slurm-88"]["service"]) == (None, None)  # no label says so
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


def test_an_agent_started_after_the_job_charges_from_its_own_first_tick_and_names_the_time_before(world):
    agent, spool, slurm, clock = world
    slurm.started(job("99", ("0", "1"), started_ms=T0 - 3_600_000), now_ms=T0 - 3_600_000)
    clock.ms = T0
    agent.tick()
    records = spooled(spool)
    assert {s["interval_ms"] for s in samples_of(records, "slurm-99")} == {1_000}
    gap, = [r for _, name, r in records if name == "UnobservedTime"]
    assert (gap["workflow_id"], gap["from_time"], gap["to_time"], gap["gpus"], gap["gpu_uuids"]) == (
        "slurm-99", T0 - 3_600_000, T0 - 1_000, 2.0, ["GPU-0", "GPU-1"])
    assert "no agent sampled node-7" in gap["reason"] and gap["scheduler_job_id"] == "99"
    clock.ms = T0 + 1_000
    agent.tick()
    assert len([1 for _, name, _ in spooled(spool) if name == "UnobservedTime"]) == 1  # said once


@pytest.mark.parametrize("world", [5.0], indirect=True)
def test_a_restarted_agent_continues_its_jobs_and_names_the_time_it_did_not_see(world, tmp_path):
    agent, spool, slurm, clock = world
    slurm.started(job("99", ("1", "3"), started_ms=T0), now_ms=T0)
    for t in range(0, 10_000, 1_000):  # 10 s of the job, the last 5 s still held when the agent dies
        clock.ms = T0 + t
        agent.tick()
    covered = agent.coverage.charged["slurm-99"].until
    assert covered == T0 + 4_000  # (held: the samples of the last 5 s)
    del agent  # kill -9: nothing held is spooled, nothing more is written
    clock.ms = T0 + 30_000
    again = HostAgent(AgentSettings("node-7", interval_s=1.0, cluster="east", hold_s=5.0), spool, CODEC,
                      nvml=world[0].nvml if False else _sampler(), attributor=ProcessAttributor(proc=tmp_path / "proc"),
                      clock=clock, allocations=SlurmAllocations(tmp_path / "slurm"))
    again.tick()
    records = spooled(spool)
    events = [r["event"] for _, name, r in records if name == "WorkflowEvent" and r["workflow_id"] == "slurm-99"]
    assert events == ["STARTED"]  # the restart continues the job: no second STARTED
    gap, = [r for _, name, r in records if name == "UnobservedTime"]
    assert (gap["from_time"], gap["to_time"], gap["gpus"]) == (T0 + 4_000, T0 + 29_000, 2.0)
    assert "was not running" in gap["reason"]
    # The job ends while the agent is down again: the time to its end is unobserved.
    clock.ms = T0 + 40_000
    again.tick(interval_s=10.0)  # (its sample, of 30-40 s, still held when it dies)
    slurm.ended(job("99", ("1", "3"), started_ms=T0, ended_ms=T0 + 45_000), now_ms=T0 + 45_500)
    clock.ms = T0 + 60_000
    third = HostAgent(AgentSettings("node-7", interval_s=1.0, cluster="east", hold_s=5.0), spool, CODEC,
                      nvml=_sampler(), attributor=ProcessAttributor(proc=tmp_path / "proc"), clock=clock,
                      allocations=SlurmAllocations(tmp_path / "slurm"))
    third.tick()
    third.stop()
    records = spooled(spool)
    gaps = [(r["from_time"], r["to_time"]) for _, name, r in records if name == "UnobservedTime"]
    assert gaps == [(T0 + 4_000, T0 + 29_000), (T0 + 30_000, T0 + 45_000)]
    charged = sum(s["interval_ms"] * s["share"] for s in samples_of(records, "slurm-99"))
    unseen = sum((b - a) * 2 for a, b in gaps)
    assert charged + unseen == 2 * 45_000  # GPUs x its run, from the scheduler's start to its end


def _sampler() -> NvmlSampler:
    sampler = NvmlSampler(FakeNvml([FakeGpu(f"GPU-{i}", util=0, mem_used=0, minor=i) for i in range(4)]))
    sampler.open()
    return sampler


@pytest.mark.parametrize("world", [5.0], indirect=True)
def test_an_end_told_after_the_next_tick_still_ends_the_charge_at_the_schedulers_end(world):
    # Slurm runs the epilog after the job's end: the tick between charged the job past it.
    agent, spool, slurm, clock = world
    slurm.started(job("99", ("1", "3"), started_ms=T0), now_ms=T0)
    agent.tick()
    for t in (1_000, 2_000):
        clock.ms = T0 + t
        agent.tick()
    slurm.ended(job("99", ("1", "3"), started_ms=T0, ended_ms=T0 + 1_800, end_state="COMPLETED"), now_ms=T0 + 2_500)
    clock.ms = T0 + 3_000
    agent.tick()
    records = spooled(spool)
    mine = samples_of(records, "slurm-99")
    assert sorted((s["event_time"], s["interval_ms"]) for s in mine if s["gpu_uuid"] == "GPU-1") == [
        (T0, 0), (T0 + 1_000, 1_000), (T0 + 1_800, 800)]  # the tick at 2 s cut at the end, 1.8 s
    assert sum(s["interval_ms"] * s["share"] for s in mine) == 2 * 1_800  # GPUs x its run, never before its start
    # What was cut off is the GPU's time as nobody's, still held; the end follows the job's samples.
    ends = [r for _, name, r in records if name == "WorkflowEvent" and r["event"] == "ENDED"]
    assert [e["event_time"] for e in ends] == [T0 + 1_800] * 2 and ends[0]["end_state"] == "COMPLETED"
    for t in (4_000, 9_000):
        clock.ms = T0 + t
        agent.tick()
    free = [s for s in samples_of(spooled(spool), UNALLOCATED) if s["gpu_uuid"] == "GPU-1"]
    assert (T0 + 2_000, 200) in {(s["event_time"], s["interval_ms"]) for s in free}
    gpu1 = [s for s in samples_of(spooled(spool)) if s["gpu_uuid"] == "GPU-1" and s["event_time"] <= T0 + 3_000]
    assert sum(s["interval_ms"] for s in gpu1) == 3_000  # every millisecond of the GPU charged once, T0 to 3 s


@pytest.mark.parametrize("world", [5.0], indirect=True)
def test_a_gpu_handed_from_one_job_to_the_next_is_charged_to_one_at_a_time(world):
    agent, spool, slurm, clock = world
    slurm.started(job("1", ("1",), started_ms=T0), now_ms=T0)
    agent.tick()
    for t in range(1_000, 5_000, 1_000):
        clock.ms = T0 + t
        agent.tick()
        if t == 2_000:  # the first job ends at 1.5 s; the second starts at 1.6 s, told at once
            slurm.ended(job("1", ("1",), started_ms=T0, ended_ms=T0 + 1_500), now_ms=T0 + 2_100)
            slurm.started(job("2", ("1",), started_ms=T0 + 1_600), now_ms=T0 + 2_200)
    agent.stop()
    gpu1 = [s for s in samples_of(spooled(spool)) if s["gpu_uuid"] == "GPU-1"]
    spans = sorted((s["event_time"] - s["interval_ms"], s["event_time"], s["workflow_id"]) for s in gpu1)
    for (_, end, _), (begin, _, _) in itertools.pairwise(spans):
        assert begin >= end, spans  # no millisecond of the GPU in two samples
    assert max(e for _, e, wf in spans if wf == "slurm-1") == T0 + 1_500
    assert min(b for b, _, wf in spans if wf == "slurm-2") == T0 + 1_600


@pytest.mark.parametrize("step_ms", [82, -82, -600])
def test_a_step_of_the_wall_clock_neither_loses_nor_doubles_a_jobs_time(world, step_ms):
    """The agent's loop times its ticks by the monotonic clock (``run_agent`` gives each tick the
    seconds since the last); its samples are placed by the wall clock, as the scheduler's start
    and end are. Where the wall clock steps between two ticks (NTP, a VM's time sync), the job's
    samples still cover it once, from the scheduler's start to its end: no gap, no overlap."""
    agent, spool, slurm, clock = world
    agent.tick()
    slurm.started(job("99", ("1", "3"), started_ms=T0 - 600), now_ms=T0 + 100)
    for t in range(1, 6):
        clock.ms = T0 + t * 1000 + (step_ms if t >= 3 else 0)  # the step, between the 2nd and 3rd ticks
        agent.tick(interval_s=1.0)  # a second of the monotonic clock each
    end = T0 + 5_400 + step_ms  # the scheduler's end, read on the stepped clock
    slurm.ended(job("99", ("1", "3"), started_ms=T0 - 600, ended_ms=end), now_ms=end + 300)
    clock.ms = T0 + 6_000 + step_ms
    agent.tick(interval_s=1.0)
    mine = samples_of(spooled(spool), "slurm-99")
    for gpu in ("GPU-1", "GPU-3"):
        spans = sorted((s["event_time"] - s["interval_ms"], s["event_time"]) for s in mine if s["gpu_uuid"] == gpu)
        assert spans[0][0] == T0 - 600 and spans[-1][1] == end, spans
        assert all(b == a for (_, a), (b, _) in itertools.pairwise(spans)), spans  # each begins where the last ended
    assert sum(s["interval_ms"] * s["share"] for s in mine) == 2 * (end - (T0 - 600))  # GPUs x Slurm's Elapsed


def test_a_step_of_the_wall_clock_longer_than_a_tick_is_said_and_not_charged(world, caplog):
    """A wall clock set an hour forward between two ticks: the samples stand for the second that
    passed, not for the hour the clock skipped, and the log says so."""
    agent, spool, slurm, clock = world
    slurm.started(job("99", ("1",), started_ms=T0), now_ms=T0)
    agent.tick()
    clock.ms = T0 + 1_000
    agent.tick(interval_s=1.0)
    clock.ms = T0 + 2_000 + 3_600_000
    with caplog.at_level("WARNING"):
        agent.tick(interval_s=1.0)
    last = max(samples_of(spooled(spool), "slurm-99"), key=lambda s: s["event_time"])
    assert (last["event_time"], last["interval_ms"]) == (T0 + 3_602_000, 1_000)
    assert "wall clock" in caplog.text and "+3600.0 s" in caplog.text, caplog.text


def test_a_job_its_labels_declare_a_replica_names_its_service_on_its_events(world):
    """An allocation whose labels declare a serving replica (a pod's, ``KubeletAllocations``): its
    events name the service."""
    agent, spool, slurm, _ = world
    slurm.started(job("88", ("2",), started_ms=T0, service="sd-xl"), now_ms=T0)
    agent.tick()
    (event,) = [r for _, name, r in spooled(spool) if name == "WorkflowEvent" and r["workflow_id"] == "slurm-88"]
    assert (event["event"], event["service"]) == ("STARTED", "sd-xl")
    assert agent.declared_service("slurm-88") == "sd-xl"  # what its serving readings are named by
