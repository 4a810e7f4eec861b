"""A profile's trace outlives a broker killed while it is delivered and an agent killed before
the broker returns: the trace waits in the agent's outbox and its whole analysis is made."""

from __future__ import annotations

import gzip
import shutil
import time
from pathlib import Path

import pytest

from gpufleet.analyze import analyze_file
from gpufleet.local import kafka as local_kafka
from kafka_client.admin import ensure_topics
from producers.profiling.agent import ProfileCoordinator
from producers.publish_kafka import Publisher
from producers.traces.outbox import TraceOutbox
from schemas.topics import KERNEL_EVENTS, PROFILE_STATUSES, trace_id_of
from streams.traces.sessions import TraceSessionConfig, TraceSessions
from tests.support.integration import CODEC, read_topic, wait_until
from tests.support.proc_tree import live_process

HOOK_TRACE = Path(__file__).resolve().parents[1] / "data" / "hook-trace-h200.json.gz"


@pytest.fixture
def process():
    with live_process() as proc:
        yield proc


def test_a_trace_outlives_a_killed_broker_and_a_killed_agent(tmp_path, process):
    broker_dir, handoff, outbox_dir = tmp_path / "kafka", tmp_path / "handoff", tmp_path / "spool" / "traces"
    handoff.mkdir(mode=0o700)
    broker = local_kafka.start(broker_dir)
    prefix = "traceout."
    try:
        ensure_topics(broker.bootstrap, prefix=prefix)
        first = Publisher(broker.bootstrap, CODEC)
        agent = ProfileCoordinator("h1", first, handoff, topic_prefix=prefix, outbox=TraceOutbox(outbox_dir),
                                   flush_s=3)
        (handoff / f"hook-{process.pid}.json").write_text(
            f'{{"pid": {process.pid}, "rank": 0, "workflow_id": "wf-t"}}')
        agent.handle({"request_id": "od-9", "workflow_id": "wf-t", "hosts": ["h1"], "ranks": [], "duration_ms": None,
                      "steps": 5, "reason": "ON_DEMAND", "requester": "ana", "requested_at": 0,
                      "deadline_ms": int(time.time() * 1000) + 600_000})
        assert first.flush(10) == 0
        with gzip.open(HOOK_TRACE) as src, open(handoff / f"trace-od-9-{process.pid}.json", "wb") as dst:
            shutil.copyfileobj(src, dst)  # the hook's trace, as it leaves it

        local_kafka.kill_node(broker_dir, 1)  # the broker dies as the agent sends the trace
        agent.check()
        assert len(agent.outbox.pending()) == 1, "kept: the broker has not taken it"
        first._producer.purge()  # the agent is killed: what its producer had queued is gone with it
        del agent, first

        broker = local_kafka.start(broker_dir)
        again = ProfileCoordinator("h1", Publisher(broker.bootstrap, CODEC), handoff, topic_prefix=prefix,
                                   outbox=TraceOutbox(outbox_dir), flush_s=30)
        again.check()  # the restarted agent sends what its outbox holds
        assert again.outbox.pending() == [] and list(outbox_dir.iterdir()) == []

        statuses = wait_until(lambda: [r for *_, n, r in read_topic(broker.bootstrap, prefix + PROFILE_STATUSES.name,
                                                                    PROFILE_STATUSES.partitions)
                                       if r["state"] == "TRACE_PUBLISHED"], 30, "TRACE_PUBLISHED")
        trace_id = trace_id_of("od-9", "h1", 0)
        assert [s["trace_id"] for s in statuses] == [trace_id]
        # The trace stage's sessions over what the topic holds: the whole trace, once.
        messages = [(n, r) for *_, n, r in read_topic(broker.bootstrap, prefix + KERNEL_EVENTS.name,
                                                       KERNEL_EVENTS.partitions)]
        assert sum(n == "TraceEnd" for n, _ in messages) == 1
        (analysis,) = TraceSessions(TraceSessionConfig(), {}).apply(0, messages, now_ms=1).analyses
        offline = analyze_file(HOOK_TRACE)
        assert not analysis["partial"] and analysis["trace_id"] == trace_id
        assert analysis["gpu_events"] == offline["gpu_events"] == 667
        assert analysis["kernel_time_us"] == offline["kernel_time_us"]
    finally:
        local_kafka.stop(broker_dir)
