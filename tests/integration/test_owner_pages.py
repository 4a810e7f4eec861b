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
import time
import uuid
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiosmtpd.controller import Controller

from gpufleet.asgi_server import AsgiServer
from gpufleet.cli import build_parser
from gpufleet.commands.serve import actions_on
from gpufleet.commands.sink import replica_counter
from gpufleet.demo_serving import planted
from gpufleet.local.ports import free_port
from gpufleet.reports.serving import duration, services
from gpufleet.reports.workflows import workflow_summary
from gpufleet.web.access import Directory, Team
from gpufleet.web.app import Service, create_app
from gpufleet.web.identity import ProxyTrust
from producers.publish_kafka import Publisher
from producers.simulate.fleet import build_fleet
from producers.simulate.serving import SERVICE, ServingPlan, serving_samples_at, with_serving
from producers.traces.publish import publish_trace
from schemas.topics import (
    PROFILE_REQUESTS,
    SERVING_WINDOWS,
    WORKFLOW_EVENTS,
    WORKFLOW_SUMMARIES,
    WORKFLOW_WINDOWS,
    trace_id_of,
)
from sinks.clickhouse_ddl import GPU_SAMPLES_TABLE, SERVING_WINDOWS_TABLE, WORKFLOW_WINDOWS_TABLE
from sinks.consume_alerts import AlertNotifier
from sinks.job_report import summary_waterfall
from sinks.query_server import QueryServer
from sinks.route_alerts import load_routing
from sinks.serving_digest import digest_message
from sinks.write_clickhouse import ClickHouseWriter, Row
from tests.support.alerts import Mailbox, job_summary
from tests.support.alibaba import replay
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


@pytest.fixture
def served(chdb_client):
    """The demo's serving deployment (6 replicas of chat-llm, the router's traffic on 2) for 40
    minutes, through the worker's window step and stored as the sink stores it."""
    fleet = with_serving(build_fleet(seed=5, hosts=1, gpus_per_host=2, workflows=1))
    ticks, start_ms = 2400, (int(time.time()) - 7200) // 60 * 60 * 1000
    by_time, serving = defaultdict(list), defaultdict(list)
    for tick in range(ticks):
        t = (start_ms + tick * 1000) // 1000
        by_time[t] = list(fleet.samples_at(tick, start_ms, 1000))
        serving[t] = serving_samples_at(fleet, tick, ticks, start_ms, 1000)
    sent = replay(by_time, serving)
    database = f"t_{uuid.uuid4().hex[:12]}"
    writer = ClickHouseWriter(chdb_client, database)
    writer.ensure_tables()
    samples = [s for t in sorted(by_time) for s in by_time[t]]
    assert writer.insert(GPU_SAMPLES_TABLE, [Row(0, i, r) for i, r in enumerate(samples)]) == []
    for table, spec in ((WORKFLOW_WINDOWS_TABLE, WORKFLOW_WINDOWS), (SERVING_WINDOWS_TABLE, SERVING_WINDOWS)):
        assert writer.insert(table, [Row(0, i, r) for i, r in enumerate(r for s, r in sent if s is spec)]) == []
    yield SimpleNamespace(fleet=fleet, windows=[r for s, r in sent if s is SERVING_WINDOWS], database=database,
                          ticks=ticks, start_ms=start_ms)
    chdb_client.command(f"DROP DATABASE IF EXISTS {database}")


