"""Alerts and job reports reach a real local webhook server and a real local SMTP server, once each."""

from __future__ import annotations

import email
import email.policy
import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from aiosmtpd.controller import Controller
from confluent_kafka import Producer

from gpufleet.local.ports import free_port
from kafka_client.config import producer_config
from producers.publish_kafka import Publisher
from schemas.topics import ALERTS, DEAD_LETTERS, ENFORCEMENT, WORKFLOW_SUMMARIES
from sinks.consume_alerts import AlertNotifier
from sinks.route_alerts import load_routing
from tests.support.alerts import Mailbox, alert
from tests.support.alerts import job_summary as summary
from tests.support.integration import CODEC, committed_everything, read_topic, run_until, wait_until
from tests.support.samples import BASE_MS


class Webhooks(BaseHTTPRequestHandler):
    received: ClassVar[list] = []  # what the server accepted, across handler instances

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/broken":
            self.send_response(400)
        else:
            Webhooks.received.append((self.path, body))
            self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def mail_to_ana(smtp_port: int) -> str:
    """The routing file's lines that send ana's mail through the test's SMTP server."""
    return f"""[owners.ana]
email = "ana@example.com"
[smtp]
host = "127.0.0.1"
port = {smtp_port}
sender = "gpufleet@example.com"
"""


def run_notifier(notifier, until):
    run_until(notifier.run, until, 60, "the notifier to catch up")


@pytest.fixture
def channels():
    """A local webhook server and SMTP server: (base URL, SMTP port, mailbox)."""
    Webhooks.received = []
    http = ThreadingHTTPServer(("127.0.0.1", 0), Webhooks)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    mailbox = Mailbox()
    smtp_port = free_port()
    smtp = Controller(mailbox, hostname="127.0.0.1", port=smtp_port)
    smtp.start()
    try:
        yield f"http://127.0.0.1:{http.server_address[1]}", smtp_port, mailbox
    finally:
        smtp.stop()
        http.shutdown()


def notifications() -> dict[tuple[str, str], int]:
    """The notifier's ``gpufleet_notifications_total`` by (channel, outcome), as Prometheus reads it."""
    from sinks.consume_alerts import METRICS

    return {(s.labels["channel"], s.labels["outcome"]): int(s.value)
            for family in METRICS.registry.collect() if family.name == "gpufleet_notifications"
            for s in family.samples if s.name.endswith("_total")}


