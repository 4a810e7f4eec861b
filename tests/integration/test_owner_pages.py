"""An owner opens the link of their job report, caught by a real SMTP server from the real
notifier on the real broker, in a real browser (Debian's chromium through Playwright), behind
the site's proxy (its header, from the proxy's address): the job page draws the job's GPUs and
its waterfall with the job's own data, from the service alone (nothing fetched elsewhere), and
shows another owner nothing. They click "Profile now": the request reaches the job's host (the
test answers as its agent does, with a real trace of our profiling hook), a real worker process
analyses it, the sink stores the findings, and the page shows them. Screenshots are kept in
test-artefacts/."""

from __future__ import annotations

import email
import email.policy
import re
import uuid
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller

from gpufleet.asgi_server import AsgiServer
from gpufleet.commands.serve import actions_on
from gpufleet.local.kafka import free_port
from gpufleet.reports.workflows import workflow_summary
from gpufleet.web.access import Directory
from gpufleet.web.app import Service, create_app
from gpufleet.web.identity import ProxyTrust
from producers.publish_kafka import Publisher
from producers.traces.publish import publish_trace
from schemas.topics import PROFILE_REQUESTS, WORKFLOW_EVENTS, WORKFLOW_SUMMARIES, trace_id_of
from sinks.consume_alerts import AlertNotifier
from sinks.job_report import summary_waterfall
from sinks.route_alerts import load_routing
from sinks.write_clickhouse import ClickHouseWriter
from tests.support.alerts import Mailbox, job_summary
from tests.support.fleet_data import build, started, store
from tests.support.integration import CODEC, read_topic, run_until, running_sink, worker_process

TRACE = Path(__file__).resolve().parents[1] / "data" / "hook-trace-h200.json.gz"


@pytest.fixture
def stored(chdb_client):
    database = f"t_{uuid.uuid4().hex[:12]}"
    data = build()
    store(ClickHouseWriter(chdb_client, database), data)
    yield data, database
    chdb_client.command(f"DROP DATABASE IF EXISTS {database}")


def summary_of(client, database: str, job) -> dict:
    """The job's WorkflowSummary as the worker would send it at its end: its figures from its windows."""
    measured, _ = workflow_summary(client, database, job.workflow_id)
    record = job_summary(job.workflow_id, job.team, job.owner)
    return {**record, **{k: v for k, v in measured.items() if k in record and k != "end_reason"},
            "alerts_fired": []}


