"""``gpufleet profile WORKFLOW``: profile a running workflow now and print what was found.

Finds the hosts the workflow runs on (its latest lifecycle event per host is not ENDED),
publishes one ``ProfileRequest`` naming them, follows the ``ProfileStatus`` records of
each host and rank, and prints the analysis and findings of every trace that lands. A host
that never answers, a rank that fails, or a deadline that passes ends the command with the
reasons and the failed hosts; it never waits longer than ``--timeout``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, TopicPartition

from kafka_client.config import consumer_config
from producers.publish_kafka import Publisher
from schemas.codec import Codec
from schemas.topics import (
    FINDINGS,
    PROFILE_REQUESTS,
    PROFILE_STATUSES,
    TRACE_ANALYSES,
    WORKFLOW_EVENTS,
)

FINAL = ("ANALYSED", "FAILED")


@dataclass
class Outcome:
    request_id: str
    hosts: list[str]
    statuses: list[dict] = field(default_factory=list)
    analyses: list[dict] = field(default_factory=list)
    findings: list[dict] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # "host" or "host rank N" -> reason

    @property
    def ok(self) -> bool:
        return bool(self.analyses) and not self.failed


def _read_all(bootstrap: str, topic: str, partitions: int, codec: Codec, start: dict[int, int] | None = None,
              timeout: float = 10.0) -> list[tuple[str, dict]]:
    consumer = Consumer(consumer_config(bootstrap, f"gpufleet-profile-{uuid.uuid4().hex[:8]}"))
    try:
        tps, ends = [], {}
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            first = (start or {}).get(p, low)
            if high > first:
                tps.append(TopicPartition(topic, p, first))
                ends[p] = high
        if not tps:
            return []
        consumer.assign(tps)
        out, deadline = [], time.monotonic() + timeout
        while ends and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=1000, timeout=0.5):
                if m.error():
                    continue
                if m.offset() + 1 >= ends.get(m.partition(), 0):
                    ends.pop(m.partition(), None)
                try:
                    out.append(codec.decode(m.value()))
                except ValueError:
                    continue
        return out
    finally:
        consumer.close()


def hosts_of(bootstrap: str, workflow_id: str, prefix: str = "", codec: Codec | None = None) -> list[str]:
    """Hosts whose latest lifecycle event for the workflow is not ENDED."""
    codec = codec or Codec()
    latest: dict[str, tuple[int, str]] = {}
    for name, e in _read_all(bootstrap, prefix + WORKFLOW_EVENTS.name, WORKFLOW_EVENTS.partitions, codec):
        if name != "WorkflowEvent" or e["workflow_id"] != workflow_id:
            continue
        if e["host"] not in latest or e["event_time"] >= latest[e["host"]][0]:
            latest[e["host"]] = (e["event_time"], e["event"])
    return sorted(h for h, (_, event) in latest.items() if event != "ENDED")


def _ends(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer(consumer_config(bootstrap, "gpufleet-profile-offsets"))
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        consumer.close()


def profile(bootstrap: str, workflow_id: str, hosts: list[str], steps: int | None = None,
            duration_ms: int | None = None, timeout_s: float = 300.0, prefix: str = "",
            requester: str = "cli", reason: str = "ON_DEMAND",
            on_status: Callable[[dict], None] | None = None) -> Outcome:
    """Request a profile of ``workflow_id`` on ``hosts`` and follow it to the end."""
    codec = Codec()
    outcome = Outcome(f"od-{uuid.uuid4().hex[:12]}", hosts)
    starts = {spec.name: _ends(bootstrap, prefix + spec.name, spec.partitions)
              for spec in (PROFILE_STATUSES, TRACE_ANALYSES, FINDINGS)}
    deadline_ms = int((time.time() + timeout_s) * 1000)
    request = {"request_id": outcome.request_id, "workflow_id": workflow_id, "hosts": hosts, "ranks": [],
               "duration_ms": duration_ms, "steps": steps if duration_ms is None else None, "reason": reason,
               "requester": requester, "requested_at": int(time.time() * 1000),
               # Agents give up a little before the requester does, so their reasons arrive.
               "deadline_ms": deadline_ms - int(min(30.0, timeout_s / 4) * 1000)}
    publisher = Publisher(bootstrap, codec)
    publisher.publish(PROFILE_REQUESTS, [request], topic=prefix + PROFILE_REQUESTS.name)
    if publisher.flush(30):
        raise RuntimeError("the profile request could not be published")

    consumer = Consumer(consumer_config(bootstrap, f"gpufleet-profile-{outcome.request_id}"))
    topic = prefix + PROFILE_STATUSES.name
    consumer.assign([TopicPartition(topic, p, o) for p, o in starts[PROFILE_STATUSES.name].items()])
    ranks: dict[str, dict[int, str]] = {h: {} for h in hosts}  # host -> rank -> state
    host_failed: dict[str, str] = {}
    try:
        while time.time() * 1000 < deadline_ms:
            for m in consumer.consume(num_messages=100, timeout=0.5):
                if m.error():
                    continue
                name, status = codec.decode(m.value())
                if name != "ProfileStatus" or status["request_id"] != outcome.request_id:
                    continue
                outcome.statuses.append(status)
                if on_status:
                    on_status(status)
                host = status["host"] or "?"
                if status["rank"] is None and status["state"] == "FAILED":
                    host_failed[host] = status["reason"]
                elif status["rank"] is not None:
                    ranks.setdefault(host, {})[status["rank"]] = status["state"]
                    if status["state"] == "FAILED":
                        outcome.failed[f"{host} rank {status['rank']}"] = status["reason"]
            if all(h in host_failed or (ranks[h] and all(s in FINAL for s in ranks[h].values())) for h in hosts):
                break
    finally:
        consumer.close()
    _unfinished(outcome, hosts, ranks, host_failed)
    traces = {s["trace_id"] for s in outcome.statuses if s["state"] == "ANALYSED"}
    if traces:
        outcome.analyses = [r for n, r in _read_all(bootstrap, prefix + TRACE_ANALYSES.name,
                                                    TRACE_ANALYSES.partitions, codec, starts[TRACE_ANALYSES.name])
                            if n == "TraceAnalysis" and r["trace_id"] in traces]
        outcome.findings = [r for n, r in _read_all(bootstrap, prefix + FINDINGS.name, FINDINGS.partitions, codec,
                                                    starts[FINDINGS.name])
                            if n == "Finding" and r["trace_id"] in traces]
    return outcome


def _unfinished(outcome: Outcome, hosts: list[str], ranks: dict[str, dict[int, str]],
                host_failed: dict[str, str]) -> None:
    """What failed, at the end: the hosts that said so, those that never answered, and the ranks
    still running at the deadline."""
    outcome.failed.update(host_failed)
    for h in hosts:
        if h not in host_failed and not ranks.get(h):
            outcome.failed[h] = "the host never answered (is gpufleet agent running there?)"
        for rank, state in ranks.get(h, {}).items():
            if state not in FINAL:
                outcome.failed.setdefault(f"{h} rank {rank}", f"still {state.lower()} at the deadline")