def test_a_replicas_owner_sees_what_it_served_on_its_page(chdb_client, served, browser, artefacts):
    """The page of a serving replica says what it served, as the worker judged each of its windows:
    its requests, its windows by state and the capacity it was judged against, in words and in a
    chart of its requests a second coloured by state; the same numbers for a replica that served
    nothing, and no such section on a page of a workflow that serves nothing."""
    fleet, windows, database = served.fleet, served.windows, served.database
    replicas = [w for w in fleet.workflows if w.service]
    server = AsgiServer(create_app(Service(chdb_client, database, Directory(), ProxyTrust.parse(["127.0.0.1"]))),
                        name="owners").start()
    context = browser.new_context(extra_http_headers={"X-Forwarded-User": replicas[0].owner})
    try:
        page = context.new_page()
        for replica in (replicas[0], replicas[-1]):  # one the router sends traffic to, one it never does
            mine = [w for w in windows if w["workflow_id"] == replica.workflow_id]
            states = Counter(w["state"] for w in mine)
            page.goto(f"{server.url}/jobs/{replica.workflow_id}")
            page.wait_for_function("document.body.dataset.drawn === 'yes'", timeout=30_000)
            said = page.inner_text("#served")
            assert "A replica of chat-llm (vllm)" in said
            assert f"{sum(w['requests'] for w in mine):,.0f} requests in its {len(mine)} windows" in said
            assert (f"busy in {states['BUSY']}, below its capacity in {states['HEADROOM']}, saturated in "
                    f"{states['SATURATED']}, no request in {states['IDLE']}") in said
            bars = page.evaluate("document.getElementById('traffic').data.filter(t => t.type === 'bar')"
                                 ".map(t => [t.name.split(' ')[0], t.x, t.y])")
            drawn = sorted((state.upper(), x, y) for state, xs, ys in bars for x, y in zip(xs, ys))
            judged = sorted((w["state"], w["window_start"], w["requests_per_s"]) for w in mine)
            assert [(state, x) for state, x, _ in drawn] == [(state, x) for state, x, _ in judged]
            assert [y for *_, y in drawn] == pytest.approx([y for *_, y in judged])
            capacity = mine[-1]["capacity_per_s"]
            if capacity:
                learnt = datetime.fromtimestamp(mine[-1]["capacity_window_start"] / 1000, UTC)
                assert f"Its capacity, {capacity:.2f} requests/s, was learnt from its window at " \
                       f"{learnt:%Y-%m-%d %H:%M} UTC ({mine[-1]['capacity_windows']} windows seen)" in said
                line = page.evaluate("document.getElementById('traffic').data.filter(t => t.name === 'capacity')"
                                     ".map(t => t.y)")
                assert line == [[capacity, capacity]]
            page.screenshot(path=str(artefacts / f"{replica.workflow_id}.png"), full_page=True)
        assert states == Counter({"IDLE": len(mine)})  # (the last: the router never sent it a request)
        assert "No capacity learnt yet" in page.inner_text("#served")
        report = page.inner_text("#report")  # (what `gpufleet workflow` prints): a replica's advice, not a job's
        assert "The replica served no request while it held its GPUs: scale the deployment down" in report
        assert "check for a rank that stopped" not in report
        busy = Counter(w["state"] for w in windows if w["workflow_id"] == replicas[0].workflow_id)
        assert busy["BUSY"] + busy["HEADROOM"] > 0  # (the first served)
        training = next(w for w in fleet.workflows if not w.service)
        theirs = browser.new_context(extra_http_headers={"X-Forwarded-User": training.owner}).new_page()
        theirs.goto(f"{server.url}/jobs/{training.workflow_id}")
        theirs.wait_for_function("document.body.dataset.drawn === 'yes'", timeout=30_000)
        assert theirs.inner_text("#job") == training.workflow_id
        assert theirs.locator("#served").count() == 0 and theirs.locator("#traffic").count() == 0
        theirs.context.close()
    finally:
        context.close()
        server.stop()


def test_the_notifier_counts_the_replicas_a_service_held_in_its_idle_replicas_time(chdb_client, served, tmp_path):
    """The digest of the demo deployment's idle replicas says how many of the replicas it held they
    are, counted as `gpufleet notify` counts them: from the windows the sink stored, through the
    sink's query server (the notifier never holds the embedded engine); none while no query server
    runs, none of another team's, none in a time the service did not run."""
    fleet, windows, database = served.fleet, served.windows, served.database
    replicas = {w.workflow_id: w for w in fleet.workflows if w.service}
    closed_to = max(w["window_end"] for w in windows)
    want = planted(fleet, served.ticks, served.ticks, served.start_ms, closed_to, ServingPlan())
    alerts = []
    for wf in want["idle"]:
        mine = [w for w in windows if w["workflow_id"] == wf]
        alerts.append({"service": SERVICE, "owner": replicas[wf].owner, "team": replicas[wf].team,
                       "since": min(w["window_start"] for w in mine), "window_end": max(w["window_end"] for w in mine)})
    args = build_parser().parse_args(["--data-dir", str(tmp_path), "notify", "--routing", str(tmp_path / "r.toml"),
                                      "--clickhouse-dsn", f"chdb://{chdb_client.path}", "--database", database])
    count = replica_counter(args)
    assert count(alerts) is None  # no query server: the digest says how many are idle only
    server = QueryServer(Path(chdb_client.path)).start(AsgiServer)
    try:
        assert 0 < len(alerts) < want["replicas"] == len(replicas) and count(alerts) == want["replicas"]
        title, _, _ = digest_message([{**a, "alert_id": a["window_end"], "detector": "idle_replica",
                                       "status": "FIRING", "workflow_id": wf, "observed": 40.0, "advice": "",
                                       "wasted_gpu_hours_so_far": 0.5} for a, wf in zip(alerts, want["idle"])],
                                     None, count(alerts))
        assert title == (f"[gpufleet warning] {len(alerts)} of {want['replicas']} replicas of {SERVICE} "
                         "served no request")
        assert count([{**a, "team": "elsewhere"} for a in alerts]) == 0
        day = 86_400_000
        assert count([{**a, "since": a["since"] + day, "window_end": a["window_end"] + day} for a in alerts]) == 0
    finally:
        server.stop()


