"""One thresholds object, from the worker's settings, reaches every judge: the detectors, the
goodput waterfall's buckets and the trace rules judge the same job alike, and move together
when a site changes a threshold (``StreamSettings.thresholds``)."""

from __future__ import annotations

import faust
import pytest

from schemas.codec import Codec
from schemas.sample_columns import columns_of
from schemas.topics import ALERTS, WORKFLOW_WINDOWS
from streams.alerts.detectors import DetectorConfig, Thresholds
from streams.alerts.raising import AlertConfig
from streams.settings import StreamSettings
from streams.stages.traces import TraceStage
from streams.stages.window_step import Decoded, WindowStep
from streams.windows.batches import WindowConfig
from streams.windows.goodput import GoodputConfig
from tests.support.kernel_events import end, kernel_events
from tests.support.samples import BASE_MS, sample

# A job at 45 % whose hosts wait on I/O 30 % of the time; its profile's GPU is busy 51 % of the trace.
UTIL, IOWAIT = 45.0, 30.0
SYSTEM = {"ticks": 30, "span_ms": 3000, "interval_ms_mean": 100.0, "gpus": 1, "gpu_utilization_mean_pct": UTIL,
          "gpu_zero_utilization_share": 0.5, "sm_active_mean_pct": None, "power_mean_watts": 90.0,
          "memory_peak_fraction": 0.3, "workflow_cpu_mean_pct": 10.0, "host_cpu_mean_pct": 20.0,
          "host_iowait_mean_pct": IOWAIT}


def settings_with(thresholds: Thresholds) -> StreamSettings:
    return StreamSettings(bootstrap="127.0.0.1:1", thresholds=thresholds, alerts=AlertConfig(min_duration_s=0),
                          window=WindowConfig(goodput=GoodputConfig(startup_max_s=0.0)))


def window_verdicts(settings: StreamSettings, team: str) -> tuple[bool, bool]:
    """(an input-bound alert fired, every closed window put its busy seconds in the input-bound bucket)."""
    step = WindowStep(settings, {}, {}, clock=lambda: BASE_MS + 10**9)
    samples = [sample(workflow_id="wf-io", team=team, event_time=BASE_MS + t * 1000, utilization_pct=UTIL,
                      host_iowait_pct=IOWAIT) for t in range(200)]
    batch = [Decoded(i, "GpuSampleColumns", b, i) for i, b in enumerate(columns_of(samples))]
    sent = step.samples(0, batch, BASE_MS + 10**8).records
    windows = [r for spec, r in sent if spec is WORKFLOW_WINDOWS]
    fired = any(r["detector"] == "input_bound" and r["status"] == "FIRING" for spec, r in sent if spec is ALERTS)
    assert windows, "the windows closed"
    bucketed = {w["input_bound_gpu_seconds"] == pytest.approx(w["gpu_seconds"]) for w in windows}
    assert len(bucketed) == 1, "one verdict for every window"
    return fired, bucketed.pop()


def trace_verdict(settings: StreamSettings) -> bool:
    """The trace stage as the worker builds it from the same settings: a storage-bound finding?"""
    app = faust.App("test-one-route", broker="kafka://127.0.0.1:1", store="memory://", autodiscover=False)
    stage = TraceStage(app, settings, Codec())
    result = stage.sessions.apply(0, kernel_events() + [end(system=SYSTEM)], now_ms=10)
    assert result.analyses and 40 < 100 - result.analyses[0]["idle_pct"] < 60
    return any(f["rule"] == "storage_bound_input" for f in result.findings)


@pytest.mark.parametrize("limit, starved", [(40.0, False), (60.0, True)])
def test_one_input_bound_threshold_judges_the_alert_the_waterfall_and_the_trace_alike(limit, starved):
    settings = settings_with(Thresholds(DetectorConfig(input_bound_util_pct=limit)))
    assert window_verdicts(settings, "vision") == (starved, starved)
    assert trace_verdict(settings) == starved


def test_a_teams_threshold_judges_its_alerts_and_its_waterfall_alike():
    thresholds = Thresholds(DetectorConfig(), teams={"vision": DetectorConfig(input_bound_util_pct=60.0)})
    assert window_verdicts(settings_with(thresholds), "vision") == (True, True)
    assert window_verdicts(settings_with(thresholds), "speech") == (False, False)
    # A trace carries no team: its rules judge by the site's default.
    assert trace_verdict(settings_with(thresholds)) is False