def test_alerts_reach_webhook_and_mail_once(kafka, prefix, tmp_path, channels):
    base, smtp_port, mailbox = channels
    (tmp_path / "routing.toml").write_text(f"""
[default]
pages = "https://gpufleet.example.org/"
[teams.nlp]
webhook = "{base}/nlp"
[teams.broken]
webhook = "{base}/broken"
{mail_to_ana(smtp_port)}""")
    routing = load_routing(tmp_path / "routing.toml")
    pub = Publisher(kafka.bootstrap, CODEC)
    root_cause = {**alert("a1", "FIRING", True, "nlp", "ana"), "profile_request_id": "auto-a1",
                  "root_cause": "GPU idle 99 % of the profiled time.", "findings": [
                      {"rule": "launch_bound", "severity": "WARNING", "title": "Launch-bound trains",
                       "evidence": "29 runs", "recommendation": "Use CUDA graphs.", "gpu_seconds_at_stake": 0.1,
                       "ranks": 1}]}
    pub.publish(ALERTS, [
        alert("a1", "FIRING", True, "nlp", "ana"),
        alert("a2", "FIRING", False, "nlp", "ana"),   # rate-limited: no message
        root_cause,                                    # its automatic profile was analysed: a message
        root_cause,                                    # the same again (a replay): nothing
        alert("a1", "RESOLVED", False, "nlp", "ana"),  # its FIRING was sent: tell the team
        alert("a2", "RESOLVED", False, "nlp", "ana"),  # its FIRING was not (nor marked told): nothing
        alert("a3", "FIRING", True, "broken", "bo"),   # the webhook refuses it: dead letter
    ], topic=prefix + ALERTS.name)
    assert pub.flush() == 0

    notifier = AlertNotifier(kafka.bootstrap, routing, tmp_path / "sent.log", group_id=f"{prefix}n1",
                             topic_prefix=prefix, webhook_backoff_s=0.05)
    before = notifications()
    run_notifier(notifier, lambda: len(Webhooks.received) >= 3 and len(mailbox.messages) >= 2
                 and notifier.failures >= 1)
    # What its /metrics tells the operators: 3 webhooks and 2 mails sent, 1 webhook refused.
    assert Counter(notifications()) - Counter(before) == Counter(
        {("webhook", "sent"): 3, ("email", "sent"): 2, ("webhook", "failed"): 1})
    assert [(path, body["gpufleet_alert"]["alert_id"], body["gpufleet_alert"]["status"],
             bool(body["gpufleet_alert"]["root_cause"])) for path, body in Webhooks.received] == [
        ("/nlp", "a1", "FIRING", False), ("/nlp", "a1", "FIRING", True), ("/nlp", "a1", "RESOLVED", False)]
    assert "What to try: Raise DataLoader num_workers." in Webhooks.received[0][1]["text"]
    # every message links to the job's page on the owners' service
    assert all(body["text"].endswith("The job's page: https://gpufleet.example.org/jobs/wf-1")
               for _, body in Webhooks.received)
    assert "Launch-bound trains [WARNING, 0.10 GPU-s at stake]: 29 runs" in Webhooks.received[1][1]["text"]
    (to, mail), (to2, mail2) = mailbox.messages
    assert to == to2 == ["ana@example.com"] and "[gpufleet critical] low utilization: wf-1" in mail
    assert "[gpufleet root cause] low utilization: wf-1" in mail2
    letters = [r for *_, n, r in read_topic(kafka.bootstrap, prefix + DEAD_LETTERS.name, 1) if n == "DeadLetter"]
    assert len(letters) == 1 and "HTTP 400" in letters[0]["reason"] and letters[0]["stage"] == "notifier"

    # A restarted notifier that reads everything again (a new group) sends nothing twice.
    again = AlertNotifier(kafka.bootstrap, routing, tmp_path / "sent.log", group_id=f"{prefix}n2",
                          topic_prefix=prefix, webhook_backoff_s=0.05)
    run_notifier(again, lambda: again.failures >= 1)  # it got as far as the refused one again
    assert len(Webhooks.received) == 3 and len(mailbox.messages) == 2 and again.messages == 0

def test_the_owner_of_an_ended_job_gets_its_report_once(kafka, prefix, tmp_path, channels):
    base, smtp_port, mailbox = channels
    (tmp_path / "routing.toml").write_text(f"""
[default]
email_owners = true
job_reports = true
pages = "https://gpufleet.example.org"
[teams.nlp]
webhook = "{base}/nlp"
[teams.quiet]
job_reports = false
[smtp]
host = "127.0.0.1"
port = {smtp_port}
sender = "gpufleet@example.com"
""")
    pub = Publisher(kafka.bootstrap, CODEC)
    pub.publish(WORKFLOW_SUMMARIES, [summary("wf-9", "quiet", "cy@example.com"),  # its team opted out
                                     summary("wf-7", "nlp", "ana@example.com"),
                                     summary("wf-7", "nlp", "ana@example.com")],  # a replay: nothing more
                topic=prefix + WORKFLOW_SUMMARIES.name)
    assert pub.flush() == 0
    routing = load_routing(tmp_path / "routing.toml")
    notifier = AlertNotifier(kafka.bootstrap, routing, tmp_path / "sent.log", group_id=f"{prefix}r1",
                             topic_prefix=prefix, webhook_backoff_s=0.05)
    run_notifier(notifier, lambda: len(Webhooks.received) >= 1 and len(mailbox.messages) >= 1)
    (path, body), = Webhooks.received
    assert path == "/nlp" and body["gpufleet_job_report"]["workflow_id"] == "wf-7"
    assert body["text"].startswith("gpufleet job report: wf-7") and "input-bound" in body["text"]
    assert "DataLoader workers" in body["text"] and "alerts raised while it ran: input_bound" in body["text"]
    (to, mail), = mailbox.messages
    assert to == ["ana@example.com"] and "[gpufleet job report] wf-7" in mail
    assert "text/plain" in mail and "text/html" in mail  # both forms
    assert "The job's page: https://gpufleet.example.org/jobs/wf-7" in body["text"]
    assert body["page_url"] == "https://gpufleet.example.org/jobs/wf-7"
    message = email.message_from_string(mail, policy=email.policy.default)
    html_part, = [p for p in message.walk() if p.get_content_type() == "text/html"]
    assert 'href="https://gpufleet.example.org/jobs/wf-7"' in html_part.get_content()
    # Read again from the start by a restarted notifier: nothing twice, the opted-out team still nothing.
    again = AlertNotifier(kafka.bootstrap, routing, tmp_path / "sent.log", group_id=f"{prefix}r2",
                          topic_prefix=prefix, webhook_backoff_s=0.05)
    run_notifier(again, lambda: again.handled >= 3)
    assert len(Webhooks.received) == 1 and len(mailbox.messages) == 1


