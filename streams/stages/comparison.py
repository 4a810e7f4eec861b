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
and the findings' ids are deterministic, so the copy replaces the first downstream. The
decisions are ``streams.stages.comparison_step``'s; this module reads, calls them and sends.
"""

from __future__ import annotations

import logging
import time

import faust

from schemas.codec import Codec
from schemas.topics import DEAD_LETTERS, FINDINGS, TRACE_ANALYSES
from streams.settings import StreamSettings
from streams.stages.comparison_step import compare, expired
from streams.stages.io import by_partition, topic_of
from streams.stages.state import StageState

log = logging.getLogger(__name__)

STAGE = "profile-comparison"


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
