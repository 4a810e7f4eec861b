"""Random lives of a Slurm job, from its GPUs to its summary: a start at any millisecond, bursts
and idle stretches, the agent killed and started again (once before the job's start, or twice
during it), the epilog telling the end up to 2.5 s late. Through the agent (a fake NVML at the
pynvml boundary, gpufleet's Slurm directory, its hold and its checkpoint) and the window
stage's step, whatever the life:

- the job's windows hold GPUs x the scheduler's Elapsed, to the millisecond, each window's
  buckets summing to its GPU-seconds (the unobserved ones where no agent ran);
- no alert of the job is firing once it has ended; each episode messages its owner once;
- the summary's start and end are the scheduler's.

The lives are the same each run; ``HYPOTHESIS_PROFILE=explore GPUFLEET_FUZZ_SCALE=10`` draws new ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producers.agent.allocations.allocation import Allocation
from producers.agent.allocations.slurm import SlurmAllocations, SlurmDirectory
from producers.agent.gpus.attribute_process import ProcessAttributor
from producers.agent.gpus.sample_nvml import NvmlSampler
from producers.agent.host_agent import AgentSettings, HostAgent
from producers.agent.spool.disk import Spool
from schemas.codec import Codec
from schemas.goodput_buckets import BUCKETS
from schemas.topics import ALERTS, GPU_SAMPLES, WORKFLOW_EVENTS, WORKFLOW_SUMMARIES, WORKFLOW_WINDOWS
from streams.alerts.detectors import DetectorConfig, Thresholds
from streams.alerts.lifecycle import LifecycleConfig
from streams.alerts.raising import AlertConfig
from streams.settings import StreamSettings
from streams.stages.window_step import Decoded, WindowStep
from streams.windows.batches import WindowConfig
from streams.windows.goodput import GoodputConfig
from tests.support.fake_nvml import FakeGpu, FakeNvml, FakeProcess
from tests.support.proc_tree import make_process

CODEC = Codec()
T0 = 1_796_000_000_000  # a minute boundary
QUICK = DetectorConfig(idle_min_s=60.0, partial_min_s=60.0, low_util_min_s=60.0)
SCALE = float(os.environ.get("GPUFLEET_FUZZ_SCALE", "1"))  # (HYPOTHESIS_PROFILE=explore: new lives each run)


@dataclass
class Life:
    start_ms: int
    phases: list[tuple[bool, int]]  # (busy, seconds)
    gaps: list[tuple[int, int]]  # the agent down from this second of the life, for so many seconds
    prolog_ms: int  # the prolog's record, this long after the start
    epilog_ms: int  # the epilog's, this long after the end

    @property
    def end_ms(self) -> int:
        return self.start_ms + sum(s for _, s in self.phases) * 1000 + 317


@st.composite
def lives(draw) -> Life:
    phases = draw(st.lists(st.tuples(st.booleans(), st.integers(5, 150)), min_size=1, max_size=4))
    total = sum(s for _, s in phases)
    gaps = sorted(draw(st.lists(st.tuples(st.integers(-20, total - 5), st.integers(2, 80)), max_size=2)))
    kept, free = [], -30
    for at, length in gaps:  # apart from each other, each ending before the job's end
        if at > free and at + length < total:
            kept.append((at, length))
            free = at + length + 3
    return Life(T0 + draw(st.integers(0, 59_999)), phases, kept, draw(st.integers(0, 900)),
                draw(st.integers(100, 2_500)))


class Host:
    """Four GPUs; the job has Slurm's GPUs 0 and 1, which its process (pid 500) keeps busy or not."""

    def __init__(self, root) -> None:
        make_process(root / "proc", 500, {"SLURM_JOB_ID": "77"})
        self.gpus = [FakeGpu(f"GPU-{i}", util=0, mem_used=0, minor=i) for i in range(4)]
        self.root = root
        self.directory = SlurmDirectory(root / "slurm")

    def use(self, busy: bool | None) -> None:
        for g in self.gpus[:2]:
            g.util = 80 if busy else 0
            g.processes = [FakeProcess(500, sm_util=80 if busy else 0)] if busy is not None else []

    def agent(self, clock) -> HostAgent:
        sampler = NvmlSampler(FakeNvml(self.gpus))
        sampler.open()
        return HostAgent(AgentSettings("node-1", interval_s=1.0, hold_s=5.0), Spool(self.root / "spool"), CODEC,
                         nvml=sampler, attributor=ProcessAttributor(proc=self.root / "proc"), clock=clock,
                         allocations=SlurmAllocations(self.root / "slurm"))


