"""The owners' service (``gpufleet serve``) over real HTTP on a simulated fleet stored by the
sink's writer: who is asking, who sees what on every route, and the job page's numbers."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest
from starlette.routing import Route

from gpufleet.asgi_server import AsgiServer
from gpufleet.reports.workflows import workflow_summary
from gpufleet.web.access import Directory, Team
from gpufleet.web.app import PUBLIC, Service, create_app, job_url
from gpufleet.web.identity import ProxyTrust
from sinks.job_report import job_report, summary_waterfall
from sinks.write_clickhouse import ClickHouseWriter
from tests.support.fleet_data import build, store


@pytest.fixture(scope="module")
def fleet(chdb_client):
    database = f"t_{uuid.uuid4().hex[:12]}"
    data = build()
    store(ClickHouseWriter(chdb_client, database), data)
    yield data, database
    chdb_client.command(f"DROP DATABASE IF EXISTS {database}")


def serve(client, database, directory, trusted=("127.0.0.1",), dev_user=None):
    service = Service(client, database, directory, ProxyTrust.parse(list(trusted)), dev_user=dev_user,
                      base_url="https://gpufleet.example.org")
    return AsgiServer(create_app(service), name="owners").start(), service


def ask(server, path: str, user: str | None = None, method: str = "GET", body: dict | None = None):
    headers = {"X-Forwarded-User": user} if user else {}
    request = urllib.request.Request(server.url + path, method=method, headers=headers,
                                     data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def people(data):
    """Two owners of different teams, the team of the first, and an operator."""
    wfs = data.fleet.workflows
    first = wfs[0]
    other = next(w for w in wfs if w.owner != first.owner and w.team != first.team)
    directory = Directory({first.team: Team(members={first.owner}, leads={"lead-of-first"})},
                          operators=frozenset({"the-operator"}))
    return first, other, directory


def test_an_owner_sees_their_jobs_and_no_one_elses(chdb_client, fleet, tmp_path):
    data, database = fleet
    first, other, directory = people(data)
    server, _ = serve(chdb_client, database, directory)
    try:
        status, body = ask(server, "/api/jobs?since=all", first.owner)
        assert status == 200
        listed = {j["workflow_id"]: j for j in json.loads(body)["jobs"]}
        team_jobs = {w.workflow_id for w in data.fleet.workflows if w.owner == first.owner or w.team == first.team}
        assert set(listed) == team_jobs and first.workflow_id in listed and other.workflow_id not in listed

        # someone else's job answers exactly as one that does not exist
        mine = ask(server, f"/api/jobs/{urllib.parse.quote(first.workflow_id, safe='')}", first.owner)
        theirs = ask(server, f"/api/jobs/{urllib.parse.quote(other.workflow_id, safe='')}", first.owner)
        nothing = ask(server, "/api/jobs/wf-never-was", first.owner)
        assert mine[0] == 200
        assert theirs == nothing == (404, json.dumps({"error": "no such job"}, separators=(",", ":")))
        assert ask(server, f"/jobs/{other.workflow_id}", first.owner)[0] == 404
        assert ask(server, f"/api/figures/{other.workflow_id}", first.owner)[0] == 404
        # filters cannot reach past the viewer's rows
        status, body = ask(server, f"/api/jobs?since=all&owner={urllib.parse.quote(other.owner)}", first.owner)
        assert status == 200 and json.loads(body)["jobs"] == []
        assert ask(server, f"/api/teams/{other.team}", first.owner)[0] == 404
        assert ask(server, "/api/fleet", first.owner)[0] == 404
        assert ask(server, "/api/sql", first.owner, "POST", {"sql": "SELECT 1"})[0] == 403

        # the team's lead sees the team, an operator everything, SQL included
        status, body = ask(server, "/api/jobs?since=all", "lead-of-first")
        assert {j["workflow_id"] for j in json.loads(body)["jobs"]} == team_jobs
        status, body = ask(server, "/api/jobs?since=all", "the-operator")
        assert {j["workflow_id"] for j in json.loads(body)["jobs"]} == {w.workflow_id for w in data.fleet.workflows}
        status, body = ask(server, "/api/sql", "the-operator", "POST",
                           {"sql": f"SELECT count() FROM {database}.workflow_windows"})
        assert status == 200 and json.loads(body)["rows"][0][0] == len(data.windows)
        assert ask(server, "/api/sql", "the-operator", "POST", {"sql": "DROP TABLE x"})[0] == 400
        # a function that a read-only session would run, and that reads the host's files, is refused
        status, body = ask(server, "/api/sql", "the-operator", "POST", {"sql": "SELECT file('/etc/hostname')"})
        assert status == 400 and "file() is refused on the read path" in json.loads(body)["error"], body
        written = tmp_path / "written-by-a-query.txt"  # nor one that writes them
        status, body = ask(server, "/api/sql", "the-operator", "POST",
                           {"sql": f"SELECT 'a line' INTO OUTFILE '{written}'"})
        assert status == 400 and "INTO OUTFILE is refused" in json.loads(body)["error"] and not written.exists()
    finally:
        server.stop()


def test_the_job_page_holds_the_numbers_gpufleet_workflow_prints(chdb_client, fleet):
    data, database = fleet
    first, _, directory = people(data)
    server, service = serve(chdb_client, database, directory)
    try:
        status, body = ask(server, f"/api/jobs/{first.workflow_id}", first.owner)
        job = json.loads(body)
        summary, cluster = workflow_summary(chdb_client, database, first.workflow_id)
        assert job["report"] == job_report(summary, service.rates, cluster)[0]
        w = summary_waterfall(summary)
        assert job["goodput_pct"] == pytest.approx(w.goodput_pct)
        assert {r["bucket"]: r["gpu_hours"] for r in job["waterfall"]} == pytest.approx(
            {b: v.gpu_seconds / 3600 for b, v in w.buckets.items() if v.gpu_seconds > 0})
        assert job["url"] == job_url("https://gpufleet.example.org", first.workflow_id)
        assert job["state"] == "running" and len(job["timeline"]["rows"]) > 0

        status, body = ask(server, f"/api/figures/{first.workflow_id}", first.owner)
        figures = json.loads(body)
        lines = [t for t in figures["gpus"]["data"] if t["yaxis"] in ("y", None)]
        assert len(lines) == len(first.gpus)  # a line per GPU, from the per-minute rollup
        samples = [s for s in data.samples if s["workflow_id"] == first.workflow_id]
        mean = sum(s["utilization_pct"] * s["interval_ms"] for s in samples) / sum(s["interval_ms"] for s in samples)
        drawn = [y for t in lines for y in t["y"]]
        assert sum(drawn) / len(drawn) == pytest.approx(mean, rel=1e-6)  # every minute holds six samples

        status, page = ask(server, f"/jobs/{first.workflow_id}", first.owner)
        assert status == 200 and "/static/plotly.min.js" in page and "cdn" not in page.lower()
        assert first.workflow_id in page and "Where the GPU-hours went" in page
        status, script = ask(server, "/static/plotly.min.js")
        assert status == 200 and "plotly.js" in script[:2000].lower()
    finally:
        server.stop()


def test_every_route_refuses_whoever_it_cannot_tell(chdb_client, fleet):
    """Listed from the app itself, so a new route cannot be forgotten: with no user, or with the
    proxy's header from an address that is not the proxy's, every route but the public ones
    refuses before it runs."""
    data, database = fleet
    _, _, directory = people(data)
    server, _ = serve(chdb_client, database, directory, trusted=("10.9.9.9/32",))
    app = server.app
    try:
        routes = [r for r in app.routes if isinstance(r, Route)]
        assert {r.path for r in routes} >= PUBLIC
        for route in routes:
            path = route.path.replace("{workflow_id:path}", data.fleet.workflows[0].workflow_id) \
                .replace("{team}", data.fleet.workflows[0].team).replace("{service:path}", "chat-llm")
            method = min(route.methods - {"HEAD"})
            body = {"sql": "SELECT 1"} if method == "POST" else None
            anonymous = ask(server, path, None, method, body)
            forged = ask(server, path, "the-operator", method, body)
            if route.path in PUBLIC:
                assert anonymous[0] == 200, route.path
                continue
            assert anonymous[0] == 401 and forged[0] == 401, (route.path, anonymous, forged)
            assert "believed only from the site's proxy" in forged[1]
    finally:
        server.stop()


def test_every_route_answers_the_wrong_user_as_if_the_job_did_not_exist(chdb_client, fleet):
    """Every route the app lists, asked about the first owner's job and team by an owner of
    another team: what is about that job, team or the fleet is refused (404, or 403 for what
    owners never get), and what lists their own jobs does not name it."""
    data, database = fleet
    first, other, directory = people(data)
    server, _ = serve(chdb_client, database, directory)
    try:
        for route in (r for r in server.app.routes if isinstance(r, Route) and r.path not in PUBLIC):
            path = route.path.replace("{workflow_id:path}", first.workflow_id).replace("{team}", first.team) \
                .replace("{service:path}", "chat-llm")
            method = min(route.methods - {"HEAD"})
            body = {"sql": f"SELECT * FROM {database}.workflow_windows", "workflow_id": first.workflow_id,
                    "kind": "PROFILE_NOW"} if method == "POST" else None
            status, text = ask(server, path, other.owner, method, body)
            if "{" in route.path or route.path in ("/fleet", "/api/fleet", "/api/sql", "/api/actions"):
                assert status in (403, 404, 503), (route.path, status)
            else:
                assert status == 200, (route.path, status)
            assert first.workflow_id not in text, route.path
    finally:
        server.stop()


def test_development_mode_is_an_operator_on_loopback_only(chdb_client, fleet):
    _, database = fleet
    server, _ = serve(chdb_client, database, Directory(), trusted=(), dev_user="dev")
    try:
        status, body = ask(server, "/api/whoami")
        assert status == 200 and json.loads(body) == {"user": "dev", "role": "operator", "teams": [], "leads": [],
                                                      "operator": True, "via": "development"}
        assert ask(server, "/api/jobs/%2e%2e%2fetc")[0] == 404  # an id the contract does not allow
        assert ask(server, "/api/jobs?since=soon")[0] == 400
        assert ask(server, "/api/services/chat%0A-llm")[0] == 404  # a service name the contract does not allow
        assert ask(server, "/services/" + "x" * 300)[0] == 404
    finally:
        server.stop()


def test_the_fleet_page_ranks_the_losses_as_gpufleet_opportunities_does(chdb_client, fleet):
    from gpufleet.reports.opportunities import opportunities

    data, database = fleet
    first, _, directory = people(data)
    server, _ = serve(chdb_client, database, directory)
    try:
        status, body = ask(server, "/api/fleet?since=all", "the-operator")
        fleet_page = json.loads(body)
        columns, rows = opportunities(chdb_client, database, "cause", "all", limit=10)
        assert status == 200 and fleet_page["opportunities"]["columns"] == columns
        assert [r[0] for r in fleet_page["opportunities"]["rows"]] == [r[0] for r in rows] and rows
        status, body = ask(server, f"/api/teams/{first.team}?since=all", first.owner)
        team_jobs = {w.workflow_id for w in data.fleet.workflows if w.team == first.team}
        assert status == 200 and {r[0] for r in json.loads(body)["opportunities"]["rows"]} <= team_jobs
        status, page = ask(server, "/fleet?since=all", "the-operator")
        assert status == 200 and "Where the GPU-hours were lost most" in page and rows[0][0] in page
    finally:
        server.stop()
