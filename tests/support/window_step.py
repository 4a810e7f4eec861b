"""The window stage's step driven as a partition's messages (``streams.stages.window_step``):
a step with quick thresholds, a feed of records offset after offset, GPU ticks of a workflow."""

from __future__ import annotations

from schemas.sample_columns import columns_of
from streams.alerts.detectors import DetectorConfig, Thresholds
from streams.enforcement.ladder import Ladder
from streams.settings import StreamSettings
from streams.stages.window_step import Decoded, WindowStep
from streams.windows.batches import WindowConfig
from streams.windows.goodput import GoodputConfig
from tests.support.samples import BASE_MS, sample

QUICK = DetectorConfig(idle_min_s=60.0, partial_min_s=60.0, low_util_min_s=60.0)
LADDER = Ladder(name="idle", detector="idle_allocated", first_warning_min=1, second_warning_min=2, action_min=10,
                command=("scancel", "{scheduler_job_id}"), act=True)


def make(startup_max_s: float = 900.0, ladders=()) -> tuple[WindowStep, dict]:
    settings = StreamSettings(bootstrap="-", thresholds=Thresholds(QUICK), workflow_ended_s=120.0,
                              window=WindowConfig(goodput=GoodputConfig(startup_max_s=startup_max_s)),
                              enforcement=tuple(ladders))
    store: dict = {}
    return WindowStep(settings, store, {}, clock=lambda: BASE_MS + 10**9), store


class Feed:
    """A partition's messages, offset after offset."""

    def __init__(self, step: WindowStep) -> None:
        self.step, self.offset, self.sent = step, 0, []

    def __call__(self, *records: tuple[str, dict], now: int | None = None):
        batch = []
        for i, (name, record) in enumerate(records):
            batch.append(Decoded(i, name, record, self.offset))
            self.offset += 1
        out = self.step.samples(0, batch, now or BASE_MS + 10**8)
        self.sent += out.records
        return out

    def of(self, spec) -> list[dict]:
        return [r for s, r in self.sent if s is spec]


def ticks(wf: str, first_s: int, last_s: int, util: float = 0.0, gpus: int = 2) -> list[tuple[str, dict]]:
    samples = [sample(workflow_id=wf, owner="ana", team="vision", event_time=BASE_MS + t * 1000, utilization_pct=util,
                      gpu_uuid=f"GPU-{g}", gpu_index=g) for t in range(first_s, last_s) for g in range(gpus)]
    return [("GpuSampleColumns", b) for b in columns_of(samples)]


def blocks(workflow_id: str, first_s: int, last_s: int) -> list[tuple[str, dict]]:
    """One GPU of a workflow at 0 %, a sample a second, with no owner or team (free capacity's)."""
    samples = [sample(workflow_id=workflow_id, owner=None, team=None, event_time=BASE_MS + t * 1000,
                      utilization_pct=0.0) for t in range(first_s, last_s)]
    return [("GpuSampleColumns", b) for b in columns_of(samples)]


def ended(workflow_id: str, at_s: float, host: str = "gpu-host-000", scheduler: str | None = "slurm") -> tuple:
    """The ENDED of a Slurm job's workflow (``scheduler``: who ended it; None: its host)."""
    return ("WorkflowEvent", {
        "workflow_id": workflow_id, "event": "ENDED", "event_time": BASE_MS + int(at_s * 1000), "host": host,
        "owner": "ana", "team": "vision", "gpu_uuids": ["GPU-0"], "pids": [], "attribution": "allocation:slurm",
        "scheduler_job_id": workflow_id.removeprefix("slurm-"), "scheduler": scheduler})
