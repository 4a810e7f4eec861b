"""One window closed from samples, through the window aggregator."""

from __future__ import annotations

from streams.windows.batches import Incoming, WindowConfig
from streams.windows.utilization import WindowAggregator
from tests.support.samples import BASE_MS, sample

CFG = WindowConfig(size_ms=60_000, allowed_lateness_ms=0, retention_ms=600_000, update_horizon_ms=300_000)


def close_one(samples):
    """The window of workflow ``wf-a`` that ``samples`` fill, closed by another workflow's sample
    a minute later."""
    agg = WindowAggregator(CFG, {})
    batch = [Incoming.row(i, s) for i, s in enumerate(samples)]
    batch.append(Incoming.row(len(samples), sample(workflow_id="wf-other", event_time=BASE_MS + 60_000)))
    (window,) = [w for w in agg.process(0, batch, closed_at=0).closed if w["workflow_id"] == "wf-a"]
    return window
