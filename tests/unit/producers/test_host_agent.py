"""The agent's tick with a fake NVML (the pynvml boundary) and a fixture /proc: what it spools."""

import os
import re
import time
from pathlib import Path

import pytest

from producers.agent.gpus.attribute_process import IDLE, UNATTRIBUTED
from producers.agent.host_agent import AgentSettings, HostAgent
from producers.agent.links import AgentLinks
from producers.agent.spool.disk import Spool
from producers.simulate.fleet import SimulatedGpus, build_fleet
from schemas.sample_columns import rows_of
from schemas.validate_sample import validate_sample
from tests.support.agent import CODEC, make_world
from tests.support.fake_nvml import FakeProcess


def spooled(spool):
    out = {}
    for r in spool.read(spool.cursor(), limit=100_000):
        name, record = CODEC.decode(r.value)
        out.setdefault(name, []).append((r.topic, r.key, record))
        if name == "GpuSampleColumns":  # the samples it carries, as if sent one by one
            out.setdefault("GpuSample", []).extend((r.topic, r.key, s) for s in rows_of(record))
    return out




def test_one_sample_per_gpu_and_workflow_with_shares(world):
    agent, spool, _, _ = world
    assert agent.tick() == 5
    samples = [r for _, _, r in spooled(spool)["GpuSample"]]
    by = {(s["gpu_uuid"], s["workflow_id"]): s for s in samples}
    assert set(by) == {("GPU-0", "wf-a"), ("GPU-0", "slurm-77"), ("GPU-1", "wf-a"), ("GPU-2", IDLE),
                       ("GPU-3", UNATTRIBUTED)}
    assert by[("GPU-0", "wf-a")]["share"] == pytest.approx(0.75)  # 60 of 80 SM-% on the GPU
    assert by[("GPU-0", "slurm-77")]["share"] == pytest.approx(0.25)
    assert by[("GPU-1", "wf-a")]["share"] == 1.0 and by[("GPU-1", "wf-a")]["owner"] == "ana"
    assert by[("GPU-0", "wf-a")]["utilization_pct"] == 90.0 and by[("GPU-0", "wf-a")]["host"] == "node-7"
    assert by[("GPU-0", "wf-a")]["power_limit_watts"] == 400.0 and by[("GPU-0", "wf-a")]["process_count"] == 1
    assert (by[("GPU-0", "wf-a")]["rank"], by[("GPU-1", "wf-a")]["rank"], by[("GPU-0", "slurm-77")]["rank"]) == (
        0, 1, None)  # from each process's RANK; the Slurm job set none
    assert all(validate_sample(s) is None for s in samples)
    # Each workflow's host CPU rides on its GPU samples (psutil on this machine: a number, maybe 0).
    assert all(s["workflow_cpu_pct"] is not None for s in samples if s["workflow_id"] in ("wf-a", "slurm-77"))
    assert all(s["host_iowait_pct"] is not None for s in samples)


def test_observers_see_each_ticks_samples_and_host_sample(tmp_path):
    """The profile coordinator builds a capture's context from these (producers/profiling/context.py)."""
    from producers.profiling.context import ProfileContext

    context = ProfileContext("wf-a", rank=1)
    agent, _, _, _ = make_world(tmp_path, AgentLinks(observers=(context.add,)))
    agent.tick()
    agent.tick()
    s = context.summary()
    assert s["ticks"] == 2 and s["span_ms"] == 2000
    assert s["gpus"] == 1 and s["gpu_utilization_mean_pct"] == 80.0  # rank 1 is on GPU-1
    assert s["workflow_cpu_mean_pct"] is not None and s["host_cpu_mean_pct"] is not None


def test_host_sample_and_keys(world):
    agent, spool, _, _ = world
    agent.tick()
    out = spooled(spool)
    (topic, key, host), = out["HostSample"]
    assert topic == "gpufleet.host-samples.v1" and key == b"node-7"
    assert host["cpu_count"] >= 1 and 0 <= host["cpu_pct"] <= 100 and host["memory_total_bytes"] > 0
    assert {w["workflow_id"] for w in host["workflows"]} == {"wf-a", "slurm-77"}
    assert all(k == s["workflow_id"].encode() for _, k, s in out["GpuSample"])


