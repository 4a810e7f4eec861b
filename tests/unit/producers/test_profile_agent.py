"""The agent's side of a profile request, through the profile directory, against live
processes (a stand-in that has announced the hook) and a recorded trace."""

import json
import time

import pytest

from producers.profiling.agent import ProfileCoordinator
from producers.traces.outbox import TraceOutbox
from schemas.topics import request_of_trace, trace_id_of
from tests.support.proc_tree import live_process
from tests.support.samples import sample
from tests.support.traces import kernel, runtime, write_trace


class Recorder:
    """Stands in for the Kafka publisher: keeps what would have been published."""

    def __init__(self):
        self.records = []
        self.failed = 0

    def publish(self, spec, records, topic=None, schema=None):
        records = list(records)
        self.records += [(topic, schema or spec.schema, r) for r in records]
        return len(records)

    def flush(self, timeout=None):
        return 0

    def statuses(self):
        return [(r["rank"], r["state"], r["reason"]) for _, name, r in self.records if name == "ProfileStatus"]


@pytest.fixture
def process():
    with live_process() as proc:
        yield proc


def request(**overrides):
    r = {"request_id": "od-1", "workflow_id": "wf-a", "hosts": ["h1"], "ranks": [], "duration_ms": None,
         "steps": 5, "reason": "ON_DEMAND", "requester": "ana", "requested_at": 0,
         "deadline_ms": int(time.time() * 1000) + 60_000}
    r.update(overrides)
    return r


def announce(directory, pid, rank=0, workflow="wf-a"):
    (directory / f"hook-{pid}.json").write_text(json.dumps({"pid": pid, "rank": rank, "workflow_id": workflow}))


def test_a_rank_with_the_hook_is_asked_and_its_trace_published(tmp_path, process):
    rec = Recorder()
    c = ProfileCoordinator("h1", rec, tmp_path)
    announce(tmp_path, process.pid, rank=3)
    announce(tmp_path, 2**22 + 4321, rank=4)  # an exited process: its announcement is ignored
    assert not c.started.is_set()
    c.handle(request())
    assert c.started.is_set()  # wakes the sampling loop to sample the capture at 10 Hz
    assert json.loads((tmp_path / f"request-{process.pid}.json").read_text())["steps"] == 5
    assert rec.statuses() == [(3, "ACCEPTED", None)]
    assert not ProfileCoordinator("h1", Recorder(), tmp_path).capturing()
    c.check()
    assert len(rec.statuses()) == 1 and c.capturing()  # nothing yet: the agent samples at 10 Hz meanwhile
    for util in (0.0, 20.0):  # two ticks of the agent during the capture
        c.observe([{"workflow_id": "wf-a", "gpu_uuid": "GPU-3", "rank": 3, "utilization_pct": util,
                    "interval_ms": 100, "power_watts": 80.0, "memory_used_bytes": 1, "memory_total_bytes": 4}],
                  {"interval_ms": 100, "cpu_pct": 97.0, "iowait_pct": 0.0, "workflows": []})
    write_trace(tmp_path / f"trace-od-1-{process.pid}.json", [  # as the hook leaves it
        runtime("cudaLaunchKernel", 0, 5, corr=1), kernel("sgemm", 10, 100, corr=1),
        runtime("cudaLaunchKernel", 6, 5, corr=2), kernel("relu", 120, 20, corr=2)])
    c.check()
    (_, _, published), = [r for r in rec.records if r[1] == "ProfileStatus" and r[2]["state"] == "TRACE_PUBLISHED"]
    assert published["trace_id"] == trace_id_of("od-1", "h1", 3)
    assert request_of_trace(published["trace_id"]) == ("od-1", "h1", 3)
    ends = [r for _, name, r in rec.records if name == "TraceEnd"]
    assert len(ends) == 1 and ends[0]["trace_id"] == published["trace_id"] and ends[0]["events"] > 0
    system = ends[0]["system"]  # what the agent saw meanwhile travels with the trace
    assert system["ticks"] == 2 and system["gpu_utilization_mean_pct"] == 10.0 and system["host_cpu_mean_pct"] == 97.0
    c.observe([], {"interval_ms": 100, "cpu_pct": 1.0, "iowait_pct": 0.0, "workflows": []})  # no capture: ignored
    assert not c.captures and not c.capturing()


def test_failures_end_with_a_reason(tmp_path, process):
    rec = Recorder()
    c = ProfileCoordinator("h1", rec, tmp_path)
    c.handle(request(workflow_id="wf-gone"))  # no hook for it here, and this host was named
    c.handle(request(hosts=["h2"]))  # not for us: silence
    c.handle(request(hosts=[], workflow_id="wf-gone"))  # for every host: only hosts that run it answer
    (failed,) = rec.statuses()
    assert failed[1] == "FAILED" and "no process with gpufleet's profiling hook on h1" in failed[2]

    announce(tmp_path, process.pid)
    c.handle(request(request_id="od-2"))
    (tmp_path / f"error-od-2-{process.pid}.txt").write_text("torch.profiler could not start: RuntimeError()")
    c.check()
    assert rec.statuses()[-1] == (0, "FAILED", ("the profiling hook failed: torch.profiler could not start: "
                                                "RuntimeError()"))

    c.handle(request(request_id="od-3", deadline_ms=int(time.time() * 1000) + 300))
    time.sleep(0.4)
    c.check()
    assert rec.statuses()[-1][1:] == ("FAILED", ("no trace before the deadline: the process made no optimizer "
                                               "step, or is stuck"))
    assert not (tmp_path / f"request-{process.pid}.json").exists()  # withdrawn

    c.handle(request(request_id="od-4"))
    process.kill()
    process.wait()
    c.check()
    assert rec.statuses()[-1] == (0, "FAILED", f"process {process.pid} exited before its trace was written")
    c.handle(request(request_id="od-5", deadline_ms=0))  # stale: ignored
    assert len(rec.statuses()) == 7  # 1 + (ACCEPTED, FAILED) x 3: nothing for the stale one


