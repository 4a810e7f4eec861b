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
from streams import stage_windows
from streams.app import StreamSettings
from streams.detect_waste import DetectorConfig
from streams.raise_alerts import AlertConfig
from streams.stage_windows import WindowStage
from tests.unit.samples import BASE_MS, sample


@pytest.fixture
def stage(monkeypatch):
    app = faust.App("test-stage-windows", broker="kafka://127.0.0.1:1", store="memory://", autodiscover=False)
    quick = AlertConfig(detectors=DetectorConfig(idle_min_s=60.0, partial_min_s=60.0))
    stage = WindowStage(app, StreamSettings(bootstrap="127.0.0.1:1", alerts=quick, workflow_ended_s=120.0),
                        Codec())
    sent: list[tuple[str, dict]] = []

    async def send(codec, topic, spec, record):
        sent.append((spec.name, record))

    monkeypatch.setattr(stage_windows, "send", send)
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
