"""The window stage's decisions on what a batch of samples leads to, driven through the stage
itself (``WindowStage._apply_samples``) with its records recorded instead of sent."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import faust
import pytest

from schemas.codec import Codec
from schemas.sample_columns import columns_of
from schemas.validate_sample import IDLE, UNALLOCATED
from streams.alerts.detectors import DetectorConfig, Thresholds
from streams.settings import StreamSettings
from streams.stages import state as stage_state
from streams.stages.windows import WindowStage
from tests.support.samples import BASE_MS, sample


@pytest.fixture
def stage(monkeypatch):
    app = faust.App("test-stage-windows", broker="kafka://127.0.0.1:1", store="memory://", autodiscover=False)
    quick = Thresholds(DetectorConfig(idle_min_s=60.0, partial_min_s=60.0))
    stage = WindowStage(app, StreamSettings(bootstrap="127.0.0.1:1", thresholds=quick, workflow_ended_s=120.0),
                        Codec())
    sent: list[tuple[str, dict]] = []

    async def send(codec, topic, spec, record):
        sent.append((spec.name, record))

    monkeypatch.setattr(stage_state, "send", send)
    stage.sent = sent
    return stage


def apply(stage, records: list[tuple[str, dict]], first_offset: int = 0, now: int | None = None) -> None:
    codec = Codec()
    messages = [SimpleNamespace(value=codec.encode(name, r), offset=first_offset + i, partition=0,
                                key=r["workflow_id"].encode(), topic="gpufleet.gpu-samples.v1")
                for i, (name, r) in enumerate(records)]
    asyncio.run(stage._apply_samples(0, messages, now=now or BASE_MS + 3_600_000))


def blocks(workflow_id: str, first_s: int, last_s: int, **fields) -> list[tuple[str, dict]]:
    samples = [sample(workflow_id=workflow_id, owner=None, team=None, event_time=BASE_MS + t * 1000,
                      utilization_pct=0.0, **fields) for t in range(first_s, last_s)]
    return [("GpuSampleColumns", b) for b in columns_of(samples)]


def of(stage, topic: str) -> list[dict]:
    return [r for name, r in stage.sent if name.endswith(topic)]


@pytest.mark.parametrize("pseudo", [IDLE, UNALLOCATED])
def test_gpus_no_workflow_holds_are_counted_but_never_alerted_or_summarised(stage, pseudo):
    """GPUs that no process (or no allocation) holds are the fleet's free capacity: their
    windows go out, so that capacity is counted, but nobody is alerted about them, no ladder
    climbs for them and no job ends."""
    apply(stage, blocks(pseudo, 0, 600))
    apply(stage, blocks("wf-real", 600, 601), first_offset=1000)  # the clock moves on: all closes
    windows = [w for w in of(stage, "workflow-windows.v1") if w["workflow_id"] == pseudo]
    assert len(windows) >= 9 and all(w["idle_gpus"] == 1 for w in windows)
    assert of(stage, "alerts.v1") == []
    assert [s for s in of(stage, "workflow-summaries.v1") if s["workflow_id"] == pseudo] == []


def ended(workflow_id: str, at_s: float, host: str = "gpu-host-000", scheduler: str | None = "slurm") -> tuple:
    return ("WorkflowEvent", {
        "workflow_id": workflow_id, "event": "ENDED", "event_time": BASE_MS + int(at_s * 1000), "host": host,
        "owner": "ana", "team": "vision", "gpu_uuids": ["GPU-0"], "pids": [], "attribution": "allocation:slurm",
        "scheduler_job_id": workflow_id.removeprefix("slurm-"), "scheduler": scheduler})


def test_a_schedulers_end_closes_the_jobs_windows_and_summarises_it_at_once(stage):
    """The end travels on the samples topic after the job's last samples: the job's last
    window closes then, not when the fleet's clock passes it, and its summary goes out."""
    apply(stage, [*blocks("slurm-1", 0, 96), ended("slurm-1", 96)])
    windows = [w for w in of(stage, "workflow-windows.v1") if w["workflow_id"] == "slurm-1"]
    assert [(w["window_start"] - BASE_MS, w["gpu_seconds"]) for w in windows] == [(0, 60.0), (60_000, 36.0)]
    summary, = of(stage, "workflow-summaries.v1")
    assert summary["workflow_id"] == "slurm-1" and summary["gpu_seconds"] == 96.0
    assert summary["end_reason"] == "its scheduler (slurm) ended it"


