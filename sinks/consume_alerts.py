"""Consumes the alerts topic and messages owners and teams, at most once per alert transition;
and, where the routing asks for it, sends the owner of each workflow that ended its job report
(``sinks.job_report``: where the GPU-hours went, energy, what to try), once per summary.

An alert goes out when the worker marked it ``notify`` (its rate limit allows it); a
RESOLVED goes to the webhook of an alert whose FIRING was sent (here, or, as the worker marks the
RESOLVED of an episode it told, by the notifier that read its partition before a rebalance). A
service's idle replicas are told together (``sinks.serving_digest``): their alerts are held a
while, uncommitted, then go out as one message. What was sent is recorded in
a small local log before the offsets are committed, so a restarted notifier (or a replay)
sends nothing twice. A message a channel refuses for good becomes a dead letter with the
reason; the notifier goes on. An alert episode its owner acknowledged on the owners' service
gets no more messages, one they snoozed none until the snooze ends (the owner-actions topic,
read whole by every notifier of the group, read to its end before the first message is told;
enforcement warnings still go out: they say what will be done to the job).
"""

from __future__ import annotations

import hashlib
import html
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from clickhouse_connect.driver.exceptions import ClickHouseError

from kafka_client.config import Connection
from kafka_client.consume_loop import ConsumeLoop
from kafka_client.metrics import ComponentMetrics
from kafka_client.whole_topic import WholeTopic
from schemas.codec import Codec, CodecError
from schemas.topics import ALERTS, ENFORCEMENT, OWNER_ACTIONS, WORKFLOW_SUMMARIES
from sinks.job_report import Rates, job_report
from sinks.notify_owner import (
    NotifyError,
    deliver_email,
    is_root_cause,
    post_webhook,
    send_email,
    send_webhook,
)
from sinks.route_alerts import Routing
from sinks.sent_log import SentLog
from sinks.serving_digest import ServingDigests, digest_message

log = logging.getLogger(__name__)

STAGE = "notifier"


METRICS = ComponentMetrics("notifier")
NOTIFICATIONS = METRICS.counter("gpufleet_notifications", "Messages to owners and teams, by channel and outcome "
                                "(sent, or failed: refused for good, dead-lettered)", ["channel", "outcome"])


