"""The worker's stages and the topics between them, in flow order. Each stage is a module of
``streams.stages`` with a ``register`` (its agents, timers and tables on the Faust app) that
reads its topics, calls the stage's plain logic and sends what it returns; ``streams.stages.io``
is what they share.

    gpu-samples ─┐                      ┌─▶ workflow-windows, workflow-summaries
    workflow-events ─▶ windows ─────────┼─▶ alerts, profile-requests (automatic)
    profile-results ─┘ (stages.windows) └─▶ profile-schedule (what runs where)
    kernel-events ───▶ traces ──────────▶ trace-analyses, findings, profile-results, profile-statuses
                        (stages.traces)
    trace-analyses ──▶ comparison ──────▶ findings (slower than the rank's previous profile; a straggler rank)
                        (stages.comparison)
    profile-schedule ▶ scheduler ───────▶ profile-requests (periodic)
                        (stages.profile_schedule)

Every stage sends what it cannot use to dead-letters, with the reason.
"""

from __future__ import annotations

import faust

from schemas.codec import Codec
from streams import faust_fixes
from streams.settings import StreamSettings
from streams.stages import comparison as profile_comparison
from streams.stages import profile_schedule as scheduler
from streams.stages import traces, windows
from streams.stages.io import METRICS

STAGES = (windows, traces, profile_comparison, scheduler)


LAG_EVERY_S = 5.0


def register(app: faust.App, settings: StreamSettings) -> None:
    """Add every stage's agents, timers and tables to ``app``, and the timer that keeps the
    worker's consumer lag metric (``streams.stages.io.METRICS``) current."""
    codec = Codec()
    for stage in STAGES:
        stage.register(app, settings, codec)

    @app.timer(interval=LAG_EVERY_S)
    async def consumer_lag() -> None:
        if not app.rebalancing:
            METRICS.set_lag(worker_lag(app))


def worker_lag(app: faust.App) -> dict[tuple[str, int], int]:
    """Per stream partition this worker owns: the messages past its committed offset (the
    tables' changelogs, which it only reads while it recovers, are left out)."""
    consumer, changelogs = app.consumer, app.tables.changelog_topics
    lags = {}
    for tp in consumer.assignment():
        if tp.topic in changelogs:
            continue
        high, start = consumer.highwater(tp), faust_fixes.start_offset(consumer, tp)
        if high is not None and high >= 0 and start is not None and start >= 0:
            lags[(tp.topic, tp.partition)] = max(0, high - start)
    return lags