def test_workflow_life_cycle(world):
    agent, spool, gpus, clock = world
    agent.tick()
    started = [r for _, _, r in spooled(spool)["WorkflowEvent"]]
    assert {(e["workflow_id"], e["event"]) for e in started} == {("wf-a", "STARTED"), ("slurm-77", "STARTED")}
    wf_a = next(e for e in started if e["workflow_id"] == "wf-a")
    assert wf_a["gpu_uuids"] == ["GPU-0", "GPU-1"] and wf_a["pids"] == [101, 102]
    assert (wf_a["owner"], wf_a["team"], wf_a["attribution"]) == ("ana", "nlp", "env:GPUFLEET_WORKFLOW_ID")
    assert (wf_a["model"], wf_a["cluster"]) == ("bert-large", "east-1")
    assert (wf_a["scheduler_qos"], wf_a["scheduler_partition"]) == (None, None)  # not a Slurm job

    sent = spool.read(spool.cursor(), limit=100_000)
    spool.acknowledge(sent[-1].position, len(sent))
    clock.t += 11
    agent.tick()  # heartbeat due for both
    gpus[0].processes = [p for p in gpus[0].processes if p.pid != 201]
    clock.t += 1
    agent.tick()  # slurm-77 missing once
    clock.t += 1
    agent.tick()  # twice: ended
    events = [(r["workflow_id"], r["event"]) for _, _, r in spooled(spool)["WorkflowEvent"]]
    assert events == [("wf-a", "HEARTBEAT"), ("slurm-77", "HEARTBEAT"), ("slurm-77", "ENDED")]


def declared(tmp_path, *environments: dict[str, str]) -> tuple[HostAgent, dict[str, dict]]:
    """An agent's first tick over one process a GPU, each with its environment (pids 101, 102,
    ...): the agent, and its workflows' events by workflow."""
    from producers.agent.gpus.attribute_process import ProcessAttributor
    from producers.agent.gpus.sample_nvml import NvmlSampler
    from tests.support.fake_nvml import FakeGpu, FakeNvml
    from tests.support.proc_tree import make_process

    proc = tmp_path / "proc"
    for i, env in enumerate(environments):
        make_process(proc, 101 + i, env)
    sampler = NvmlSampler(FakeNvml([FakeGpu(f"GPU-{i}", util=5, processes=[FakeProcess(101 + i)])
                                    for i in range(len(environments))]))
    sampler.open()
    spool = Spool(tmp_path / "spool")
    agent = HostAgent(AgentSettings("node-7"), spool, CODEC, nvml=sampler, attributor=ProcessAttributor(proc=proc))
    agent.tick()
    return agent, {r["workflow_id"]: r for _, _, r in spooled(spool)["WorkflowEvent"]}


def test_a_process_whose_environment_names_its_service_declares_its_workflow_a_replica(tmp_path, caplog):
    """``GPUFLEET_SERVICE`` on a process (``--service-keys``): its workflow's events name the
    service, which the worker judges it a replica of; a value that cannot be a name declares
    nothing, and the log says why."""
    with caplog.at_level("WARNING"):
        agent, events = declared(tmp_path, {"GPUFLEET_WORKFLOW_ID": "wf-sd", "GPUFLEET_SERVICE": "sd-xl"},
                                 {"GPUFLEET_WORKFLOW_ID": "wf-bad", "GPUFLEET_SERVICE": "sd\x1b[2J"})
    assert (events["wf-sd"]["service"], events["wf-bad"]["service"]) == ("sd-xl", None)
    assert (agent.declared_service("wf-sd"), agent.declared_service("wf-bad")) == ("sd-xl", None)  # (its readings')
    assert "process 102: service 'sd\\x1b[2J' is not a printable name" in caplog.text


