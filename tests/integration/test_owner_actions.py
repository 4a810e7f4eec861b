"""What an owner does about their job on the owners' service, each end to end through the real
broker and the sink: profile now (a profile request to the job's hosts, limited), acknowledge and
snooze an alert (the notifier sends nothing more for it), ask for an exemption (an operator
approves it; the enforcer then runs no action on the job, and still acts on another)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest
from aiosmtpd.controller import Controller

from gpufleet.asgi_server import AsgiServer
from gpufleet.commands.serve import actions_on
from gpufleet.local.ports import free_port
from gpufleet.web.access import Directory
from gpufleet.web.app import Service, create_app
from gpufleet.web.identity import ProxyTrust
from producers.publish_kafka import Publisher
from schemas.topics import ALERTS, ENFORCEMENT, PROFILE_REQUESTS, WORKFLOW_EVENTS
from sinks.consume_alerts import AlertNotifier
from sinks.enforce_jobs import Enforcer
from sinks.route_alerts import load_routing
from sinks.write_clickhouse import ClickHouseWriter
from streams.enforcement.ladder import load_ladders
from tests.support.alerts import Mailbox, alert
from tests.support.consumer_groups import group_members
from tests.support.fleet_data import build, started, store
from tests.support.integration import (
    CODEC,
    committed_everything,
    read_topic,
    run_until,
    running_sink,
    wait_until,
)


@pytest.fixture
def site(kafka, prefix, chdb_client):
    """A simulated fleet in ClickHouse, the sink on ``prefix``'s topics, and the owners' service
    taking actions through the broker; (data, database, service server, publisher)."""
    database = f"t_{uuid.uuid4().hex[:12]}"
    data = build()
    store(ClickHouseWriter(chdb_client, database), data)
    publisher = Publisher(kafka.bootstrap, CODEC)
    job = data.fleet.workflows[0]
    publisher.publish(WORKFLOW_EVENTS, [started(job)], topic=prefix + WORKFLOW_EVENTS.name)  # as its agent says
    assert publisher.flush() == 0
    service = Service(chdb_client, database, Directory(operators=frozenset({"the-operator"})),
                      ProxyTrust.parse(["127.0.0.1"]), actions=actions_on(kafka.bootstrap, prefix))
    server = AsgiServer(create_app(service), name="owners").start()
    try:
        with running_sink(kafka.bootstrap, prefix, chdb_client, database):
            yield data, database, server, publisher
    finally:
        server.stop()
        chdb_client.command(f"DROP DATABASE IF EXISTS {database}")


def act(server, user: str, body: dict, header: bool = True) -> tuple[int, dict]:
    headers = {"X-Forwarded-User": user, "Content-Type": "application/json",
               **({"X-Gpufleet-Action": "1"} if header else {})}
    request = urllib.request.Request(server.url + "/api/actions", data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def job_of(server, user: str, workflow_id: str) -> dict:
    request = urllib.request.Request(f"{server.url}/api/jobs/{workflow_id}", headers={"X-Forwarded-User": user})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


def stored(chdb_client, database: str, what: str) -> int:
    return chdb_client.query(f"SELECT count() FROM {database}.{what}").result_rows[0][0]


def test_profile_now_asks_the_jobs_hosts_once_within_its_limit(kafka, prefix, chdb_client, site):
    data, database, server, _ = site
    job, other = data.fleet.workflows[0], data.fleet.workflows[1]
    assert act(server, job.owner, {"workflow_id": job.workflow_id, "kind": "PROFILE_NOW"}, header=False)[0] == 403
    assert act(server, other.owner, {"workflow_id": job.workflow_id, "kind": "PROFILE_NOW"})[0] == 404  # not theirs
    status, action = act(server, job.owner, {"workflow_id": job.workflow_id, "kind": "PROFILE_NOW"})
    assert status == 202 and action["actor"] == job.owner and action["role"] == "owner"
    status, again = act(server, job.owner, {"workflow_id": job.workflow_id, "kind": "PROFILE_NOW"})
    assert status == 400 and "profiled" in again["error"]

    (request,) = [r for *_, n, r in read_topic(kafka.bootstrap, prefix + PROFILE_REQUESTS.name, 1)
                  if n == "ProfileRequest"]
    assert request["request_id"] == action["request_id"] and request["hosts"] == [job.gpus[0].host]
    assert request["requester"] == f"{job.owner} (owners' service)" and request["workflow_id"] == job.workflow_id
    # recorded in ClickHouse and shown with the job: who asked, when, and the request
    wait_until(lambda: stored(chdb_client, database, "owner_actions") == 1 and
               stored(chdb_client, database, "profile_requests") == 1, 60, "the action in ClickHouse")
    shown = job_of(server, job.owner, job.workflow_id)
    assert [(a["kind"], a["actor"], a["request_id"]) for a in shown["actions"]] == [
        ("PROFILE_NOW", job.owner, action["request_id"])]
    assert [p["request_id"] for p in shown["profiles"]] == [action["request_id"]]


def test_an_acknowledged_or_snoozed_alert_gets_no_more_messages(kafka, prefix, tmp_path, chdb_client, site):
    data, database, server, publisher = site
    job = data.fleet.workflows[0]
    firing = [{**alert(a, "FIRING", True, job.team, job.owner), "workflow_id": job.workflow_id}
              for a in ("a-ack", "a-snooze", "a-left")]
    publisher.publish(ALERTS, firing, topic=prefix + ALERTS.name)
    assert publisher.flush() == 0
    mailbox, smtp_port = Mailbox(), free_port()
    smtp = Controller(mailbox, hostname="127.0.0.1", port=smtp_port)
    smtp.start()
    try:
        (tmp_path / "routing.toml").write_text(f"[default]\nemail_owners = true\n[smtp]\nhost = '127.0.0.1'\n"
                                               f"port = {smtp_port}\n")
        routing = load_routing(tmp_path / "routing.toml")

        def notifier(group: str) -> AlertNotifier:
            return AlertNotifier(kafka.bootstrap, routing, tmp_path / "sent.log", group_id=f"{prefix}{group}",
                                 topic_prefix=prefix)

        first = notifier("n1")
        run_until(first.run, lambda: len(mailbox.messages) == 3, 60, "the three alerts' messages")
        wait_until(lambda: stored(chdb_client, database, "alert_transitions") == 3, 60, "the alerts in ClickHouse")
        assert act(server, job.owner, {"workflow_id": job.workflow_id, "kind": "ACKNOWLEDGE",
                                       "alert_id": "a-ack"})[0] == 202
        assert act(server, job.owner, {"workflow_id": job.workflow_id, "kind": "SNOOZE", "alert_id": "a-snooze",
                                       "until": int(time.time() * 1000) + 3_600_000})[0] == 202
        status, refused = act(server, job.owner, {"workflow_id": job.workflow_id, "kind": "SNOOZE",
                                                  "alert_id": "a-left", "until": 5})
        assert status == 400 and "future" in refused["error"]
        assert act(server, job.owner, {"workflow_id": job.workflow_id, "kind": "ACKNOWLEDGE",
                                       "alert_id": "not-this-jobs"})[0] == 400
        # the root cause of each episode comes: only the one left alone is told, through a restart too
        causes = [{**f, "root_cause": "GPU idle 99 % of the profiled time.", "profile_request_id": "auto-1"}
                  for f in firing]
        publisher.publish(ALERTS, causes, topic=prefix + ALERTS.name)
        assert publisher.flush() == 0
        second = notifier("n2")
        run_until(second.run, lambda: committed_everything(kafka.bootstrap, f"{prefix}n2", ALERTS,
                                                           prefix + ALERTS.name), 60,
                  "the notifier to read every alert again")
        subjects = [mail.split("Subject: ")[1].splitlines()[0] for _, mail in mailbox.messages]
        assert len(subjects) == 4 and "root cause" in subjects[3], subjects
        assert sum("root cause" in s for s in subjects) == 1
        # operators still see every transition
        assert stored(chdb_client, database, "alert_transitions FINAL") == 3
        wait_until(lambda: stored(chdb_client, database, "owner_actions") == 2, 60, "the actions in ClickHouse")
    finally:
        smtp.stop()


def test_every_notifier_of_a_group_honours_what_the_owners_acknowledged(kafka, prefix, tmp_path, chdb_client,
                                                                        site):
    """The owners' actions have one partition, and a group would give it to one notifier: each
    notifier reads it whole, so an acknowledged alert is muted on whichever notifier of the
    group reads its partition (each with a sent log of its own, as on two machines)."""
    data, database, server, publisher = site
    jobs = data.fleet.workflows

    def firing(job, alert_id: str, notify: bool, **more) -> dict:
        return {**alert(alert_id, "FIRING", notify, job.team, job.owner), "workflow_id": job.workflow_id, **more}

    publisher.publish(ALERTS, [firing(j, f"ack-{j.workflow_id}", False) for j in jobs], topic=prefix + ALERTS.name)
    assert publisher.flush() == 0
    wait_until(lambda: stored(chdb_client, database, "alert_transitions") == len(jobs), 60, "the alerts in ClickHouse")
    for j in jobs:
        assert act(server, j.owner, {"workflow_id": j.workflow_id, "kind": "ACKNOWLEDGE",
                                     "alert_id": f"ack-{j.workflow_id}"})[0] == 202
    mailbox, smtp_port = Mailbox(), free_port()
    smtp = Controller(mailbox, hostname="127.0.0.1", port=smtp_port)
    smtp.start()
    (tmp_path / "routing.toml").write_text(f"[default]\nemail_owners = true\n[smtp]\nhost = '127.0.0.1'\n"
                                           f"port = {smtp_port}\n")
    group = f"{prefix}notifier"
    notifiers = [AlertNotifier(kafka.bootstrap, load_routing(tmp_path / "routing.toml"), tmp_path / f"{n}.log",
                               group_id=group, topic_prefix=prefix) for n in ("a", "b")]
    stop = threading.Event()
    threads = [threading.Thread(target=n.run, args=(stop,), daemon=True) for n in notifiers]
    for thread in threads:
        thread.start()
    try:
        def alerts_shared():
            owned = [{p for t, p in m if t == prefix + ALERTS.name} for m in group_members(kafka.bootstrap, group)]
            return len(owned) == 2 and all(owned)

        wait_until(alerts_shared, 90, "both notifiers reading partitions of the alerts")
        # each acknowledged episode's root cause (told, were it not acknowledged), and an alert left alone
        publisher.publish(ALERTS, [a for j in jobs for a in (
            firing(j, f"ack-{j.workflow_id}", True, root_cause="GPU idle 99 % of the profiled time."),
            firing(j, f"told-{j.workflow_id}", True))], topic=prefix + ALERTS.name)
        assert publisher.flush() == 0
        wait_until(lambda: committed_everything(kafka.bootstrap, group, ALERTS, prefix + ALERTS.name), 60,
                   "the notifiers to deal with every alert")
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        smtp.stop()
    assert all(n.handled for n in notifiers), "each notifier read alerts of its own partitions"
    subjects = [mail.split("Subject: ")[1].splitlines()[0] for _, mail in mailbox.messages]
    assert len(subjects) == len(jobs) and not any("root cause" in s for s in subjects), subjects


def test_an_approved_exemption_stops_the_action_and_another_job_is_still_acted_on(kafka, prefix, tmp_path,
                                                                                  chdb_client, site):
    data, database, server, publisher = site
    exempt, other = data.fleet.workflows[0], data.fleet.workflows[1]
    status, refused = act(server, exempt.owner, {"workflow_id": exempt.workflow_id, "kind": "EXEMPTION_REQUESTED",
                                                 "reason": " "})
    assert status == 400 and "why" in refused["error"]
    status, asked = act(server, exempt.owner, {"workflow_id": exempt.workflow_id, "kind": "EXEMPTION_REQUESTED",
                                               "reason": "a paper deadline: the job restarts its loader hourly"})
    assert status == 202
    wait_until(lambda: stored(chdb_client, database, "owner_actions") == 1, 60, "the request in ClickHouse")
    decision = {"workflow_id": exempt.workflow_id, "kind": "EXEMPTION_APPROVED", "request_id": asked["action_id"]}
    assert act(server, exempt.owner, decision)[0] == 400  # an owner cannot approve their own
    assert act(server, "the-operator", {**decision, "request_id": "act-none"})[0] == 400
    status, approved = act(server, "the-operator", {**decision, "reason": "granted until Friday"})
    assert status == 202 and approved["role"] == "operator"
    wait_until(lambda: job_of(server, exempt.owner, exempt.workflow_id)["actions"][0]["decision"] == {
        "kind": "EXEMPTION_APPROVED", "actor": "the-operator", "reason": "granted until Friday"}, 60,
        "the decision on the page")

    (tmp_path / "enforcement.toml").write_text('[[ladder]]\nname = "idle-gpus"\ndetector = "idle_allocated"\n'
                                               'command = ["scancel", "{scheduler_job_id}"]\nact = true\n')
    now = int(time.time() * 1000)
    dues = [{"event_id": f"idle_allocated:{w.workflow_id}:{now}:ACTION_DUE", "alert_id": f"idle:{w.workflow_id}",
             "step": "ACTION_DUE", "policy": "idle-gpus", "detector": "idle_allocated", "workflow_id": w.workflow_id,
             "owner": w.owner, "team": w.team, "cluster": None, "scheduler_job_id": job_id, "since": now,
             "due_at": now, "action_at": now, "dry_run": False, "gpus": 1, "reason": "idle allocated has held",
             "command": [], "exit_code": None, "attempt": 0, "at": now}
            for w, job_id in ((exempt, "101"), (other, "202"))]
    publisher.publish(ENFORCEMENT, dues, topic=prefix + ENFORCEMENT.name)
    assert publisher.flush() == 0
    ran = []

    def runner(command, **_):
        ran.append(command)
        import subprocess
        return subprocess.CompletedProcess(command, 0, "", "")

    enforcer = Enforcer(kafka.bootstrap, load_ladders(tmp_path / "enforcement.toml"), act=True,
                        group_id=f"{prefix}enforcer", topic_prefix=prefix, runner=runner)
    run_until(enforcer.run, lambda: len(enforcer.stats.outcomes) >= 3, 60, "the enforcer")
    assert ran == [["scancel", "202"]]  # the exempted job's action was never run
    outcomes = {(r["workflow_id"], r["step"]) for r in enforcer.stats.outcomes}
    assert (exempt.workflow_id, "EXEMPT") in outcomes and (other.workflow_id, "ACTED") in outcomes
    (said,) = [r["reason"] for r in enforcer.stats.outcomes if r["step"] == "EXEMPT"]
    assert said == "exempted by the-operator on the owners' service: granted until Friday; nothing run"
