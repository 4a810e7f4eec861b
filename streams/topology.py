"""The worker's stages and the topics between them, in flow order. Each stage is a module with
a ``register`` (its agents, timers and tables on the Faust app) beside the plain-function
logic it calls; ``stage_io`` is what they share.

    gpu-samples ─┐                     ┌─▶ workflow-windows, workflow-summaries
    workflow-events ─▶ windows ────────┼─▶ alerts, profile-requests (automatic)
    profile-results ─┘  (stage_windows)└─▶ profile-schedule (what runs where)
    kernel-events ───▶ traces ─────────▶ trace-analyses, findings, profile-results, profile-statuses
                        (stage_traces)
    trace-analyses ──▶ comparison ─────▶ findings (slower than the rank's previous profile; a straggler rank)
                        (stage_profile_comparison)
    profile-schedule ▶ scheduler ──────▶ profile-requests (periodic)
                        (stage_schedule)

Every stage sends what it cannot use to dead-letters, with the reason.
"""

from __future__ import annotations

import faust

from schemas.codec import Codec
from streams import stage_profile_comparison, stage_schedule, stage_traces, stage_windows

STAGES = (stage_windows, stage_traces, stage_profile_comparison, stage_schedule)


def register(app: faust.App, settings) -> None:  # settings: streams.app.StreamSettings
    """Add every stage's agents, timers and tables to ``app``."""
    codec = Codec()
    for stage in STAGES:
        stage.register(app, settings, codec)