def run_life(life: Life, root) -> list[tuple[str, str, dict]]:
    """The life, tick by tick at 1 Hz; what the agents spooled, in order: (topic, schema, record)."""
    host = Host(root)
    now = [T0 - 30_000]

    def clock() -> float:
        return now[0] / 1000

    job = Allocation(scheduler="slurm", job_id="77", workflow_id="slurm-77", gpus=("0", "1"), owner="ana",
                     team="vision", partition="gpu", qos="normal", started_ms=life.start_ms)
    agent, last, prolog, epilog = host.agent(clock), None, False, False
    end = life.end_ms
    while now[0] < end + life.epilog_ms + 8_000:
        t = now[0]
        offset_s = (t - life.start_ms) / 1000
        if not prolog and t >= life.start_ms + life.prolog_ms:
            host.directory.started(job, t)
            prolog = True
        if not epilog and t >= end + life.epilog_ms:
            host.directory.ended(Allocation(**{**{f: getattr(job, f) for f in job.__struct_fields__},
                                               "ended_ms": end, "end_state": "COMPLETED"}), t)
            epilog = True
        phase, elapsed = None, 0
        for busy, seconds in life.phases:
            if 0 <= offset_s - elapsed < seconds:
                phase = busy
            elapsed += seconds
        host.use(phase if prolog and t < end else None)  # (the job's processes start after its prolog)
        down = [(a, n) for a, n in life.gaps if a <= offset_s < a + n]
        if down:
            if agent is not None:
                agent.spool.close()
                agent, last = None, None  # kill -9: what it held is lost, its checkpoint stays
        else:
            if agent is None:
                agent = host.agent(clock)
            agent.tick(None if last is None else (t - last) / 1000)
            last = t
        now[0] += 1000 + (137 if (t // 1000) % 7 == 0 else 0)  # now and then a late tick
    agent.stop()
    spool = Spool(root / "spool")
    out = []
    for r in spool.read(spool.cursor(), limit=10**6):
        name, record = CODEC.decode(r.value)
        out.append((r.topic, name, record))
    return out


def through_the_worker(records) -> list:
    settings = StreamSettings(bootstrap="-", thresholds=Thresholds(QUICK), alerts=AlertConfig(
        lifecycle=LifecycleConfig(reopen_within_s=120.0)), workflow_ended_s=600.0,
        window=WindowConfig(goodput=GoodputConfig(startup_max_s=30.0)))
    step = WindowStep(settings, {}, {}, clock=lambda: T0 + 10**9)
    sent = []
    for offset, (topic, name, record) in enumerate(records):
        d = Decoded(0, name, record, offset)
        if topic == GPU_SAMPLES.name:
            out = step.samples(0, [d], T0)
        elif topic == WORKFLOW_EVENTS.name:
            out = step.life_cycle(0, [d], T0)
        else:
            continue
        assert not out.dead, out.dead
        sent += out.records
    return sent


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@settings(max_examples=int(20 * SCALE), deadline=None, derandomize=os.environ.get("HYPOTHESIS_PROFILE") != "explore",
          database=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(life=lives())
def test_a_jobs_life_is_charged_to_the_schedulers_millisecond_and_its_alerts_end_with_it(life, tmp_path_factory):
    sent = through_the_worker(run_life(life, tmp_path_factory.mktemp("life")))
    windows: dict[int, dict] = {}
    for spec, w in sent:
        newer = w.get("version", 0) > windows.get(w.get("window_start"), {}).get("version", 0)
        if spec is WORKFLOW_WINDOWS and w["workflow_id"] == "slurm-77" and newer:
            windows[w["window_start"]] = w
    for w in windows.values():
        assert sum(w[f"{b}_gpu_seconds"] for b in BUCKETS) == pytest.approx(w["gpu_seconds"], abs=1e-9)
    held = sum(w["gpu_seconds"] for w in windows.values())
    assert held == pytest.approx(2 * (life.end_ms - life.start_ms) / 1000, abs=1e-6), (held, life)
    # Unobserved: the agent's outages within the life, and what it held when it was killed (at most 5 s).
    total = sum(seconds for _, seconds in life.phases)
    down = sum(max(0, min(at + n, total) - max(at, 0)) for at, n in life.gaps)
    unseen = sum(w["unobserved_gpu_seconds"] for w in windows.values()) / 2
    assert down - 1.5 <= unseen <= down + 6.5 * len(life.gaps), (unseen, down, life)
    summary = [r for spec, r in sent if spec is WORKFLOW_SUMMARIES][-1]
    assert (summary["allocated_at"], summary["ended_at"], summary["end_state"]) == (life.start_ms, life.end_ms,
                                                                                   "COMPLETED")
    assert summary["gpu_seconds"] == pytest.approx(held, abs=1e-6)
    transitions: dict[str, list[dict]] = {}
    for spec, a in sent:
        if spec is ALERTS and a["workflow_id"] == "slurm-77":
            transitions.setdefault(a["alert_id"], []).append(a)
    for alert_id, seen in transitions.items():
        assert seen[-1]["status"] == "RESOLVED", (alert_id, [a["status"] for a in seen])
        assert sum(1 for a in seen if a["status"] == "FIRING" and a["notify"]) <= 1, alert_id
