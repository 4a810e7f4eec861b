"""The regression stage: each new ``TraceAnalysis`` of a workflow's rank is compared with the
previous profile of that rank (``trace_diff``); a step that got slower on the GPU beyond the
threshold is a ``Finding`` (rule ``profile_regression``) that names what grew, for the owner
and for ``gpufleet opportunities --by regression``.

State: per workflow and rank, the figures of its last complete profile (a few kB), in a table
co-partitioned with the analyses (keyed by workflow). A partial analysis is neither compared
nor kept as the baseline. The finding is sent and flushed before the baseline moves on: a
worker that dies between the two compares the same pair again after a restart, and the
finding's id is the trace's, so the copy replaces the first downstream.
"""

from __future__ import annotations

import logging
import time

import faust

from schemas.codec import Codec
from schemas.topics import DEAD_LETTERS, FINDINGS, TRACE_ANALYSES
from streams.stage_io import by_partition, decoded, drop_unowned, send, topic_of
from streams.trace_diff import (
    RegressionConfig,
    diff_profiles,
    profile_figures,
    regression,
    regression_finding,
)

log = logging.getLogger(__name__)

STAGE = "profile-regressions"
# What of an analysis the baseline keeps (all the diff reads).
BASELINE_FIELDS = ("trace_id", "workflow_id", "rank", "partial", "gpu_events", "profiler_steps", "kernel_time_us",
                   "idle_time_us", "compute_time_us", "non_compute_time_us", "comp_comm_overlap_pct", "launches",
                   "launch_delay_mean_us", "kernel_types", "top_kernels", "analyzed_at")


def baseline_key(analysis: dict) -> str:
    return f"{analysis['workflow_id']}\x00{analysis['rank']}"


def compare(baselines, partition: int, analyses: list[dict], config: RegressionConfig,
            now: int) -> tuple[list[dict], set[str]]:
    """The regression findings of ``analyses`` against ``baselines`` (key -> baseline), which
    are updated; returns the findings and the keys changed."""
    findings, changed = [], set()
    for analysis in analyses:
        if analysis["partial"] or not analysis["gpu_events"]:
            continue
        key = baseline_key(analysis)
        base = baselines.get(key)
        if base is not None and (base["trace_id"] == analysis["trace_id"] or analysis["analyzed_at"] < base["analyzed_at"]):
            continue  # the same profile again (a replay), or one older than the baseline that came late
        if base is not None:
            diff = diff_profiles(profile_figures([base]), profile_figures([analysis]))
            found = regression(diff, config)
            if found is not None:
                findings.append(regression_finding(diff, found, analysis, base, now))
        baselines[key] = {**{f: analysis.get(f) for f in BASELINE_FIELDS}, "partition": partition}
        changed.add(key)
    return findings, changed


class RegressionStage:
    def __init__(self, app: faust.App, settings, codec: Codec) -> None:  # settings: streams.app.StreamSettings
        self.app, self.settings, self.codec = app, settings, codec
        self.analyses_topic = topic_of(app, settings, TRACE_ANALYSES, partitions=settings.analysis_partitions)
        self.findings_topic, self.dlq_topic = topic_of(app, settings, FINDINGS), topic_of(app, settings, DEAD_LETTERS)
        self.table = app.Table("profile-baselines", default=None, partitions=settings.analysis_partitions,
                               key_type=str)

    def register(self) -> None:
        self.app.on_partitions_assigned.connect(self.on_assigned)
        self.app.agent(self.analyses_topic, name=STAGE)(self.analyses)

    async def on_assigned(self, sender, assigned: set, **kwargs) -> None:
        name = self.analyses_topic.get_topic_name()
        drop_unowned(self.table.data, {tp.partition for tp in assigned if tp.topic == name}, {})

    async def analyses(self, stream: faust.StreamT) -> None:
        async for events in stream.take_events(100, within=self.settings.batch_within_s):
            now = int(time.time() * 1000)
            for partition, messages in by_partition(events).items():
                records = await decoded(self.codec, self.dlq_topic, STAGE, TRACE_ANALYSES, messages, now)
                findings, changed = compare(self.table.data, partition, records, self.settings.regressions, now)
                for finding in findings:
                    log.info("profile regression of %s rank %s: %s", finding["workflow_id"], finding["rank"],
                             finding["title"])
                    await send(self.codec, self.findings_topic, FINDINGS, finding)
                if findings:
                    await self.app.producer.flush()
                for key in changed:
                    self.table.send_changelog(partition, key, self.table.data[key])


def register(app: faust.App, settings, codec: Codec) -> None:  # settings: streams.app.StreamSettings
    """The regression stage's agent and table on ``app``."""
    RegressionStage(app, settings, codec).register()