def test_a_job_on_two_hosts_ends_when_both_have_ended_it(stage):
    for host in ("gpu-host-000", "gpu-host-001"):
        stage.step._hear(0, {**ended("slurm-2", 0, host)[1], "event": "STARTED"})
    apply(stage, [*blocks("slurm-2", 0, 90), ended("slurm-2", 90, "gpu-host-000")])
    assert of(stage, "workflow-summaries.v1") == []
    assert [w["window_start"] - BASE_MS for w in of(stage, "workflow-windows.v1")] == [0]
    apply(stage, [*blocks("slurm-2", 90, 100), ended("slurm-2", 100, "gpu-host-001")], first_offset=100)
    summary, = of(stage, "workflow-summaries.v1")
    assert summary["gpu_seconds"] == 100.0


def test_a_sample_after_the_early_close_completes_the_window_as_a_new_version(stage):
    apply(stage, [*blocks("slurm-3", 0, 90), ended("slurm-3", 90)])
    apply(stage, blocks("slurm-3", 90, 92), first_offset=100)  # a straggler of the same window
    versions = [(w["window_start"] - BASE_MS, w["version"], w["gpu_seconds"]) for w in of(stage, "workflow-windows.v1")]
    assert versions == [(0, 1, 60.0), (60_000, 1, 30.0), (60_000, 2, 32.0)]


def test_the_life_cycle_topic_leaves_a_schedulers_end_to_the_samples_topic(stage):
    """The same end on the life-cycle topic is not applied there: read before the job's last
    samples, it would end the job early."""
    apply(stage, blocks("slurm-4", 0, 30))
    codec = Codec()
    message = SimpleNamespace(value=codec.encode("WorkflowEvent", ended("slurm-4", 30)[1]), offset=0, partition=0,
                              key=b"slurm-4", topic="gpufleet.workflow-events.v1")

    async def one_batch():
        async def events():
            yield [SimpleNamespace(message=message)]

        class Stream:
            def take_events(self, n, within):
                return events()

        await stage.life_cycle(Stream())

    asyncio.run(one_batch())
    assert stage.table.data["slurm-4"].ending is False
    apply(stage, [ended("slurm-4", 30)], first_offset=100)
    assert stage.table.data["slurm-4"].ended and of(stage, "workflow-summaries.v1")


def test_a_gpu_the_job_never_opens_and_a_foreign_process_are_alerted_with_names(stage):
    samples = []
    for t in range(200):
        at = BASE_MS + t * 1000
        samples += [sample(workflow_id="slurm-5", event_time=at, gpu_uuid="GPU-0", gpu_index=0, process_count=1,
                           utilization_pct=80.0),
                    sample(workflow_id="slurm-5", event_time=at, gpu_uuid="GPU-1", gpu_index=1, process_count=0,
                           utilization_pct=0.0, memory_used_bytes=0),
                    sample(workflow_id="slurm-5", event_time=at, gpu_uuid="GPU-2", gpu_index=2, process_count=1,
                           utilization_pct=30.0, foreign_workflow_id="wf-intruder")]
    apply(stage, [("GpuSampleColumns", b) for b in columns_of(samples)])
    alerts = {a["detector"]: a for a in of(stage, "alerts.v1") if a["status"] == "FIRING"}
    assert {"partial_use", "foreign_process"} <= set(alerts)
    assert "gpu-host-000/gpu1" in alerts["partial_use"]["message"]
    assert "no process of the job ever opened them: gpu-host-000/gpu1." in alerts["partial_use"]["message"]
    assert "wf-intruder" in alerts["foreign_process"]["message"] and "slurm-5" in alerts["foreign_process"]["message"]


def test_summaries_decided_by_the_timer_are_sent_under_the_stages_lock(stage, monkeypatch):
    """The timer that follows the fleet's clock also sends the summaries of workflows whose
    end the life cycle decided: like a batch, it must hold the stage's lock while it changes
    states and sends, or a commit can write the state of an ended workflow whose summary is
    not yet on its way (a new owner would then never send it)."""
    held = []

    async def send(codec, topic, spec, record):
        held.append((spec.name, stage.lock.locked()))

    async def clock(**kwargs):
        held.append(("clock", stage.lock.locked()))

    monkeypatch.setattr(stage_state, "send", send)
    monkeypatch.setattr(stage.samples_topic, "send", clock)
    monkeypatch.setattr(stage, "assigned", lambda: [0])
    apply(stage, blocks("wf-over", 0, 30))
    apply(stage, blocks("wf-on", 30, 120), first_offset=100)  # wf-over's windows close
    stage.step._hear(0, {**ended("wf-over", 30, scheduler=None)[1]})  # its hosts said it ended
    held.clear()
    asyncio.run(stage.partition_clocks())
    summaries = [locked for name, locked in held if name.endswith("workflow-summaries.v1")]
    assert summaries == [True]