def ladder_step(step: str, **fields) -> dict:
    return {"event_id": f"idle_allocated:wf-5:{BASE_MS}:{step}", "alert_id": f"idle_allocated:wf-5:{BASE_MS}",
            "step": step, "policy": "idle-gpus", "detector": "idle_allocated", "workflow_id": "wf-5",
            "owner": "ana@example.com", "team": "nlp", "cluster": None, "scheduler_job_id": "4242", "since": BASE_MS,
            "due_at": BASE_MS + 300_000, "action_at": BASE_MS + 900_000, "dry_run": False, "gpus": 2,
            "reason": "idle allocated has held", "command": [], "exit_code": None, "attempt": 0, "at": BASE_MS,
            **fields}


def test_the_owner_is_warned_before_the_ladder_acts_and_told_when_it_did(kafka, prefix, tmp_path, channels):
    base, smtp_port, mailbox = channels
    (tmp_path / "routing.toml").write_text(f"""
[default]
email_owners = true
pages = "https://gpufleet.example.org"
[teams.nlp]
webhook = "{base}/nlp"
[smtp]
host = "127.0.0.1"
port = {smtp_port}
sender = "gpufleet@example.com"
""")
    pub = Publisher(kafka.bootstrap, CODEC)
    pub.publish(ENFORCEMENT, [
        ladder_step("FIRST_WARNING"),
        ladder_step("SECOND_WARNING", due_at=BASE_MS + 600_000),
        ladder_step("SECOND_WARNING", due_at=BASE_MS + 600_000),  # a replay: nothing more
        ladder_step("ACTION_DUE", due_at=BASE_MS + 900_000),  # the enforcer's business, not the owner's
        ladder_step("ACTING", command=["scancel", "4242"]),
        ladder_step("ACTED", command=["scancel", "4242"], reason="ran scancel 4242: 2 GPU(s) released"),
    ], topic=prefix + ENFORCEMENT.name)
    assert pub.flush() == 0
    notifier = AlertNotifier(kafka.bootstrap, load_routing(tmp_path / "routing.toml"), tmp_path / "sent.log",
                             group_id=f"{prefix}e1", topic_prefix=prefix, webhook_backoff_s=0.05)
    run_notifier(notifier, lambda: notifier.handled >= 6)
    titles = [body["text"].splitlines()[0] for _, body in Webhooks.received]
    assert titles == ["[gpufleet first warning] idle allocated: wf-5",
                      "[gpufleet second and last warning] idle allocated: wf-5",
                      "[gpufleet] the GPUs of wf-5 were released"]
    first = Webhooks.received[0][1]["text"]
    assert "will be released at 00:15 UTC (in 10 min) under the ladder 'idle-gpus'" in first
    assert "in 5 min" in Webhooks.received[1][1]["text"] and "ran scancel 4242" in Webhooks.received[2][1]["text"]
    assert [to for to, _ in mailbox.messages] == [["ana@example.com"]] * 3
    assert all("The job's page: https://gpufleet.example.org/jobs/wf-5" in body["text"]
               for _, body in Webhooks.received)