def login_node_environment() -> dict[str, str]:
    """What docs/owners.md has every login node export for its users (/etc/profile.d/gpufleet.sh):
    Slurm's sbatch hands it to every job submitted there (--export=ALL, its default)."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "owners.md").read_text()
    block = text[text.index("# every login node"):]
    block = block[:block.index("```")]
    exported = dict(re.findall(r"^export (\w+)=(\S+)$", block, re.MULTILINE))
    assert exported, "docs/owners.md sets up no login node"
    return exported


def test_what_a_login_node_exports_for_gpufleets_commands_declares_no_job_a_replica(tmp_path, caplog):
    """A training job submitted from a login node set up as docs/owners.md says carries the
    owners' service's address in its environment; it is not a serving replica (nor is a job of a
    login node set up by an older release, which exported the address as GPUFLEET_SERVICE)."""
    with caplog.at_level("INFO"):
        agent, events = declared(tmp_path, {"GPUFLEET_WORKFLOW_ID": "wf-train", **login_node_environment()},
                                 {"GPUFLEET_WORKFLOW_ID": "wf-older", "GPUFLEET_SERVICE": "https://gpufleet.example.org"})
    assert (events["wf-train"]["service"], events["wf-older"]["service"]) == (None, None)
    assert (agent.declared_service("wf-train"), agent.declared_service("wf-older")) == (None, None)
    assert "process 102: GPUFLEET_SERVICE 'https://gpufleet.example.org' is an address" in caplog.text


def test_simulated_source_publishes_its_hosts_gpus(tmp_path):
    fleet = build_fleet(seed=3, hosts=2, gpus_per_host=4, workflows=3)
    spool = Spool(tmp_path / "spool")
    agent = HostAgent(AgentSettings("gpu-host-001"), spool, CODEC, simulated=SimulatedGpus(fleet, "gpu-host-001", 0))
    assert agent.tick() == 4
    assert {r["host"] for _, _, r in spooled(spool)["GpuSample"]} == {"gpu-host-001"}
    with pytest.raises(ValueError, match="no host"):
        SimulatedGpus(fleet, "gpu-host-999", 0)


class _Forwarder:
    def run(self, sending):
        sending.wait()

    def drain(self, timeout_s):
        return True

    def hurry(self):
        pass


def test_the_agent_samples_faster_while_a_profile_is_captured(world):
    """Ticks stand for the time between them: 10 fast ones while profiling, then normal ones."""
    import dataclasses
    import threading

    from producers.agent.run import run_agent

    agent, spool, _, _ = world
    agent.settings = dataclasses.replace(agent.settings, interval_s=0.2, profile_interval_s=0.02)
    stop, calls = threading.Event(), []
    t = [100.0]  # the loop's clock: each tick comes exactly on time

    def profiling():
        calls.append(None)
        if len(calls) > 1:
            t[0] += 0.02 if len(calls) <= 11 else 0.2  # the interval the previous tick asked for
        if len(calls) == 12:
            stop.set()  # this tick still happens: 12 in all
        return len(calls) <= 10

    run_agent(agent, _Forwarder(), stop, profiling=profiling, clock=lambda: t[0])  # closes the spool
    records = spooled(Spool(spool.dir))
    intervals = [s["interval_ms"] for _, _, s in records["GpuSample"] if s["gpu_uuid"] == "GPU-1"]
    assert intervals == [20] * 11 + [200]  # the first tick stands for the interval asked for
    assert [r["interval_ms"] for _, _, r in records["HostSample"]] == intervals


def test_a_tick_slower_than_the_interval_stands_for_the_time_it_took(world):
    """A host too slow for the interval samples less often; its samples still add up to the time."""
    import threading

    from producers.agent.run import run_agent

    agent, spool, _, _ = world
    stop, t = threading.Event(), [100.0]
    slow = [0.0, 1.0, 2.5, 1.7, 3.0]  # seconds each tick took on a host asked for 1 s

    def profiling():
        t[0] += slow.pop(0)
        if not slow:
            stop.set()
        return False

    run_agent(agent, _Forwarder(), stop, profiling=profiling, clock=lambda: t[0])
    records = spooled(Spool(spool.dir))
    intervals = [s["interval_ms"] for _, _, s in records["GpuSample"] if s["gpu_uuid"] == "GPU-1"]
    assert intervals == [1000, 1000, 2500, 1700, 3000]


def test_a_capture_starting_mid_wait_is_sampled_from_its_start(world):
    """The coordinator's ``started`` event cuts the wait short: a capture shorter than the
    normal interval still gets its 10 Hz samples."""
    import threading

    from producers.agent.run import run_agent

    agent, spool, _, _ = world
    stop, t, capturing = threading.Event(), [100.0], [False]

    class Wake:  # a capture starts 0.3 s into the second wait
        waits = 0

        def wait(self, delay):
            self.waits += 1
            if self.waits == 2:
                t[0] += 0.3
                capturing[0] = True
                return True
            t[0] += delay
            return False

        def clear(self):
            pass

    ticks = []

    def profiling():
        ticks.append(t[0])
        if len(ticks) == 5:
            stop.set()
        return capturing[0]

    run_agent(agent, _Forwarder(), stop, profiling=profiling, clock=lambda: t[0], wake=Wake())
    records = spooled(Spool(spool.dir))
    intervals = [s["interval_ms"] for _, _, s in records["GpuSample"] if s["gpu_uuid"] == "GPU-1"]
    assert ticks == pytest.approx([100.0, 101.0, 101.3, 101.4, 101.5])
    assert intervals == [1000, 1000, 300, 100, 100]


def test_the_model_work_a_job_reports_rides_on_its_gpus_samples(tmp_path):
    """What a job reports of its model work becomes model_tflops on the samples of its
    process's GPUs, shared among them; a job that reports nothing has none."""
    # pid -> TFLOPS, as the profile directory says
    agent, spool, gpus, _ = make_world(tmp_path, AgentLinks(throughputs=lambda now: {101: 240.0}))
    gpus[1].processes.append(FakeProcess(101, sm_util=10))  # rank 0 now uses GPU-0 and GPU-1
    agent.tick()
    by = {(r["gpu_uuid"], r["workflow_id"]): r for _, _, r in spooled(spool)["GpuSample"]}
    assert by[("GPU-0", "wf-a")]["model_tflops"] == 120.0
    assert by[("GPU-1", "wf-a")]["model_tflops"] == 120.0
    assert by[("GPU-0", "slurm-77")]["model_tflops"] is None