def test_the_owner_opens_the_link_of_their_message_and_sees_their_job(kafka, prefix, tmp_path, chdb_client, stored,
                                                                       browser, artefacts):
    data, database = stored
    job = data.fleet.workflows[0]
    stranger = next(w.owner for w in data.fleet.workflows if w.owner != job.owner and w.team != job.team)
    publisher = Publisher(kafka.bootstrap, CODEC)
    publisher.publish(WORKFLOW_EVENTS, [started(job)], topic=prefix + WORKFLOW_EVENTS.name)  # as its agent says
    assert publisher.flush() == 0
    server = AsgiServer(create_app(Service(chdb_client, database, Directory(), ProxyTrust.parse(["127.0.0.1"]),
                                           actions=actions_on(kafka.bootstrap, prefix))), name="owners").start()
    mailbox, smtp_port = Mailbox(), free_port()
    smtp = Controller(mailbox, hostname="127.0.0.1", port=smtp_port)
    smtp.start()
    try:
        (tmp_path / "routing.toml").write_text(f"""
[default]
email_owners = true
job_reports = true
pages = "{server.url}"
[smtp]
host = "127.0.0.1"
port = {smtp_port}
""")
        publisher.publish(WORKFLOW_SUMMARIES, [summary_of(chdb_client, database, job)],
                          topic=prefix + WORKFLOW_SUMMARIES.name)
        assert publisher.flush() == 0
        notifier = AlertNotifier(kafka.bootstrap, load_routing(tmp_path / "routing.toml"), tmp_path / "sent.log",
                                 group_id=f"{prefix}pages", topic_prefix=prefix)
        run_until(notifier.run, lambda: len(mailbox.messages) >= 1, 60, "the job report's mail")
        (to, raw), = mailbox.messages
        assert to == [job.owner]
        text = email.message_from_string(raw, policy=email.policy.default).get_body(("plain",)).get_content()
        link, = re.findall(r"The job's page: (\S+)", text)

        elsewhere: list[str] = []
        context = browser.new_context(extra_http_headers={"X-Forwarded-User": job.owner})
        context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(server.url)
                      else (elsewhere.append(route.request.url), route.abort()))
        page = context.new_page()
        page.goto(link)
        page.wait_for_function("document.body.dataset.drawn === 'yes'", timeout=30_000)
        assert page.inner_text("#job") == job.workflow_id and page.inner_text("#who").startswith(job.owner)

        # the GPUs' panels: a line per GPU and metric, a point per minute of the job's samples
        lines = page.evaluate("document.getElementById('gpus').data.map(t => [t.name, t.y.length, "
                              "t.y.filter(v => v !== null).length])")
        minutes = {s["event_time"] // 60_000 for s in data.samples if s["workflow_id"] == job.workflow_id}
        assert len(lines) == 4 * len(job.gpus)
        assert {name for name, _, _ in lines} == {f"{g.host}:{g.index}" for g in job.gpus}
        assert all(points == len(minutes) for _, points, _ in lines)
        assert sum(drawn for _, _, drawn in lines) > 0
        # the waterfall: the job's buckets, as `gpufleet workflow` sums them
        bars = page.evaluate("document.getElementById('waterfall').data[0].y")
        summary, _ = workflow_summary(chdb_client, database, job.workflow_id)
        expected = [v.gpu_seconds / 3600 for v in summary_waterfall(summary).buckets.values() if v.gpu_seconds > 0]
        assert bars == pytest.approx(expected)
        assert page.locator("#gpus .main-svg").count() > 0  # drawn by Plotly, in the page
        rows = page.locator("#timeline tr").count() - 1
        assert rows == len({w["window_start"] for w in data.windows if w["workflow_id"] == job.workflow_id})
        page.screenshot(path=str(artefacts / "job-page.png"), full_page=True)

        # "Profile now": the request goes to the job's host; its findings come to the page
        with running_sink(kafka.bootstrap, prefix, chdb_client, database), \
                worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker", "--no-periodic-profiles"):
            assert page.locator("#findings").inner_text().count("no findings") == 1
            page.click("#profile-now")
            page.wait_for_function("document.getElementById('action-result').textContent.includes('waiting')")
            request_id = re.search(r"\((od-\w+)\)", page.inner_text("#action-result")).group(1)
            (request,) = [r for *_, n, r in read_topic(kafka.bootstrap, prefix + PROFILE_REQUESTS.name, 1)
                          if n == "ProfileRequest" and r["request_id"] == request_id]
            host = request["hosts"][0]
            assert host == job.gpus[0].host and request["requester"] == f"{job.owner} (owners' service)"
            publish_trace(TRACE, job.workflow_id, publisher, topic_prefix=prefix,
                          trace_id=trace_id_of(request_id, host, 0))  # what its agent sends back
            assert publisher.flush() == 0
            page.wait_for_selector("#findings td:has-text('Launch-bound trains of short kernels')", timeout=180_000)
        assert "not profiled" not in page.inner_text("#profiles") and request_id in page.inner_text("#profiles")
        assert "PROFILE_NOW" in page.inner_text("#actions") and job.owner in page.inner_text("#actions")
        page.screenshot(path=str(artefacts / "job-page-profiled.png"), full_page=True)
        assert elsewhere == []  # the page and its script came from the service alone
        context.close()

        # another owner given the same link sees that there is nothing for them
        other = browser.new_context(extra_http_headers={"X-Forwarded-User": stranger})
        theirs = other.new_page()
        answer = theirs.goto(link)
        assert answer.status == 404 and theirs.inner_text("#missing") == "no such job"
        assert job.workflow_id not in theirs.content()
        other.close()
    finally:
        smtp.stop()
        server.stop()
