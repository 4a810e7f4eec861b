"""The profile comparison stage: each new ``TraceAnalysis``

* against the previous profile of its workflow's rank (``streams.profiling.diff``): a step that got slower
  on the GPU beyond the threshold is a ``profile_regression`` finding that names what grew,
  for the owner and for ``gpufleet opportunities --by regression``;
* against the other ranks of the same requested profile (``streams.traces.collectives``): the rank
  that arrives last at the collectives is a ``straggler_rank`` finding, with the GPU time the
  other ranks wait for it. It is sent again, under the same id, as more ranks arrive.

State, in a table co-partitioned with the analyses (keyed by workflow): per workflow and rank
the figures of its last complete profile (a few kB; "rank" keys), and per requested profile
its ranks' collectives until ``ranks_retention_s`` after the last arrived ("profile" keys).
A partial analysis is neither compared nor kept. Findings are sent and flushed before the
state moves on: a worker that dies between the two compares the same again after a restart,
and the findings' ids are deterministic, so the copy replaces the first downstream.
"""

from __future__ import annotations

import logging
import time

import faust

from schemas.codec import Codec
from schemas.topics import DEAD_LETTERS, FINDINGS, TRACE_ANALYSES, request_of_trace
from streams.profiling.diff import (
    ComparisonConfig,
    RegressionConfig,
    diff_profiles,
    profile_figures,
    regression,
    regression_finding,
)
from streams.settings import StreamSettings
from streams.stages.io import by_partition, topic_of
from streams.stages.state import StageState
from streams.traces.collectives import stragglers

log = logging.getLogger(__name__)

STAGE = "profile-comparison"
STRAGGLER_RULE = "straggler_rank"
# What of an analysis the baseline keeps (all the diff reads).
BASELINE_FIELDS = ("trace_id", "workflow_id", "rank", "partial", "gpu_events", "profiler_steps", "kernel_time_us",
                   "idle_time_us", "compute_time_us", "non_compute_time_us", "comp_comm_overlap_pct", "launches",
                   "launch_delay_mean_us", "kernel_types", "top_kernels", "analyzed_at")


def baseline_key(analysis: dict) -> str:
    return f"rank\x00{analysis['workflow_id']}\x00{analysis['rank']}"


def profile_key(workflow_id: str, request_id: str) -> str:
    return f"profile\x00{workflow_id}\x00{request_id}"


def compare(state, partition: int, analyses: list[dict], config: ComparisonConfig,
            now: int) -> tuple[list[dict], set[str]]:
    """The findings of ``analyses`` against ``state`` (the stage's table: key -> entry), which
    is updated; returns the findings and the keys changed."""
    findings, changed = [], set()
    for analysis in analyses:
        if analysis["partial"] or not analysis["gpu_events"]:
            continue
        findings += _against_previous(state, partition, analysis, config.regressions, now, changed)
        findings += _against_other_ranks(state, partition, analysis, now, changed)
    return findings, changed


def _against_previous(state, partition: int, analysis: dict, config: RegressionConfig, now: int,
                      changed: set[str]) -> list[dict]:
    key = baseline_key(analysis)
    base = state.get(key)
    if base is not None and (base["trace_id"] == analysis["trace_id"] or analysis["analyzed_at"] < base["analyzed_at"]):
        return []  # the same profile again (a replay), or one older than the baseline that came late
    found = []
    if base is not None:
        diff = diff_profiles(profile_figures([base]), profile_figures([analysis]))
        regressed = regression(diff, config)
        if regressed is not None:
            found.append(regression_finding(diff, regressed, analysis, base, now))
    state[key] = {**{f: analysis.get(f) for f in BASELINE_FIELDS}, "partition": partition}
    changed.add(key)
    return found


