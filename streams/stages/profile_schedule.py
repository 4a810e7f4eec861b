"""The periodic profiling scheduler: one instance for the fleet (its topic has one partition),
fed by the window stages' reports of what runs where; it asks for a profile of each running
workflow in turn, within the fleet-wide budget (``streams.profiling.schedule``)."""

from __future__ import annotations

import logging
import time
from collections.abc import MutableMapping

import faust

from schemas.codec import Codec
from schemas.topics import DEAD_LETTERS, PROFILE_REQUESTS, PROFILE_SCHEDULE
from streams.profiling.schedule import FleetSchedule
from streams.settings import StreamSettings
from streams.stages.io import by_partition
from streams.stages.state import StageState

log = logging.getLogger(__name__)

STAGE = "profile-scheduler"


class _KeyPrefixed(MutableMapping):
    """The entries of a table whose keys start with ``prefix``, without it."""

    def __init__(self, data, prefix: str) -> None:
        self.data, self.prefix = data, prefix

    def __getitem__(self, key):
        return self.data[self.prefix + key]

    def __setitem__(self, key, value):
        self.data[self.prefix + key] = value

    def __delitem__(self, key):
        del self.data[self.prefix + key]

    def __iter__(self):
        return (k[len(self.prefix):] for k in list(self.data.keys()) if k.startswith(self.prefix))

    def __len__(self):
        return sum(1 for _ in self)


def register(app: faust.App, settings: StreamSettings, codec: Codec) -> None:
    """The scheduler's agent and table on ``app``."""
    reports_topic = app.topic(settings.topic(PROFILE_SCHEDULE.name), partitions=PROFILE_SCHEDULE.partitions)
    requests_topic = app.topic(settings.topic(PROFILE_REQUESTS.name))
    dlq_topic = app.topic(settings.topic(DEAD_LETTERS.name))
    # "report:<partition>" -> what runs there; "wf:<workflow>" -> its schedule.
    table = app.Table("profile-schedule", default=None, partitions=PROFILE_SCHEDULE.partitions, key_type=str)
    state = StageState(app, STAGE, codec)
    state.table(table)
    schedule = FleetSchedule(settings.schedule, _KeyPrefixed(table.data, "report:"), _KeyPrefixed(table.data, "wf:"))

    @app.agent(reports_topic, name=STAGE)
    async def scheduler(stream: faust.StreamT) -> None:
        async for events in stream.take_events(100, within=settings.batch_within_s):
            now = int(time.time() * 1000)
            for partition, messages in by_partition(events).items():
                async with state.batch():
                    requests = []
                    for report in await state.decoded(dlq_topic, PROFILE_SCHEDULE, messages, now):
                        if settings.schedule.enabled:
                            requests += schedule.apply(report, now)
                    for request in requests:
                        log.info("periodic profile of %s (%s)", request["workflow_id"], request["request_id"])
                        await state.send(requests_topic, PROFILE_REQUESTS, request)
                    reports, changed, removed = schedule.take_changes()
                    for key in {*(f"report:{k}" for k in reports), *(f"wf:{wf}" for wf in changed | removed)}:
                        state.changed(table, key, partition)