def test_a_serving_owner_sees_their_service_against_what_its_peak_needed(chdb_client, served, browser, artefacts):
    """The owner of a deployment's replicas finds it on their jobs page and opens its page: the
    replicas it held against those its busiest span needed, as the simulator planted them and as
    `gpufleet serving` says; each replica's traffic as the worker judged its windows; its requests
    and replicas over time in a chart; the replica's own page links to it. An owner with no
    replica of it is told there is no such service."""
    fleet, windows, database = served.fleet, served.windows, served.database
    replicas = [w for w in fleet.workflows if w.service]
    closed_to = max(w["window_end"] for w in windows)
    want = planted(fleet, served.ticks, served.ticks, served.start_ms, closed_to, ServingPlan())
    (cli,) = services(chdb_client, database, "all", 600, 0.2)  # (what `gpufleet serving` prints)
    directory = Directory({replicas[0].team: Team(leads={"llm-lead"})})
    server = AsgiServer(create_app(Service(chdb_client, database, directory, ProxyTrust.parse(["127.0.0.1"]))),
                        name="owners").start()
    context = browser.new_context(extra_http_headers={"X-Forwarded-User": replicas[0].owner})
    try:
        page = context.new_page()
        page.goto(f"{server.url}/jobs")
        row = [c.strip() for c in page.locator(f"#services tr[data-service='{SERVICE}'] td").all_inner_texts()]
        assert row == [SERVICE, str(want["replicas"]), f"{cli.gpu_hours:,.2f}", f"{cli.idle_gpu_hours:,.2f}",
                       f"{want['peak']:.2f}", str(cli.replicas_at_peak), str(want["needed"]),
                       f"{cli.freed_gpu_hours:,.2f}"]
        assert want["needed"] < want["replicas"] and cli.freed_gpu_hours > 0  # (the deployment is too large)
        page.screenshot(path=str(artefacts / "jobs-with-services.png"), full_page=True)

        with page.expect_navigation():
            page.click(f"#services a:has-text('{SERVICE}')")
        page.wait_for_function("document.body.dataset.drawn === 'yes'", timeout=30_000)
        assert page.inner_text("#service") == SERVICE
        assert f"needed {want['needed']} replicas with +20% headroom: {cli.replicas_at_peak} held" in \
            page.inner_text("#said")
        shown = {r.get_attribute("data-replica"): [c.strip() for c in r.locator("td").all_inner_texts()]
                 for r in page.locator("#replicas tbody tr").all()}
        assert set(shown) == {r.workflow_id for r in replicas}
        for wf, cells in shown.items():
            mine = [w for w in windows if w["workflow_id"] == wf]
            states = Counter(w["state"] for w in mine)
            assert cells[2:8] == [f"{sum(w['requests'] for w in mine):,.0f}", str(len(mine)), str(states["BUSY"]),
                                  str(states["HEADROOM"]), str(states["SATURATED"]), str(states["IDLE"])]
            if wf in want["idle"]:  # never served: no request for its whole life
                life = (max(w["window_end"] for w in mine) - min(w["window_start"] for w in mine)) / 1000
                assert cells[8] == "-" and cells[9] == duration(life)
        # the chart: a bar per minute of the service's requests a second, and the replicas it held then
        bars, held = page.evaluate("(() => { const d = document.getElementById('traffic').data; return ["
                                   "d.find(t => t.name === 'requests/s'), d.find(t => t.name === 'replicas held')]"
                                   ".map(t => [t.x, t.y]); })()")
        by_minute = defaultdict(list)
        for w in windows:
            by_minute[w["window_start"]].append(w)
        minutes = sorted(by_minute)
        assert bars[0] == minutes and held[0] == minutes
        assert bars[1] == pytest.approx([sum(w["requests"] for w in by_minute[m]) / 60 for m in minutes])
        assert held[1] == [len({w["workflow_id"] for w in by_minute[m]}) for m in minutes]
        page.screenshot(path=str(artefacts / "service-page.png"), full_page=True)

        twin = page.request.get(f"{server.url}/api/services/{SERVICE}").json()
        assert twin["replicas_needed"] == want["needed"] and len(twin["replica_list"]) == want["replicas"]
        page.goto(f"{server.url}/jobs/{replicas[0].workflow_id}")
        with page.expect_navigation():
            page.click("#its-service")
        page.wait_for_function("document.body.dataset.drawn === 'yes'", timeout=30_000)
        assert page.inner_text("#service") == SERVICE

        # the team's lead finds it on the team's page, with the same figures, and in its JSON twin
        lead = browser.new_context(extra_http_headers={"X-Forwarded-User": "llm-lead"}).new_page()
        lead.goto(f"{server.url}/teams/{replicas[0].team}")
        assert [c.strip() for c in lead.locator(f"#services tr[data-service='{SERVICE}'] td").all_inner_texts()] == row
        team = lead.request.get(f"{server.url}/api/teams/{replicas[0].team}").json()
        assert [(s["service"], s["replicas_needed"]) for s in team["services"]] == [(SERVICE, want["needed"])]
        lead.context.close()

        training = next(w for w in fleet.workflows if not w.service)
        theirs = browser.new_context(extra_http_headers={"X-Forwarded-User": training.owner}).new_page()
        answer = theirs.goto(f"{server.url}/services/{SERVICE}")
        assert answer.status == 404 and theirs.inner_text("#missing") == "no such service"
        theirs.goto(f"{server.url}/jobs")
        assert theirs.locator("#services").count() == 0 and training.workflow_id in theirs.inner_text("#jobs")
        assert theirs.request.get(f"{server.url}/api/services").json() == {"services": []}
        theirs.context.close()
    finally:
        context.close()
        server.stop()