class Message:
    def __init__(self, value, offset=7):
        self._value, self._offset = value, offset

    def topic(self):
        return "gpufleet.profile-requests.v1"

    def partition(self):
        return 0

    def offset(self):
        return self._offset

    def key(self):
        return b"wf-a"

    def value(self):
        return self._value


def test_a_request_the_agent_cannot_use_is_a_dead_letter_and_the_next_one_is_served(tmp_path, process):
    from producers.profiling.agent import ProfileListener
    from schemas.codec import Codec

    rec = Recorder()
    coordinator = ProfileCoordinator("h1", rec, tmp_path)
    listener = ProfileListener("127.0.0.1:1", coordinator)  # no broker needed: messages are handed in
    try:
        codec = Codec()
        listener._handle(Message(b"\x9cnot avro"))
        listener._handle(Message(codec.encode("GpuSample", sample())))
        announce(tmp_path, process.pid)
        listener._handle(Message(codec.encode("ProfileRequest", request())))
    finally:
        listener.consumer.close()
    letters = [r for _, name, r in rec.records if name == "DeadLetter"]
    assert [(d["stage"], d["source_offset"]) for d in letters] == [("profile-agent", 7)] * 2
    assert "not a gpufleet Avro message" in letters[0]["reason"]
    assert letters[1]["reason"] == "expected ProfileRequest, got GpuSample"
    assert rec.statuses() == [(0, "ACCEPTED", None)]  # the agent went on


class AwayBroker(Recorder):
    """A broker that is away: what is published stays queued (``flush`` says how much), and
    fails once librdkafka's delivery timeout passes (``expire``); then it comes back."""

    def __init__(self):
        super().__init__()
        self.away, self.queued = True, 0

    def publish(self, spec, records, topic=None, schema=None):
        records = list(records)
        if self.away:
            self.queued += len(records)
            return len(records)
        return super().publish(spec, records, topic, schema)

    def flush(self, timeout=None):
        return self.queued

    def expire(self):
        self.failed, self.queued = self.failed + self.queued, 0


def captured_trace(tmp_path, process, c, request_id="od-1"):
    announce(tmp_path, process.pid, rank=0)
    c.handle(request(request_id=request_id))
    write_trace(tmp_path / f"trace-{request_id}-{process.pid}.json", [
        runtime("cudaLaunchKernel", 0, 5, corr=1), kernel("sgemm", 10, 100, corr=1)])


def test_a_trace_the_broker_did_not_take_stays_in_the_outbox_through_a_restart(tmp_path, process):
    handoff, outbox_dir = tmp_path / "handoff", tmp_path / "outbox"
    handoff.mkdir(mode=0o700)
    broker = AwayBroker()
    broker.away = False
    c = ProfileCoordinator("h1", broker, handoff, outbox=TraceOutbox(outbox_dir), flush_s=0)
    captured_trace(handoff, process, c)
    broker.away = True  # the broker goes away while the trace is captured
    c.check()
    assert not (handoff / f"trace-od-1-{process.pid}.json").exists()  # out of the hand-off ...
    assert len(c.outbox.pending()) == 1  # ... and kept until delivered
    assert [s for _, s, _ in broker.statuses()] == ["ACCEPTED"] and broker.queued > 0
    c.check()  # still queued: not sent again on top of itself
    queued = broker.queued
    assert queued == broker.flush() and not any(name == "TraceEnd" for _, name, _ in broker.records)
    broker.expire()  # the delivery timeout passed: those messages failed

    # The agent restarts (a new coordinator on the same outbox); the broker is back.
    broker.away = False
    again = ProfileCoordinator("h1", broker, handoff, outbox=TraceOutbox(outbox_dir), flush_s=0)
    again.check()
    assert [s for _, s, _ in broker.statuses()] == ["ACCEPTED", "TRACE_PUBLISHED"]
    ends = [r for _, name, r in broker.records if name == "TraceEnd"]
    assert len(ends) == 1 and ends[0]["events"] == 2 and ends[0]["trace_id"] == trace_id_of("od-1", "h1", 0)
    assert again.outbox.pending() == [] and list(outbox_dir.iterdir()) == []


def test_a_full_outbox_drops_its_oldest_trace_and_says_so(tmp_path, process):
    handoff = tmp_path / "handoff"
    handoff.mkdir(mode=0o700)
    broker = AwayBroker()
    outbox = TraceOutbox(tmp_path / "outbox", max_bytes=1)  # room for the newest trace only
    c = ProfileCoordinator("h1", broker, handoff, outbox=outbox, flush_s=0)
    captured_trace(handoff, process, c, "od-1")
    c.check()
    assert len(outbox.pending()) == 1
    broker.expire()
    broker.away = False  # back as the second trace comes: the first was dropped to make room
    captured_trace(handoff, process, c, "od-2")
    c.check()
    assert outbox.pending() == [] and outbox.dropped == 1
    states = [(r["request_id"], r["state"], r["reason"]) for _, name, r in broker.records if name == "ProfileStatus"]
    assert [(rid, state) for rid, state, _ in states] == [("od-2", "ACCEPTED"), ("od-1", "FAILED"),
                                                           ("od-2", "TRACE_PUBLISHED")]
    assert "trace outbox on h1 was full" in states[1][2]
    assert [r["trace_id"] for _, name, r in broker.records if name == "TraceEnd"] == [trace_id_of("od-2", "h1", 0)]
