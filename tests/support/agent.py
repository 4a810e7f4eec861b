"""A host agent with a fake NVML (the pynvml boundary) and a fixture /proc: four GPUs, two
processes of one workflow, a Slurm job's, one of no workflow, and a GPU with nothing on it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from producers.agent.gpus.attribute_process import ProcessAttributor
from producers.agent.gpus.sample_nvml import NvmlSampler
from producers.agent.host_agent import AgentSettings, HostAgent
from producers.agent.links import AgentLinks
from producers.agent.metrics import AgentMetrics
from producers.agent.spool.disk import Spool
from schemas.codec import Codec
from tests.support.fake_nvml import FakeGpu, FakeNvml, FakeProcess
from tests.support.proc_tree import make_process

CODEC = Codec()


class Clock:
    def __init__(self) -> None:
        self.t = 1_767_225_600.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def world(tmp_path):
    return make_world(tmp_path)


def make_world(tmp_path, links: AgentLinks | None = None, metrics: bool = False):
    """The agent (built with ``links``, and with metrics of its spool if ``metrics``), its spool,
    its fake GPUs and its clock."""
    proc = tmp_path / "proc"
    make_process(proc, 101, {"GPUFLEET_WORKFLOW_ID": "wf-a", "GPUFLEET_OWNER": "ana", "GPUFLEET_TEAM": "nlp",
                             "GPUFLEET_MODEL": "bert-large", "RANK": "0"})
    make_process(proc, 102, {"GPUFLEET_WORKFLOW_ID": "wf-a", "GPUFLEET_OWNER": "ana", "RANK": "1"})
    make_process(proc, 201, {"SLURM_JOB_ID": "77"})
    make_process(proc, 301, {"HOME": "/"})
    gpus = [
        FakeGpu("GPU-0", util=90, processes=[FakeProcess(101, sm_util=60), FakeProcess(201, sm_util=20)]),
        FakeGpu("GPU-1", util=80, processes=[FakeProcess(102, sm_util=80)]),
        FakeGpu("GPU-2", util=0, mem_used=300 << 20),                 # nothing on it: idle capacity
        FakeGpu("GPU-3", util=0, mem_used=20 << 30, processes=[FakeProcess(301)]),  # memory, no workflow id
    ]
    nvml = FakeNvml(gpus)
    sampler = NvmlSampler(nvml)
    sampler.open()
    spool = Spool(tmp_path / "spool")
    clock = Clock()
    if metrics:
        links = replace(links or AgentLinks(), metrics=AgentMetrics(spool))
    agent = HostAgent(AgentSettings("node-7", heartbeat_s=10, ended_after_ticks=2, cluster="east-1"), spool, CODEC,
                      nvml=sampler, attributor=ProcessAttributor(proc=proc), clock=clock, links=links)
    return agent, spool, gpus, clock