def _against_other_ranks(state, partition: int, analysis: dict, now: int, changed: set[str]) -> list[dict]:
    origin = request_of_trace(analysis["trace_id"])
    if origin is None or not analysis.get("collectives"):
        return []  # not a requested profile (its ranks cannot be told apart), or no collective
    request_id, _, rank = origin
    key = profile_key(analysis["workflow_id"], request_id)
    entry = state.get(key) or {"partition": partition, "workflow_id": analysis["workflow_id"],
                               "request_id": request_id, "ranks": {}, "trace_ids": {}}
    entry["ranks"][str(rank)] = analysis["collectives"]
    entry["trace_ids"][str(rank)] = analysis["trace_id"]
    entry["updated_ms"] = now
    state[key] = entry
    changed.add(key)
    if len(entry["ranks"]) < 2:
        return []
    result = stragglers({int(r): c for r, c in entry["ranks"].items()})
    s = result["straggler"]
    if s is None:
        return []
    return [{
        "finding_id": f"profile/{request_id}:{STRAGGLER_RULE}",
        "trace_id": entry["trace_ids"][str(s["rank"])],
        "workflow_id": analysis["workflow_id"],
        "rank": s["rank"],
        "rule": STRAGGLER_RULE,
        "severity": "WARNING",
        "title": f"Rank {s['rank']} arrives last at the collectives: the other ranks wait for it",
        "evidence": (f"of {result['collectives']} collectives matched across {len(entry['ranks'])} ranks of profile "
                     f"{request_id}, rank {s['rank']} came last to {100 * s['last_share']:.0f} %; the others waited "
                     f"{s['caused_us'] / 1e3:.3f} ms in all"),
        "gpu_seconds_at_stake": s["caused_us"] / 1e6,
        "recommendation": (f"Find what rank {s['rank']} does more or slower before each collective: its input "
                           "pipeline (data loading on its host), its host (CPU contention, a throttled or unhealthy "
                           "GPU: see its samples) or an uneven share of the work (unbalanced batches or layers)."),
        "detected_at": now,
    }]


def expired(state, now: int, config: ComparisonConfig) -> dict[str, int]:
    """Requested profiles whose ranks stopped arriving ``ranks_retention_s`` ago: key -> partition."""
    limit = now - config.ranks_retention_s * 1000
    return {k: v["partition"] for k, v in list(state.items())
            if k.startswith("profile\x00") and v is not None and v["updated_ms"] < limit}


class ProfileComparisonStage:
    def __init__(self, app: faust.App, settings: StreamSettings, codec: Codec) -> None:
        self.app, self.settings, self.codec = app, settings, codec
        self.analyses_topic = topic_of(app, settings, TRACE_ANALYSES, partitions=settings.analysis_partitions)
        self.findings_topic, self.dlq_topic = topic_of(app, settings, FINDINGS), topic_of(app, settings, DEAD_LETTERS)
        self.table = app.Table("profile-comparison", default=None, partitions=settings.analysis_partitions,
                               key_type=str)
        self.state = StageState(app, STAGE, codec)
        self.state.table(self.table)

    def register(self) -> None:
        self.app.agent(self.analyses_topic, name=STAGE)(self.analyses)
        self.app.timer(interval=60.0)(self.expire)

    async def analyses(self, stream: faust.StreamT) -> None:
        async for events in stream.take_events(100, within=self.settings.batch_within_s):
            now = int(time.time() * 1000)
            for partition, messages in by_partition(events).items():
                async with self.state.batch():
                    records = await self.state.decoded(self.dlq_topic, TRACE_ANALYSES, messages, now)
                    findings, changed = compare(self.table.data, partition, records, self.settings.comparison, now)
                    for finding in findings:
                        log.info("%s of %s rank %s: %s", finding["rule"], finding["workflow_id"], finding["rank"],
                                 finding["title"])
                        await self.state.send(self.findings_topic, FINDINGS, finding)
                    for key in changed:
                        self.state.changed(self.table, key, partition)

    async def expire(self) -> None:
        if self.app.rebalancing:  # the table is being restored
            return
        async with self.state.batch():
            for key, partition in expired(self.table.data, int(time.time() * 1000), self.settings.comparison).items():
                del self.table.data[key]
                self.state.changed(self.table, key, partition)


def register(app: faust.App, settings: StreamSettings, codec: Codec) -> None:
    """The profile comparison stage's agent, timer and table on ``app``."""
    ProfileComparisonStage(app, settings, codec).register()