def idle_replica(wf: str, status: str = "FIRING", service: str = "chat-llm", minutes: float = 30.0) -> dict:
    return {**alert(f"idle_replica:{wf}:{BASE_MS}", status, True, "llm", "ana"),  # (an episode to be told)
            "detector": "idle_replica", "severity": "WARNING", "workflow_id": wf, "service": service,
            "observed": minutes, "threshold": 30.0, "wasted_gpu_hours_so_far": minutes / 60,
            "message": f"The replica of {service} served no request for {minutes:.0f} min while it held 1 GPU(s).",
            "advice": "Scale the deployment down when traffic is low, or send it traffic."}


def test_a_services_idle_replicas_are_told_together_once(kafka, prefix, tmp_path, channels):
    """The idle replicas of one service reach its owner and team as one message, held from the
    first for the routing's serving_digest_s, with the service's page; one that served again
    before then is not told; another service's are a message of their own, and an alert of
    another kind goes out at once. A notifier stopped while it held them commits no offset past
    them: the next reads them again and tells them; their RESOLVEDs go out together as well; one
    that reads everything again tells nothing."""
    base, smtp_port, mailbox = channels
    routing_text = f"""
[default]
pages = "https://gpufleet.example.org"
serving_digest_s = {{wait}}
[teams.llm]
webhook = "{base}/llm"
{mail_to_ana(smtp_port)}"""
    (tmp_path / "hold.toml").write_text(routing_text.replace("{wait}", "3600"))
    (tmp_path / "tell.toml").write_text(routing_text.replace("{wait}", "1"))
    saturated = {**alert("saturated:svc-0", "FIRING", True, "llm", "ana"), "detector": "saturated",
                 "workflow_id": "svc-0", "service": "chat-llm"}
    pub = Publisher(kafka.bootstrap, CODEC)
    pub.publish(ALERTS, [idle_replica("svc-2", minutes=42), idle_replica("svc-3"), idle_replica("svc-5"),
                         saturated, idle_replica("svc-4", minutes=35), idle_replica("svc-5", "RESOLVED"),
                         idle_replica("sd-1", service="sd-xl")], topic=prefix + ALERTS.name)
    assert pub.flush() == 0

    holding = AlertNotifier(kafka.bootstrap, load_routing(tmp_path / "hold.toml"), tmp_path / "sent.log",
                            group_id=f"{prefix}d1", topic_prefix=prefix, webhook_backoff_s=0.05)
    run_notifier(holding, lambda: holding.handled >= 7)
    assert [body["gpufleet_alert"]["alert_id"] for _, body in Webhooks.received] == ["saturated:svc-0"]
    assert not committed_everything(kafka.bootstrap, f"{prefix}d1", ALERTS, prefix + ALERTS.name)

    def held(alerts: list[dict]) -> int:  # (ClickHouse's count: tests/integration/test_owner_pages.py)
        if alerts[0]["service"] == "sd-xl":
            raise ConnectionRefusedError("ClickHouse cannot be reached")
        return 8

    telling = AlertNotifier(kafka.bootstrap, load_routing(tmp_path / "tell.toml"), tmp_path / "sent.log",
                            group_id=f"{prefix}d1", topic_prefix=prefix, webhook_backoff_s=0.05, replicas=held)
    run_notifier(telling, lambda: len(Webhooks.received) >= 3 and committed_everything(
        kafka.bootstrap, f"{prefix}d1", ALERTS, prefix + ALERTS.name))
    told = {body["gpufleet_idle_replicas"]["service"]: body for _, body in Webhooks.received[1:]}
    assert set(told) == {"chat-llm", "sd-xl"} and len(Webhooks.received) == 3
    chat = told["chat-llm"]["text"]
    assert chat.startswith("[gpufleet warning] 3 of 8 replicas of chat-llm served no request\n")
    assert "3 of 8 replicas of chat-llm served no request for 30 min or more while holding GPUs:" in chat
    assert [a["workflow_id"] for a in told["chat-llm"]["gpufleet_idle_replicas"]["alerts"]] == \
        ["svc-2", "svc-4", "svc-3"]  # the longest idle first; svc-5 served again before the digest
    assert "- svc-2: no request for 42 min" in chat and "svc-5" not in chat
    assert chat.endswith("The service's page: https://gpufleet.example.org/services/chat-llm")
    assert told["sd-xl"]["text"].startswith("[gpufleet warning] idle replica: sd-1 of sd-xl\n")
    assert "\n1 replica of sd-xl served no request" in told["sd-xl"]["text"]  # (its count could not be read)
    subjects = sorted(email.message_from_string(m, policy=email.policy.default)["Subject"]
                      for _, m in mailbox.messages)
    assert subjects == ["[gpufleet critical] saturated: svc-0",
                        "[gpufleet warning] 3 of 8 replicas of chat-llm served no request",
                        "[gpufleet warning] idle replica: sd-1 of sd-xl"]

    # the replicas told that serve again: their RESOLVEDs together too, to the team's webhook
    pub.publish(ALERTS, [idle_replica("svc-2", "RESOLVED"), idle_replica("svc-3", "RESOLVED")],
                topic=prefix + ALERTS.name)
    assert pub.flush() == 0
    resolving = AlertNotifier(kafka.bootstrap, load_routing(tmp_path / "tell.toml"), tmp_path / "sent.log",
                              group_id=f"{prefix}d1", topic_prefix=prefix, webhook_backoff_s=0.05)
    run_notifier(resolving, lambda: len(Webhooks.received) >= 4)
    resolved = Webhooks.received[3][1]
    assert resolved["text"].startswith("[gpufleet resolved] 2 replicas of chat-llm no longer idle\n")
    assert [a["workflow_id"] for a in resolved["gpufleet_idle_replicas"]["alerts"]] == ["svc-2", "svc-3"]
    assert len(mailbox.messages) == 3  # (a RESOLVED goes to the webhook only)

    again = AlertNotifier(kafka.bootstrap, load_routing(tmp_path / "tell.toml"), tmp_path / "sent.log",
                          group_id=f"{prefix}d2", topic_prefix=prefix, webhook_backoff_s=0.05)
    run_notifier(again, lambda: again.handled >= 9)
    assert len(Webhooks.received) == 4 and len(mailbox.messages) == 3 and again.messages == 0


