"""``gpufleet enforce``: runs the actions the enforcement ladders let fall due, safely.

The worker decides when an action is due (``streams.enforcement.ladder``: an ACTION_DUE on
the enforcement topic); this process runs it: the ladder's command template from the same
policy file, filled with the workflow's ids, as an argument vector (never through a shell).

Safety, each tested (``tests/unit/sinks/test_enforce_jobs.py``, ``tests/integration/test_enforcement.py``):

- **Dry run by default.** It acts only when the ladder says ``act = true``, the record was
  decided so, *and* this process was started with ``--act``; otherwise it records WOULD_ACT
  with the command it would have run.
- **Never twice for one episode**, through restarts, replays and two enforcers: before it runs
  a command it writes an ACTING claim to the same partition and waits until the broker has it;
  it runs an action only once it has read its partition to the end, so any claim written
  before (by itself before a crash, or by the enforcer that held the partition before a
  rebalance) is seen first. Offsets are committed only up to the first action not yet settled.
- **Never silently failed.** A command that exits non-zero or times out is retried
  (``retries``), then recorded as ACTION_FAILED with its exit code and sent to the dead letters
  with the reason.
- **A resolved alert cancels** an action not yet run (CANCELLED from the worker).
- **An exemption an operator approved** on the owners' service (an ``OwnerAction`` on the
  owner-actions topic, read whole before each action) stops the action: it records EXEMPT with
  who approved it and why. Where that topic cannot be read, no action runs until it can.

Every outcome (ACTING, ACTED, WOULD_ACT, ACTION_FAILED) is an ``EnforcementEvent`` on the
enforcement topic, so ClickHouse and the owner see who did what, why, and under which ladder.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException, TopicPartition

from kafka_client.config import Connection
from kafka_client.consume_loop import ConsumeLoop
from kafka_client.metrics import ComponentMetrics
from kafka_client.whole_topic import WholeTopic
from schemas.codec import Codec, CodecError
from schemas.topics import ENFORCEMENT, OWNER_ACTIONS, key_of
from streams.enforcement.ladder import ACTION_DUE, CANCELLED, Ladder, render

log = logging.getLogger(__name__)

STAGE = "enforcer"
# The enforcer's metrics: the same as every component's (``kafka_client.metrics``), and its outcomes.
METRICS = ComponentMetrics("enforcer")
OUTCOMES = METRICS.counter("gpufleet_enforcement_outcomes", "What the enforcer recorded of the actions it took up, "
                           "by step (ACTING, ACTED, WOULD_ACT, ACTION_FAILED)", ["step"])
SETTLED = frozenset({"ACTING", "ACTED", "WOULD_ACT", "ACTION_FAILED", "EXEMPT"})  # an action someone took up


@dataclass
class Due:
    """An ACTION_DUE read and not yet settled, with where it was read."""

    record: dict
    partition: int
    offset: int


@dataclass
class EnforcerStats:
    acted: int = 0
    would_act: int = 0
    failed: int = 0
    cancelled: int = 0
    outcomes: list[dict] = field(default_factory=list)  # what this process recorded, in order


class Enforcer:
    def __init__(self, kafka: str | Connection, ladders: tuple[Ladder, ...], act: bool = False,
                 group_id: str = "gpufleet-enforcer", topic_prefix: str = "", retries: int = 2,
                 retry_backoff_s: float = 1.0, timeout_s: float = 60.0,
                 runner: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> None:
        self.ladders = {ladder.name: ladder for ladder in ladders}
        self.act = act
        self.retries, self.retry_backoff_s, self.timeout_s = retries, retry_backoff_s, timeout_s
        self.runner = runner
        self.codec = Codec()
        self.topic = topic_prefix + ENFORCEMENT.name
        self.loop = ConsumeLoop(kafka, group_id, [self.topic], METRICS, STAGE, topic_prefix, codec=self.codec)
        self.consumer, self.producer = self.loop.consumer, self.loop.producer
        self.exemptions = Exemptions(kafka, topic_prefix + OWNER_ACTIONS.name, self.codec)
        self.due: dict[str, Due] = {}  # alert id -> its action, not yet settled
        self.settled: set[str] = set()  # alert ids whose action was taken up (by anyone)
        self.stats = EnforcerStats()

    # -- the loop -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> EnforcerStats:
        try:
            self.loop.run(stop, self._step, on_assign=self._on_assign)
        finally:
            self.exemptions.close()
        return self.stats

    def _step(self, batch: list) -> None:
        """Read what came, run the due actions of partitions read to their end, and commit up
        to the first action not yet settled (``kafka_client.consume_loop``: once what this
        process recorded is durable)."""
        for m in batch:
            self._read(m)
        self._run_caught_up()
        self._commit(batch)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # What was read of partitions held before is read again from the committed offsets:
        # the actions still due there come again, with any claim written since.
        self.due.clear()

    def _read(self, m) -> None:
        try:
            name, record = self.codec.decode(m.value())
        except CodecError as exc:
            self.loop.dead_letter(str(exc), m)
            return
        if name != ENFORCEMENT.schema:
            self.loop.dead_letter(f"expected {ENFORCEMENT.schema}, got {name}", m)
            return
        alert, step = record["alert_id"], record["step"]
        if step == ACTION_DUE and alert not in self.settled:
            self.due.setdefault(alert, Due(record, m.partition(), m.offset()))
        elif step == CANCELLED and self.due.pop(alert, None) is not None:
            self.stats.cancelled += 1
            log.info("%s: the alert resolved before its action; nothing run", alert)
        elif step in SETTLED:
            self.settled.add(alert)
            self.due.pop(alert, None)

    def _run_caught_up(self) -> None:
        """The due actions of partitions read to their end (every claim before them seen)."""
        if not self.due:
            return
        if not self.exemptions.read():  # an approved exemption might be there: nothing runs blind
            return
        ends = {}
        for p in {d.partition for d in self.due.values()}:
            try:
                position = self.consumer.position([TopicPartition(self.topic, p)])[0].offset
                ends[p] = position >= self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
            except KafkaException as exc:  # not known now: next time
                log.debug("partition %d: position not known (%s)", p, exc)
        for alert, due in sorted(self.due.items(), key=lambda item: item[1].offset):
            if ends.get(due.partition):
                self._settle(due.record)
                self.settled.add(alert)
                del self.due[alert]

    def _commit(self, batch: list) -> None:
        """The positions after ``batch``, except past an action not yet settled."""
        if not batch:
            return
        after: dict[int, int] = {}
        for m in batch:
            after[m.partition()] = max(after.get(m.partition(), 0), m.offset() + 1)
        for due in self.due.values():
            if due.partition in after:
                after[due.partition] = min(after[due.partition], due.offset)
        self.loop.commit(positions={(self.topic, p): o for p, o in after.items()})

    # -- an action -------------------------------------------------------------------------

    def _settle(self, due: dict) -> None:
        approved = self.exemptions.approved(due["workflow_id"], int(time.time() * 1000))
        if approved is not None:
            self._record(due, "EXEMPT", [], None, 0, f"exempted by {approved['actor']} on the owners' service"
                         + (f": {approved['reason']}" if approved.get("reason") else "") + "; nothing run")
            return
        ladder = self.ladders.get(due["policy"])
        if ladder is None:
            self._failed(due, [], None, f"no ladder named {due['policy']!r} in this enforcer's policy file")
            return
        try:
            command = render(ladder.command, {k: due.get(k) for k in ("workflow_id", "scheduler_job_id", "owner",
                                                                      "team", "cluster")})
        except ValueError as exc:
            self._failed(due, [], None, str(exc))
            return
        if due["dry_run"] or not ladder.act or not self.act:
            why = ("the ladder is a dry run" if due["dry_run"] or not ladder.act
                   else "this enforcer was started without --act")
            self._record(due, "WOULD_ACT", command, None, 0, f"dry run ({why}): would have run {' '.join(command)}")
            self.stats.would_act += 1
            return
        self._record(due, "ACTING", command, None, 0, f"running {' '.join(command)}")
        self.loop.durable()  # the claim must be durable before anything runs (NotDurable: nothing runs)
        code, error = None, ""
        for attempt in range(1, self.retries + 2):
            code, error = self._run(command)
            if code == 0:
                self._record(due, "ACTED", command, 0, attempt,
                             f"ran {' '.join(command)}: {due['gpus']} GPU(s) released")
                self.stats.acted += 1
                return
            log.warning("%s: %s failed (attempt %d): %s", due["alert_id"], command[0], attempt, error)
            if attempt <= self.retries:
                time.sleep(self.retry_backoff_s * attempt)
        self._failed(due, command, code, f"{' '.join(command)} failed {self.retries + 1} times: {error}")

    def _run(self, command: list[str]) -> tuple[int | None, str]:
        try:
            done = self.runner(command, capture_output=True, text=True, timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return None, f"no answer within {self.timeout_s:g} s"
        except OSError as exc:  # not installed, not executable
            return None, str(exc)
        tail = (done.stderr or done.stdout or "").strip().splitlines()
        return done.returncode, f"exit {done.returncode}" + (f": {tail[-1][:300]}" if tail else "")

    def _failed(self, due: dict, command: list[str], code: int | None, reason: str) -> None:
        record = self._record(due, "ACTION_FAILED", command, code, self.retries + 1, reason)
        self.loop.dead_letter(reason, topic=self.topic, key=key_of(ENFORCEMENT, record),
                              value=self.codec.encode(ENFORCEMENT.schema, record))
        self.stats.failed += 1

    def _record(self, due: dict, step: str, command: list[str], code: int | None, attempt: int,
                reason: str) -> dict:
        record = {**due, "event_id": f"{due['alert_id']}:{step}", "step": step, "command": command,
                  "exit_code": code, "attempt": attempt, "reason": reason, "at": int(time.time() * 1000)}
        log.info("enforcement %s of %s (ladder %s): %s", step, due["workflow_id"], due["policy"], reason)
        self.loop.produce(self.topic, self.codec.encode(ENFORCEMENT.schema, record), key_of(ENFORCEMENT, record))
        self.stats.outcomes.append(record)
        OUTCOMES.labels(step).inc()
        return record


class Exemptions:
    """The exemptions operators decided on the owners' service: the owner-actions topic read
    whole (``kafka_client.whole_topic``: one small partition of people's actions)."""

    def __init__(self, kafka: str | Connection, topic: str, codec: Codec) -> None:
        self.codec = codec
        self._topic = WholeTopic(kafka, topic, "gpufleet-enforcer-exemptions", self._take)
        self._decided: dict[str, dict] = {}  # workflow -> its latest decision

    def read(self, timeout_s: float = 10.0) -> bool:
        """Read up to the topic's end now; False where it cannot be (then nothing may act)."""
        if self._topic.read_to_end(timeout_s):
            return True
        log.warning("the owners' actions were not read to their end: no action runs until they are")
        return False

    def _take(self, m) -> None:
        try:
            name, action = self.codec.decode(m.value())
        except CodecError:
            return  # the sink dead-letters what it cannot read; an unreadable record approves nothing
        if name == OWNER_ACTIONS.schema and action["kind"] in ("EXEMPTION_APPROVED", "EXEMPTION_REFUSED"):
            self._decided[action["workflow_id"]] = action

    def approved(self, workflow_id: str, now_ms: int) -> dict | None:
        """The approval standing for ``workflow_id`` now (the latest decision, not expired), or None."""
        decision = self._decided.get(workflow_id)
        if decision is None or decision["kind"] != "EXEMPTION_APPROVED":
            return None
        return decision if decision["until"] is None or decision["until"] > now_ms else None

    def close(self) -> None:
        self._topic.close()