def test_a_job_reports_its_model_work_through_the_profile_directory(tmp_path):
    """The hook's side writes 6 x parameters x tokens/s (or the job's own figure); the agent's
    side reads it while it is fresh and its process lives."""
    from producers.profiling.handoff import Handoff
    from producers.profiling.hook import report_throughput

    handoff = Handoff(tmp_path / "profiles")
    now = time.time()
    report_throughput(tokens_per_s=10_000, params=7e9, directory=tmp_path / "profiles")
    assert handoff.throughputs(now) == {os.getpid(): pytest.approx(420.0)}
    assert handoff.throughputs(now + 3600) == {}  # an hour later, with no new report: none
    handoff.report_throughput(2**22 + 7, 999.0, at=now)  # no such process
    assert set(handoff.throughputs(now)) == {os.getpid()}
    report_throughput(55.5, directory=tmp_path / "profiles")
    assert handoff.throughputs(time.time()) == {os.getpid(): 55.5}
    with pytest.raises(ValueError, match="tokens_per_s and params"):
        report_throughput(tokens_per_s=10_000, directory=tmp_path / "profiles")
    with pytest.raises(ValueError, match=">= 0"):
        report_throughput(float("nan"), directory=tmp_path / "profiles")


def test_the_allocator_peaks_a_job_reports_ride_on_its_gpus_samples(tmp_path):
    """What the profiling hook's report_memory writes (PyTorch's allocator peaks over the
    process's GPUs) reaches the samples of those GPUs, shared among them; the agent reads a
    report while it is fresh and its process lives."""
    from producers.profiling.handoff import Handoff

    # (pid 101 is a fixture, no live process: the agent is given its report as the handoff reads it)
    agent, spool, gpus, _ = make_world(tmp_path, AgentLinks(memory_peaks=lambda t: {101: (8 << 30, 12 << 30)}))
    gpus[1].processes.append(FakeProcess(101, sm_util=10))  # rank 0 now uses GPU-0 and GPU-1
    handoff = Handoff(tmp_path / "profiles")
    now = time.time()
    handoff.report_memory(101, 8 << 30, 12 << 30, at=now)  # pid 101: 8 GiB peak, 12 GiB reserved
    handoff.report_memory(os.getpid(), 1 << 30, 1 << 30, at=now - 3600)  # an hour old: none
    peaks = handoff.memory_peaks(now)
    assert set(peaks) <= {101} and handoff.memory_peaks(now + 3600) == {}
    agent.tick()
    by = {(r["gpu_uuid"], r["workflow_id"]): r for _, _, r in spooled(spool)["GpuSample"]}
    assert by[("GPU-0", "wf-a")]["allocator_peak_bytes"] == 4 << 30
    assert by[("GPU-1", "wf-a")]["allocator_reserved_bytes"] == 6 << 30
    assert by[("GPU-0", "slurm-77")]["allocator_peak_bytes"] is None


def test_report_memory_sends_pytorchs_allocator_peaks_over_the_processs_gpus(tmp_path, monkeypatch):
    """The hook's side, with torch faked at its boundary (torch.cuda): the sum of the peaks of
    every GPU the process uses reaches the agent's side; a process that never touched CUDA
    reports nothing."""
    import sys
    import types

    from producers.profiling.handoff import Handoff
    from producers.profiling.hook import report_memory

    peaks = {0: (3 << 30, 5 << 30), 1: (1 << 30, 2 << 30)}  # device -> (allocated, reserved) peaks
    initialized = [False]
    cuda = types.SimpleNamespace(is_initialized=lambda: initialized[0], device_count=lambda: len(peaks),
                                 max_memory_allocated=lambda d: peaks[d][0], max_memory_reserved=lambda d: peaks[d][1])
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    handoff = Handoff(tmp_path / "profiles")
    report_memory(directory=tmp_path / "profiles")
    assert handoff.memory_peaks(time.time()) == {}
    initialized[0] = True
    report_memory(directory=tmp_path / "profiles")
    assert handoff.memory_peaks(time.time()) == {os.getpid(): (4 << 30, 7 << 30)}