def test_a_notifier_whose_partitions_move_tells_what_it_held_from_them_and_nothing_is_told_twice(
        kafka, prefix, tmp_path, channels):
    """Two notifiers of one group on two machines (a sent log each). The first holds a service's
    idle replicas from every partition, and has sent at once an alert that came after each. The
    second joins: at the rebalance the first tells the replicas it held (earlier than their wait:
    it may not read their partitions any more) and commits their partitions past what it handled,
    so the new readers start after it: each replica is told once in all, and so is each alert
    sent after a held one (the new reader's sent log does not have it). Both then read on: idle
    replicas published after the rebalance are told by whichever reads their partition, and the
    RESOLVEDs of the alerts the first told reach the team through whichever reads them, once (the
    worker marks the RESOLVED of an episode whose FIRING was to be told: ``notify``)."""
    base = channels[0]
    topic = prefix + ALERTS.name
    for who in ("a", "b"):
        (tmp_path / f"{who}.toml").write_text(
            f'[default]\nserving_digest_s = 10\n[teams.llm]\nwebhook = "{base}/{who}"\n')
    producer = Producer(producer_config(kafka.bootstrap))
    partitions = sorted(producer.list_topics(topic, timeout=10).topics[topic].partitions)
    assert len(partitions) >= 2

    def publish(replica: str, status: str = "FIRING") -> None:
        for p in partitions:  # (a replica on each partition)
            producer.produce(topic, value=CODEC.encode(ALERTS.schema, idle_replica(f"{replica}-{p}", status)),
                             partition=p)
        assert producer.flush(10) == 0

    def saturated(p: int, status: str = "FIRING") -> dict:
        return {**alert(f"saturated:svc-{p}", status, True, "llm", "ana"), "detector": "saturated",
                "workflow_id": f"svc-{p}", "service": "chat-llm"}

    publish("svc")
    for p in partitions:  # then, on each, an alert of another kind: sent at once, after a held one
        producer.produce(topic, value=CODEC.encode(ALERTS.schema, saturated(p)), partition=p)
    assert producer.flush(10) == 0

    def notifier(who: str) -> AlertNotifier:
        return AlertNotifier(kafka.bootstrap, load_routing(tmp_path / f"{who}.toml"), tmp_path / f"{who}.log",
                             group_id=f"{prefix}g", topic_prefix=prefix, webhook_backoff_s=0.05)

    def told(key: str, status: str = "FIRING") -> Counter:
        return Counter((path, a["alert_id"]) for path, body in Webhooks.received if key in body
                       for a in (body[key]["alerts"] if key == "gpufleet_idle_replicas" else [body[key]])
                       if a["status"] == status)

    first, second, stop = notifier("a"), notifier("b"), threading.Event()
    threads = [threading.Thread(target=n.run, args=(stop,), daemon=True) for n in (first, second)]
    threads[0].start()
    try:
        wait_until(lambda: first.handled >= 2 * len(partitions), 30, "the first notifier to read every alert")
        assert len(first.digests.held) == 1 and not told("gpufleet_idle_replicas")
        assert sorted(told("gpufleet_alert")) == sorted(("/a", f"saturated:svc-{p}") for p in partitions)
        threads[1].start()
        alerts_read = {(topic, p) for p in partitions}
        wait_until(lambda: first._assigned & alerts_read and second._assigned & alerts_read
                   and not first.digests.held and (first._assigned | second._assigned) >= alerts_read, 60,
                   "the alerts' partitions shared between the two notifiers")
        publish("new")
        wait_until(lambda: sum(told("gpufleet_idle_replicas").values()) >= 2 * len(partitions)
                   and not first.digests.held and not second.digests.held, 60,
                   "every replica told, and nothing held by either notifier")
        publish("svc", "RESOLVED")
        for p in partitions:
            producer.produce(topic, value=CODEC.encode(ALERTS.schema, saturated(p, "RESOLVED")), partition=p)
        assert producer.flush(10) == 0
        wait_until(lambda: sum(told("gpufleet_alert", "RESOLVED").values()) >= len(partitions)
                   and sum(told("gpufleet_idle_replicas", "RESOLVED").values()) >= len(partitions)
                   and not first.digests.held and not second.digests.held, 60, "the RESOLVEDs told")
    finally:
        stop.set()
        for t in threads:
            if t.ident is not None:
                t.join(30)
    replicas = told("gpufleet_idle_replicas")
    assert sorted(a for _, a in replicas) == sorted(f"idle_replica:{r}-{p}:{BASE_MS}" for r in ("new", "svc")
                                                    for p in partitions)  # each once, in all
    assert {path for path, a in replicas if ":svc-" in a} == {"/a"}  # (told by the first at the rebalance)
    assert {path for path, a in replicas if ":new-" in a} == {"/a", "/b"}  # (each notifier its own share)
    assert sorted(a for _, a in told("gpufleet_alert")) == sorted(f"saturated:svc-{p}" for p in partitions)
    assert sorted(a for _, a in told("gpufleet_alert", "RESOLVED")) == \
        sorted(f"saturated:svc-{p}" for p in partitions)  # (each once, by whichever read it)
    assert sorted(a for _, a in told("gpufleet_idle_replicas", "RESOLVED")) == \
        sorted(f"idle_replica:svc-{p}:{BASE_MS}" for p in partitions)