class AlertNotifier:
    def __init__(self, kafka: str | Connection, routing: Routing, sent_log: Path, group_id: str = "gpufleet-notifier",
                 topic_prefix: str = "", webhook_backoff_s: float = 0.5, rates: Rates | None = None,
                 replicas: Callable[[list[dict]], int | None] | None = None) -> None:
        self.routing = routing
        # how many replicas a digest's service held in its alerts' time (``serving_digest.replicas_held``
        # on a read-only ClickHouse), None where it cannot be read now
        self.replicas = replicas
        self.rates = rates or Rates()  # prices and grid intensities for the job reports
        self.sent = SentLog(sent_log)
        self.codec = Codec()
        self.topic = topic_prefix + ALERTS.name
        self.summaries_topic = topic_prefix + WORKFLOW_SUMMARIES.name
        self.enforcement_topic = topic_prefix + ENFORCEMENT.name
        self.loop = ConsumeLoop(kafka, group_id, [self.topic, self.summaries_topic, self.enforcement_topic],
                                METRICS, STAGE, topic_prefix)
        # The owners' acknowledgements and snoozes: every notifier of the group reads them all (a
        # group would give the topic's one partition to one member, whose alerts alone would be muted).
        self.actions = WholeTopic(kafka, topic_prefix + OWNER_ACTIONS.name, f"{group_id}-owner-actions",
                                  self._owner_action)
        # Episodes their owners acknowledged (no more messages) or snoozed (none until then), kept
        # with what was sent, so that a restarted notifier still honours them.
        self.snoozed = {k.split(":", 2)[2]: int(k.split(":", 2)[1]) for k in self.sent.starting("snooze:")}
        self._actions_tried = False  # the owners' actions read to their end once (or tried)
        self.webhook_backoff_s = webhook_backoff_s
        self.digests = ServingDigests(routing.serving_digest_s)  # a service's idle replicas, told together
        self._next: dict[tuple[str, int], int] = {}  # each partition read -> its next offset
        self._touched: set[tuple[str, int]] = set()  # partitions to commit (read, or a digest of theirs told)
        self._assigned: set[tuple[str, int]] = set()  # the partitions this notifier reads now (its group's share)
        self._stopping = threading.Event()  # (``run``'s stop: partitions revoked at a stop are let go)
        self.handled = 0  # messages read and dealt with (sent, skipped or dead-lettered)
        self.messages = 0  # messages sent
        self.failures = 0

    def run(self, stop: threading.Event) -> None:
        self._stopping = stop
        try:
            self.loop.run(stop, self._step, on_assign=self._on_assign, on_revoke=self._on_revoke,
                          on_lost=self._on_lost)
        finally:
            self.actions.close()
            self.sent.close()

    def _on_assign(self, consumer, partitions: list) -> None:
        self._assigned.update((p.topic, p.partition) for p in partitions)

    def _on_revoke(self, consumer, partitions: list) -> None:
        """Partitions taken away in a rebalance (another notifier of the group may read them next,
        from their committed offsets, with a sent log of its own): the idle replicas held from them
        are told now, sooner than their wait, and each partition is committed up to what was
        handled here, so that its next reader starts after all that was told. At a stop they are
        let go instead (``_on_lost``): the next reader holds them again for their whole wait."""
        gone = {(p.topic, p.partition) for p in partitions}
        if self._stopping.is_set():
            self._on_lost(consumer, partitions)
            return
        self._assigned -= gone
        try:
            for digest in self.digests.release(gone):
                self._tell_digest(digest)
            if positions := {k: self._next[k] for k in gone if k in self._next}:
                self.loop.commit(positions=positions)
        except Exception:  # (raised out of the rebalance, it would stop the notifier)
            log.exception("what was held from the partitions taken away could not be told: their next reader will")
        self._let_go(gone)

    def _on_lost(self, consumer, partitions: list) -> None:
        """Partitions lost (their offsets can no longer be committed from here): what was held
        from them is let go, and their next reader, reading from before it, holds it and tells it."""
        gone = {(p.topic, p.partition) for p in partitions}
        self._assigned -= gone
        if dropped := sum(map(len, self.digests.release(gone))):
            log.info("%d idle replica alert(s) held for a digest are left to the partitions' next reader", dropped)
        self._let_go(gone)

    def _let_go(self, gone: set[tuple[str, int]]) -> None:
        """Nothing of ``gone`` is committed from here any more."""
        self._touched -= gone
        for key in gone:
            self._next.pop(key, None)

    def _step(self, batch: list) -> None:
        """Each message sent (or skipped, or dead-lettered); then the offsets, once the dead
        letters are durable (``kafka_client.consume_loop``)."""
        self._read_owner_actions()
        for m in batch:
            if (m.topic(), m.partition()) not in self._assigned:
                continue  # (read before its partition was taken away: its new reader reads it again)
            try:
                self._handle(m)
                self.handled += 1
            except Exception as exc:  # one message must never stop the notifier (nor its restart)
                log.exception("%s[%d]@%d could not be handled", m.topic(), m.partition(), m.offset())
                self.failures += 1
                what = "job report" if m.topic() == self.summaries_topic else "alert"
                self._dead_letter(m, f"the notifier could not handle this {what}: {type(exc).__name__}")
            self._next[(m.topic(), m.partition())] = m.offset() + 1
            self._touched.add((m.topic(), m.partition()))
        for digest in self.digests.due():
            self._tell_digest(digest)
            self._touched.update((m.topic(), m.partition()) for _, m in digest)  # (committed past it now)
        if self._touched:  # (never past an alert held for its service's digest: read again after a restart)
            self.loop.commit(positions=self.digests.positions({k: self._next[k] for k in self._touched}))
            self._touched = set()

    def _handle(self, m) -> None:
        try:
            name, alert = self.codec.decode(m.value())
        except CodecError as exc:
            self._dead_letter(m, str(exc))
            return
        if m.topic() == self.summaries_topic:
            self._job_report(m, name, alert)
            return
        if m.topic() == self.enforcement_topic:
            self._enforcement(m, name, alert)
            return
        if name != ALERTS.schema:
            self._dead_letter(m, f"expected {ALERTS.schema}, got {name}")
            return
        firing_key = f"{alert['alert_id']}:FIRING"
        if self._muted(alert["alert_id"]):
            return  # its owner acknowledged or snoozed it: in ClickHouse, on the page, in no inbox
        if alert["status"] == "FIRING":
            if not alert["notify"]:
                return  # within the rate limit: on the topic and in ClickHouse, not in anyone's inbox
            if self.digests.takes(alert):
                if firing_key not in self.sent:  # (read again after a restart: told already)
                    self.digests.hold(alert, m)
                return  # told with its service's other idle replicas
            # The root cause comes as a second FIRING of the same alert: a message of its own.
            key = f"{alert['alert_id']}:ROOT_CAUSE" if is_root_cause(alert) else firing_key
            self._send(m, alert, key, email=True)
        elif self.digests.drop(alert["alert_id"]):
            return  # the replica served again before its service's digest went out: nothing to tell
        # A RESOLVED of an alert its owner heard about: told here, or by the notifier that read its
        # partition before (another machine, another sent log), as the worker marks it (``notify``).
        elif not (firing_key in self.sent or alert["notify"]):
            return
        elif self.digests.takes(alert):
            if f"{alert['alert_id']}:RESOLVED" not in self.sent:
                self.digests.hold(alert, m)  # told with its service's other replicas no longer idle
        else:
            self._send(m, alert, f"{alert['alert_id']}:RESOLVED", email=False)

    def _read_owner_actions(self) -> None:
        """What owners did since the last batch; at the first, everything they did before it."""
        if self._actions_tried:
            self.actions.poll()
            return
        self._actions_tried = True
        if not self.actions.read_to_end():
            log.warning("the owners' acknowledgements and snoozes are not all read yet: alerts they muted may "
                        "still be told until they are")

    def _owner_action(self, m) -> None:
        """An owner acknowledged an alert episode (no more messages for it) or snoozed it (none
        until then). A record that cannot be read mutes nothing (the sink dead-letters it)."""
        try:
            name, action = self.codec.decode(m.value())
        except CodecError:
            return
        if name != OWNER_ACTIONS.schema:
            return
        if action["kind"] == "ACKNOWLEDGE" and action["alert_id"]:
            key = f"ack:{action['alert_id']}"
        elif action["kind"] == "SNOOZE" and action["alert_id"] and action["until"]:
            until = max(action["until"], self.snoozed.get(action["alert_id"], 0))
            self.snoozed[action["alert_id"]] = until
            key = f"snooze:{until}:{action['alert_id']}"
        else:
            return
        if key not in self.sent:  # (read again from the topic's start at each start)
            self.sent.add(key)

    def _muted(self, alert_id: str) -> bool:
        return f"ack:{alert_id}" in self.sent or self.snoozed.get(alert_id, 0) > time.time() * 1000

    def _send(self, m, alert: dict, key: str, email: bool) -> None:
        if page := self.routing.page_for(alert["workflow_id"]):
            alert = {**alert, "page_url": page}
        sends = []
        if url := self.routing.webhook_for(alert):
            sends.append(("webhook", lambda: send_webhook(url, alert, backoff_s=self.webhook_backoff_s)))
        if email and (address := self.routing.email_for(alert)):
            sends.append(("email", lambda: send_email(self.routing.smtp, address, alert)))
        self._deliver(m, key, sends)

    def _tell_digest(self, held: list[tuple[dict, object]]) -> None:
        """One message for a service's idle replicas (``sinks.serving_digest``), to its owner's
        mail and its team's webhook, or for those no longer idle, to the webhook; each alert then
        counts as told. One its owner acknowledged or snoozed meanwhile is left out."""
        held = [(a, m) for a, m in held if not self._muted(a["alert_id"])]
        if not held:
            return
        alerts = [a for a, _ in held]
        first, m = held[0]
        title, body, payload = digest_message(alerts, self.routing.pages,
                                              self._replicas_held(alerts) if first["status"] == "FIRING" else None)
        sends = []
        if url := self.routing.webhook_for(first):
            sends.append(("webhook", lambda: post_webhook(url, {"text": body, **payload}, "the idle replicas' digest",
                                                          backoff_s=self.webhook_backoff_s)))
        status = first["status"]
        if status == "FIRING" and (address := self.routing.email_for(first)):
            sends.append(("email", lambda: deliver_email(self.routing.smtp, address, title, body)))
        ids = sorted(a["alert_id"] for a in alerts)
        self._deliver(m, "digest:" + hashlib.sha256("\n".join([status, *ids]).encode()).hexdigest()[:32], sends)
        for alert_id in ids:
            self.sent.add(f"{alert_id}:{status}")

    def _replicas_held(self, alerts: list[dict]) -> int | None:
        """How many replicas the service of ``alerts`` held in their time; None where that cannot
        be read now (the digest then says how many are idle, and goes out all the same)."""
        if self.replicas is None:
            return None
        try:
            return self.replicas(alerts)
        except (ClickHouseError, OSError, ValueError) as exc:
            log.warning("the replicas of %s could not be counted (%s: %s); its digest says how many are idle only",
                        alerts[0]["service"], type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            return None

    def _job_report(self, m, name: str, summary: dict) -> None:
        """The job report of a ``WorkflowSummary`` to its team's webhook and its owner's mail,
        where the routing asks for it; a workflow summarised again (it ran again after it
        ended) gets another, a replay of the same summary none."""
        if name != WORKFLOW_SUMMARIES.schema:
            self._dead_letter(m, f"expected {WORKFLOW_SUMMARIES.schema}, got {name}")
            return
        if not self.routing.job_report_for(summary):
            return
        body, page = job_report(summary, self.rates)
        link = self.routing.page_for(summary["workflow_id"])
        if link:
            body += f"\nThe job's page: {link}\n"
            page = page.replace("</body>", f"<p><a href=\"{html.escape(link)}\">The job's page</a></p></body>")
        title = f"[gpufleet job report] {summary['workflow_id']} ({summary['end_reason']})"
        sends = []
        if url := self.routing.webhook_for(summary):
            payload = {"text": body, "gpufleet_job_report": summary, "page_url": link}
            sends.append(("webhook", lambda: post_webhook(url, payload, "the job report",
                                                          backoff_s=self.webhook_backoff_s)))
        if address := self.routing.email_for(summary):
            sends.append(("email", lambda: deliver_email(self.routing.smtp, address, title, body, page)))
        self._deliver(m, f"report:{summary['workflow_id']}:{summary['last_window_end']}", sends)

    def _enforcement(self, m, name: str, step: dict) -> None:
        """A warning of the enforcement ladder, or what became of its action, to the owner's
        mail and the team's webhook; each step once (its event id)."""
        if name != ENFORCEMENT.schema:
            self._dead_letter(m, f"expected {ENFORCEMENT.schema}, got {name}")
            return
        told = enforcement_message(step)
        if told is None:  # a step the owner need not hear of (ACTION_DUE, the enforcer's claim)
            return
        title, body = told
        if link := self.routing.page_for(step["workflow_id"]):
            body += f"\n\nThe job's page: {link}"
        sends = []
        if url := self.routing.webhook_for(step):
            payload = {"text": f"{title}\n{body}", "gpufleet_enforcement": step}
            sends.append(("webhook", lambda: post_webhook(url, payload, "the enforcement step",
                                                          backoff_s=self.webhook_backoff_s)))
        if address := self.routing.email_for(step):
            sends.append(("email", lambda: deliver_email(self.routing.smtp, address, title, body)))
        self._deliver(m, f"enforcement:{step['event_id']}", sends)

    def _deliver(self, m, key: str, sends: list[tuple[str, Callable[[], None]]]) -> None:
        """Each ``(channel, send)`` not yet done for ``key``, recorded as done once it is; a
        channel that refuses for good makes a dead letter of ``m``."""
        for channel, send in sends:
            channel_key = f"{key}:{channel}"
            if channel_key in self.sent:
                continue
            try:
                send()
            except NotifyError as exc:
                self.failures += 1
                NOTIFICATIONS.labels(channel, "failed").inc()
                self._dead_letter(m, str(exc))
                continue
            self.sent.add(channel_key)
            self.messages += 1
            NOTIFICATIONS.labels(channel, "sent").inc()
        self.sent.add(key)

    def _dead_letter(self, m, reason: str) -> None:
        self.loop.dead_letter(reason, m)



def enforcement_message(step: dict) -> tuple[str, str] | None:
    """(title, plain text) of an enforcement step for the job's owner, or None."""
    wf, ladder, gpus = step["workflow_id"], step["policy"], step["gpus"]
    what = step["detector"].replace("_", " ")
    action_at = step.get("action_at")
    when = (datetime.fromtimestamp(action_at / 1000, tz=UTC).strftime("%H:%M UTC")
            if action_at is not None else "soon")
    left = (action_at - step["due_at"]) / 60_000 if action_at is not None else None
    dry = (
        " This ladder is a dry run: nothing will be done to the job, this is what would be." if step["dry_run"] else ""
    )
    kind = step["step"]
    if kind in ("FIRST_WARNING", "SECOND_WARNING"):
        which = "first" if kind == "FIRST_WARNING" else "second and last"
        return (f"[gpufleet {which} warning] {what}: {wf}",
                (f"{step['reason']}. Its {gpus} GPU(s) will be released at {when} (in {left:g} min) under the "
                f"ladder {ladder!r}, unless the GPUs get work before then or the job is stopped by its owner."
                f"{dry} Ask your operators if the job should be exempt."))
    if kind == "ACTED":
        return (f"[gpufleet] the GPUs of {wf} were released",
                (f"{what} held past the ladder {ladder!r}: gpufleet ran {' '.join(step['command'])}. "
                f"{step['reason']}."))
    if kind == "WOULD_ACT":
        return (f"[gpufleet dry run] the GPUs of {wf} would have been released",
                f"{what} held past the ladder {ladder!r}. {step['reason']}.")
    if kind == "ACTION_FAILED":
        return (f"[gpufleet] releasing the GPUs of {wf} failed", f"Under the ladder {ladder!r}: {step['reason']}.")
    if kind == "CANCELLED":
        return (f"[gpufleet] no action on {wf}", f"{step['reason']}: the warnings stand down.")
    return None
