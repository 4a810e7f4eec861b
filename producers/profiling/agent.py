"""The agent's half of profiling: answers ``ProfileRequest`` records for workflows on its host.

For each request that concerns this host, the coordinator finds the workflow's ranks among
the processes that enabled the profiling hook (``producers/profiling/hook.py`` announces them
in the profile directory), asks each to capture, and publishes a ``ProfileStatus`` per rank
as it goes: ACCEPTED, TRACE_PUBLISHED (with the trace id, once the broker has every message of the trace
for the worker to analyse), or FAILED with the reason -- the workflow does not run here, no
rank has the hook, the process exited, the hook reported an error, no trace came before the
request's deadline, or the trace outbox was full. Nothing waits forever. A finished trace
waits in the outbox (``producers/traces/outbox.py``) until it is delivered: a broker that is
away, or an agent restarted, loses no trace.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer

from kafka_client.config import Connection, consumer_config
from kafka_client.leave_group import leave_and_close
from producers.profiling.context import ProfileContext
from producers.profiling.handoff import Handoff
from producers.publish_kafka import Publisher
from producers.traces.outbox import Pending, TraceOutbox
from producers.traces.publish import publish_trace
from schemas.codec import Codec
from schemas.dead_letter import dead_letter
from schemas.topics import DEAD_LETTERS, PROFILE_REQUESTS, PROFILE_STATUSES, trace_id_of

log = logging.getLogger(__name__)

STAGE = "profile-agent"


@dataclass
class _Capture:
    request: dict
    pid: int
    rank: int
    context: ProfileContext
    done: bool = False


@dataclass
class ProfileCoordinator:
    host: str
    publisher: Publisher
    directory: Path
    topic_prefix: str = ""
    clock: object = time.time
    captures: list[_Capture] = field(default_factory=list)
    # The sampling loop feeds captures' contexts (observe) while the listener thread reads them.
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # Set when a capture starts: the sampling loop wakes to sample it at the profile's rate.
    started: threading.Event = field(default_factory=threading.Event)
    # Where finished traces wait until delivered (default: beside the hand-off directory).
    outbox: TraceOutbox | None = None
    flush_s: float = 30.0  # how long one delivery attempt waits for the broker

    def __post_init__(self) -> None:
        self.handoff = Handoff(self.directory)  # refuses a directory others could have made or write
        if self.outbox is None:
            self.outbox = TraceOutbox(self.directory.parent / f"{self.directory.name}-outbox")
        # trace file -> (the publisher's failures when it was sent, its TraceEnd): sent, not yet known delivered
        self._in_flight: dict[Path, tuple[int, dict]] = {}

    def hooks(self) -> list[dict]:
        """The processes on this host that enabled the hook and are still alive."""
        return self.handoff.hooks()

    def handle(self, request: dict) -> None:
        """A request from the control topic."""
        if request["hosts"] and self.host not in request["hosts"]:
            return  # for other hosts
        if request["deadline_ms"] <= int(self.clock() * 1000):
            return  # stale: its requester has given up
        ranks = [h for h in self.hooks() if h.get("workflow_id") == request["workflow_id"]
                 and (not request["ranks"] or h["rank"] in request["ranks"])]
        if not ranks:
            if request["hosts"]:  # we were named: say why nothing will come
                self._status(request, "FAILED", reason=(
                    f"workflow {request['workflow_id']} has no process with gpufleet's profiling hook on "
                    f"{self.host}: it no longer runs here, or its training script does not call "
                    "producers.profiling.hook.enable()"))
            return
        for h in sorted(ranks, key=lambda h: h["rank"]):
            self.handoff.ask(h["pid"], {"request_id": request["request_id"], "steps": request.get("steps"),
                                        "duration_ms": request.get("duration_ms")})
            with self._lock:
                self.captures.append(_Capture(request, h["pid"], h["rank"],
                                              ProfileContext(request["workflow_id"], h["rank"])))
            self._status(request, "ACCEPTED", rank=h["rank"], pid=h["pid"])
        self.started.set()

    def capturing(self) -> bool:
        """Whether a capture is in progress on this host (the agent samples faster then)."""
        return any(not c.done for c in list(self.captures))

    def observe(self, samples: list[dict], host: dict) -> None:
        """One tick of the agent (its GPU samples and host sample): context for each capture."""
        with self._lock:
            for c in self.captures:
                if not c.done:
                    c.context.add(samples, host)

    def check(self) -> None:
        """Publish what has become of each capture in progress."""
        now_ms = int(self.clock() * 1000)
        for c in self.captures:
            trace = self.handoff.trace(c.request["request_id"], c.pid)
            error = self.handoff.error(c.request["request_id"], c.pid) if trace is None else None
            if trace is not None:
                with self._lock:
                    system = c.context.summary()
                meta = {"request": c.request, "rank": c.rank, "pid": c.pid,
                        "system": system if system["ticks"] else None,
                        "trace_id": trace_id_of(c.request["request_id"], self.host, c.rank)}
                for lost in self.outbox.put(trace, meta):
                    self._status(lost.meta["request"], "FAILED", rank=lost.meta["rank"], pid=lost.meta["pid"], reason=(
                        f"the agent's trace outbox on {self.host} was full (over {self.outbox.max_bytes} bytes of "
                        "traces the broker had not taken): the oldest was dropped"))
                c.done = True
            elif error is not None:
                self._status(c.request, "FAILED", rank=c.rank, pid=c.pid, reason=f"the profiling hook failed: {error}")
                c.done = True
            elif not _alive(c.pid):
                self._status(c.request, "FAILED", rank=c.rank, pid=c.pid,
                             reason=f"process {c.pid} exited before its trace was written")
                c.done = True
            elif now_ms > c.request["deadline_ms"]:
                self._status(c.request, "FAILED", rank=c.rank, pid=c.pid, reason=(
                    "no trace before the deadline: the process made no optimizer step, or is stuck"))
                self.handoff.withdraw(c.pid)
                c.done = True
        with self._lock:
            self.captures = [c for c in self.captures if not c.done]
        self.deliver()
        self.publisher.flush(10)

    def deliver(self) -> None:
        """Send the outbox's traces, oldest first; each leaves it (and its TRACE_PUBLISHED goes out)
        once the broker has all of its messages. Stops at the first the broker did not take."""
        pending = self.outbox.pending()
        for gone in set(self._in_flight) - {p.path for p in pending}:
            del self._in_flight[gone]  # dropped to keep the outbox within its bound
        for p in pending:
            sent = self._in_flight.get(p.path)
            if sent is not None:
                if self.publisher.flush(0):
                    return  # the last attempt is still on its way
                if self.publisher.failed == sent[0]:
                    self._delivered(p, sent[1])  # it got there after the attempt's wait
                    continue
            before = self.publisher.failed
            meta = p.meta
            end = publish_trace(p.path, meta["request"]["workflow_id"], self.publisher, self.topic_prefix,
                                meta["trace_id"], system=meta["system"])
            self._in_flight[p.path] = (before, end)
            if self.publisher.flush(self.flush_s) or self.publisher.failed != before:
                log.warning("trace %s: the broker has not taken all of it; it stays in the outbox (%s) and is sent "
                            "again", meta["trace_id"], self.outbox.directory)
                return
            self._delivered(p, end)

    def _delivered(self, p: Pending, end: dict) -> None:
        meta = p.meta
        if end.get("error") and not end["events"]:
            self._status(meta["request"], "FAILED", rank=meta["rank"], pid=meta["pid"],
                         reason=f"the trace could not be read: {end['error']}")
        else:
            self._status(meta["request"], "TRACE_PUBLISHED", rank=meta["rank"], pid=meta["pid"],
                         trace_id=meta["trace_id"])
        self.outbox.delivered(p)
        self._in_flight.pop(p.path, None)

    def _status(self, request: dict, state: str, rank: int | None = None, pid: int | None = None,
                reason: str | None = None, trace_id: str | None = None) -> None:
        record = {"request_id": request["request_id"], "workflow_id": request["workflow_id"], "host": self.host,
                  "rank": rank, "pid": pid, "state": state, "reason": reason, "trace_id": trace_id,
                  "at": int(self.clock() * 1000)}
        if state == "FAILED":
            log.warning("profile %s on %s rank %s failed: %s", request["request_id"], self.host, rank, reason)
        self.publisher.publish(PROFILE_STATUSES, [record], topic=self.topic_prefix + PROFILE_STATUSES.name)


def _alive(pid: int) -> bool:
    """Running, not a zombie: a crashed rank stays a zombie until its launcher reaps it."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: trust the signal check
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class ProfileListener:
    """Reads the control topic for the agent (a consumer group per host: every host sees every
    request) and drives the coordinator; runs in its own thread beside the sampling loop."""

    def __init__(self, kafka: str | Connection, coordinator: ProfileCoordinator, topic_prefix: str = "") -> None:
        self.coordinator = coordinator
        self.codec = Codec()
        # A new host reads the topic from the start but skips requests past their deadline, so
        # none is missed while it joins; commits as it reads (a request lost to a crash ends at
        # the requester's deadline, with this host named).
        self.consumer = Consumer(consumer_config(
            kafka, f"gpufleet-agent-profiles-{coordinator.host}", **{"enable.auto.commit": True}))
        self.assigned = threading.Event()
        self.topic_prefix = topic_prefix
        self.consumer.subscribe([topic_prefix + PROFILE_REQUESTS.name],
                                on_assign=lambda consumer, partitions: self.assigned.set())

    def run(self, stop) -> None:
        try:
            while not stop.is_set():
                for m in self.consumer.consume(num_messages=100, timeout=0.5):
                    if m.error():
                        continue
                    self._handle(m)
                self.coordinator.check()
        finally:
            leave_and_close(self.consumer)

    def _handle(self, m) -> None:
        """One message of the control topic; what cannot be used is a dead letter with the reason."""
        try:
            name, request = self.codec.decode(m.value())
            if name != PROFILE_REQUESTS.schema:
                raise ValueError(f"expected {PROFILE_REQUESTS.schema}, got {name}")
            self.coordinator.handle(request)
        except Exception as exc:  # noqa: BLE001 - one bad request must not stop this host's profiling
            reason = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            log.warning("profile request %s[%d]@%d refused: %s", m.topic(), m.partition(), m.offset(), reason)
            record = dead_letter(STAGE, reason, m.topic(), m.partition(), m.offset(), m.key(), m.value())
            self.coordinator.publisher.publish(DEAD_LETTERS, [record], topic=self.topic_prefix + DEAD_LETTERS.name)
