"""The window stage's Faust side: what it does with Faust's own machinery, driven through Faust
(its agents' test context, its timers), with the records it sends recorded instead of sent.
What the stage decides is tested on its step (``tests/unit/streams/stages/test_window_step.py``)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import faust
import pytest

from schemas.codec import Codec
from streams.alerts.detectors import DetectorConfig, Thresholds
from streams.settings import StreamSettings
from streams.stages import state as stage_state
from streams.stages.windows import LIFE_CYCLE, WindowStage
from tests.support.samples import BASE_MS
from tests.support.window_step import blocks, ended


@pytest.fixture
def stage(monkeypatch):
    app = faust.App("test-stage-windows", broker="kafka://127.0.0.1:1", store="memory://", autodiscover=False)
    quick = Thresholds(DetectorConfig(idle_min_s=60.0, partial_min_s=60.0))
    stage = WindowStage(app, StreamSettings(bootstrap="127.0.0.1:1", thresholds=quick, workflow_ended_s=120.0),
                        Codec())
    sent: list[tuple[str, dict]] = []

    async def send(codec, topic, spec, record):
        sent.append((spec.name, record))

    async def dead_letter(codec, topic, stage_name, message, reason, now):
        sent.append(("dead-letters", {"stage": stage_name, "offset": message.offset, "reason": reason}))
        stage.lettered.set()

    monkeypatch.setattr(stage_state, "send", send)
    monkeypatch.setattr(stage_state, "send_dead_letter", dead_letter)
    stage.sent = sent
    stage.lettered = asyncio.Event()  # set by the stage's first dead letter
    return stage


def apply(stage, records: list[tuple[str, dict]], first_offset: int = 0, now: int | None = None) -> None:
    codec = Codec()
    messages = [SimpleNamespace(value=codec.encode(name, r), offset=first_offset + i, partition=0,
                                key=r["workflow_id"].encode(), topic="gpufleet.gpu-samples.v1")
                for i, (name, r) in enumerate(records)]
    asyncio.run(stage._apply_samples(0, messages, now=now or BASE_MS + 3_600_000))








def test_the_life_cycle_agent_reads_its_topic_through_faust(stage):
    """Driven with Faust's test context: the agent decodes its topic's messages, applies the
    agents' STARTED through the step, leaves a scheduler's end to the samples topic (read there
    in order with the job's last samples) and sends what it cannot read to the dead letters."""
    stage.register()
    agent = stage.app.agents[LIFE_CYCLE]
    codec = Codec()
    started = {**ended("slurm-4", 0)[1], "event": "STARTED"}
    apply(stage, blocks("slurm-4", 0, 30))

    async def run():
        async with agent.test_context() as context:
            await context.put(key=b"slurm-4", value=codec.encode("WorkflowEvent", started), partition=0)
            await context.put(key=b"slurm-4", value=codec.encode(*ended("slurm-4", 30)), partition=0)
            await context.put(key=b"slurm-4", value=b"\x00\x00\x00\x00\x01garbage", partition=0)
            # The agent runs in Faust's task: the last message's dead letter says it has read all three.
            await asyncio.wait_for(stage.lettered.wait(), timeout=10)

    asyncio.run(run())
    assert stage.table.data["slurm-4"].hosts == ["gpu-host-000"] and stage.table.data["slurm-4"].ending is False
    letter, = [r for name, r in stage.sent if name == "dead-letters"]
    assert letter["stage"] == "workflow-life-cycle" and letter["offset"] == 2
    apply(stage, [ended("slurm-4", 30)], first_offset=100)
    assert stage.table.data["slurm-4"].ended and any(name.endswith("workflow-summaries.v1") for name, _ in stage.sent)


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
