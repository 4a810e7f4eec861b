"""Alibaba's public GenAI serving trace through the window stage's step (``tests.support.alibaba``):
every replica's alerts end with it, none is judged inside start-up, and one that resolves and fires
again within the hour stays one episode with one message. (How a serving replica should be judged
at all is a question of its own: the trace's replicas are idle between requests.)"""

from __future__ import annotations

from collections import Counter

import pytest

from schemas.topics import ALERTS, WORKFLOW_SUMMARIES, WORKFLOW_WINDOWS
from tests.support.alibaba import DATA, duty_cycles, replay, samples

pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"{DATA} is not here (it sits beside the checkout)")


@pytest.fixture(scope="module")
def replayed():
    series = duty_cycles(None)
    return series, replay(samples(series))


def test_every_replica_ends_and_no_alert_outlives_it(replayed):
    series, sent = replayed
    assert len(series) == 143
    summaries = {s["workflow_id"] for spec, s in sent if spec is WORKFLOW_SUMMARIES}
    assert len(summaries) == 143
    last = {}
    for spec, a in sent:
        if spec is ALERTS:
            last[a["alert_id"]] = a
    assert last and [a["alert_id"] for a in last.values() if a["status"] != "RESOLVED"] == []


def test_no_alert_is_judged_inside_the_start_up_the_waterfall_counts(replayed):
    _, sent = replayed
    starting = {(w["workflow_id"], w["window_start"]) for spec, w in sent
                if spec is WORKFLOW_WINDOWS and w["startup_gpu_seconds"] > 0}
    judged = {(a["workflow_id"], a["window_start"]) for spec, a in sent if spec is ALERTS and a["status"] == "FIRING"}
    assert starting and judged and starting & judged == set()


def test_an_idle_replica_gets_one_message_per_episode_not_one_per_burst(replayed):
    _, sent = replayed
    messages = Counter(a["workflow_id"] for spec, a in sent
                       if spec is ALERTS and a["detector"] == "idle_allocated" and a["status"] == "FIRING"
                       and a["notify"])
    assert messages and max(messages.values()) <= 2  # (one re-fires after an hour and more)
