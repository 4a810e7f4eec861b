"""``gpufleet job``, ``jobs``, ``workflow`` and ``serving`` on a login node, as the Unix user who
runs them: two real users (useradd) with a job each (and the first a serving replica), a real
munged, the owners' service over HTTP. Each user's command works for their own job and answers
"no such job" for the other's; a credential sent twice, made for another request, or forged is
refused."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
import uuid

import pytest

from gpufleet.asgi_server import AsgiServer
from gpufleet.web.access import Directory
from gpufleet.web.app import Service, create_app
from gpufleet.web.identity import MUNGE_HEADER, Munge, ProxyTrust, munge_credential, request_payload
from sinks.clickhouse_ddl import SERVING_WINDOWS_TABLE, WORKFLOW_WINDOWS_TABLE
from sinks.write_clickhouse import ClickHouseWriter, Row
from tests.support.munge import Munged, add_user, as_user, gpufleet_for_users, missing, remove_user
from tests.support.samples import BASE_MS, window

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")

GPUFLEET = gpufleet_for_users() if missing() is None else None
USERS = ("gfown-ana", "gfown-bo")


@pytest.fixture(scope="module")
def munged():
    m = Munged().start()
    yield m
    m.stop()


@pytest.fixture(scope="module")
def users():
    made = [u for u in USERS if add_user(u)]
    yield USERS
    for u in made:
        remove_user(u)


def serving_window(owner: str, minute: int) -> dict:
    """Minute ``minute`` of slurm-303, a replica of ana-chat that served a request a second."""
    start = BASE_MS + minute * 60_000
    return {"workflow_id": "slurm-303", "owner": owner, "team": "team-0", "service": "ana-chat", "engine": "vllm",
            "window_start": start, "window_end": start + 60_000, "gpu_count": 1, "gpu_seconds": 60.0,
            "utilization_mean_pct": 40.0, "requests": 60.0, "requests_per_s": 1.0, "tokens_per_s": None,
            "queue_time_ms": 20.0, "ttft_ms": None, "waiting_max": 0.0, "capacity_per_s": 1.0,
            "capacity_window_start": BASE_MS, "capacity_windows": minute + 1, "state": "BUSY", "idle_since": None,
            "closed_at": start + 61_000}


@pytest.fixture(scope="module")
def service(chdb_client, munged, users):
    database = f"t_{uuid.uuid4().hex[:12]}"
    writer = ClickHouseWriter(chdb_client, database)
    writer.ensure_tables()
    rows = [Row(0, i * 10 + m, window(workflow_id=f"slurm-{101 + 101 * i}", owner=user, team=f"team-{i}",
                                      window_start=BASE_MS + m * 60_000, window_end=BASE_MS + (m + 1) * 60_000,
                                      productive_gpu_seconds=60.0, idle_gpu_seconds=60.0))
            for i, user in enumerate(users) for m in range(5)]
    rows += [Row(0, 100 + m, window(workflow_id="slurm-303", owner=users[0], team="team-0",  # (a replica of theirs)
                                    window_start=BASE_MS + m * 60_000, window_end=BASE_MS + (m + 1) * 60_000,
                                    productive_gpu_seconds=60.0)) for m in range(5)]
    assert writer.insert(WORKFLOW_WINDOWS_TABLE, rows) == []
    served = [Row(0, m, serving_window(users[0], m)) for m in range(5)]
    assert writer.insert(SERVING_WINDOWS_TABLE, served) == []
    app = create_app(Service(chdb_client, database, Directory(), ProxyTrust(), Munge(munged.socket),
                             base_url="https://gpufleet.example.org"))
    server = AsgiServer(app, name="owners").start()
    yield server
    server.stop()
    chdb_client.command(f"DROP DATABASE IF EXISTS {database}")


def gpufleet_as(user: str, *args: str, munged: Munged, service: AsgiServer) -> subprocess.CompletedProcess:
    if GPUFLEET is None:
        pytest.skip("no Python here that another user may run gpufleet with")
    return subprocess.run([*as_user(user), *GPUFLEET, *args, "--url", service.url, "--munge-socket",
                           munged.socket], capture_output=True, text=True, timeout=120, cwd="/tmp", check=False)


def test_each_user_sees_their_own_job_and_not_the_others(munged, service):
    ana, bo = USERS
    mine = gpufleet_as(ana, "job", "101", munged=munged, service=service)
    assert mine.returncode == 0, mine.stderr
    assert "gpufleet job report: slurm-101" in mine.stdout and f"owner {ana}" in mine.stdout
    assert "Where the GPU-hours went" in mine.stdout and "What to try:" in mine.stdout
    assert "The job's page: https://gpufleet.example.org/jobs/slurm-101" in mine.stdout

    theirs = gpufleet_as(ana, "job", "202", munged=munged, service=service)
    nothing = gpufleet_as(ana, "job", "999", munged=munged, service=service)
    assert theirs.returncode == nothing.returncode == 1
    assert theirs.stdout.replace("202", "N") == nothing.stdout.replace("999", "N")  # no way to tell they differ

    listed = gpufleet_as(bo, "jobs", "--since", "all", munged=munged, service=service)
    assert listed.returncode == 0, listed.stderr
    assert "slurm-202" in listed.stdout and "slurm-101" not in listed.stdout
    assert gpufleet_as(bo, "job", "202", munged=munged, service=service).returncode == 0


def ask(service: AsgiServer, path: str, credential: str) -> tuple[int, dict]:
    request = urllib.request.Request(service.url + path, headers={MUNGE_HEADER: credential})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def credential_of(user: str, payload: str, munged: Munged) -> str:
    out = subprocess.run([*as_user(user), "munge", "--socket", munged.socket, "--string", payload],
                         capture_output=True, text=True, check=True, timeout=30, cwd="/tmp")
    return out.stdout.strip()


def test_a_credential_replayed_made_for_another_request_or_forged_is_refused(munged, service):
    ana, _ = USERS
    path = "/api/jobs/slurm-101"
    good = credential_of(ana, request_payload("GET", path), munged)
    assert ask(service, path, good)[0] == 200
    status, body = ask(service, path, good)  # the same credential again
    assert status == 401 and "Replayed" in body["error"]

    elsewhere = credential_of(ana, request_payload("GET", "/api/jobs"), munged)
    status, body = ask(service, path, elsewhere)
    assert status == 401 and "another request" in body["error"]

    status, body = ask(service, path, "MUNGE:" + "A" * 120 + ":")
    assert status == 401 and "refused" in body["error"]
    # a credential of another munged (another key) is not this cluster's
    other = Munged().start()
    try:
        foreign = munge_credential(request_payload("GET", path), other.socket)
    finally:
        other.stop()
    status, body = ask(service, path, foreign)
    assert status == 401 and "refused" in body["error"]


def test_a_replicas_owner_asks_what_it_and_its_service_served_as_themselves(munged, service):
    """The owner of a serving replica asks, as themselves, what their replica served and how their
    service fared against its peak, with the service's page; another user has no such service."""
    ana, bo = USERS
    mine = gpufleet_as(ana, "serving", "--since", "all", munged=munged, service=service)
    assert mine.returncode == 0, mine.stderr
    assert ("The busiest 10 min of ana-chat (0.50 requests/s) needed 1 replica with +20% headroom: 1 held."
            in mine.stdout)
    assert f"{service.url}/services/ana-chat" in mine.stdout
    theirs = gpufleet_as(bo, "serving", "--since", "all", munged=munged, service=service)
    assert theirs.returncode == 0 and "ana-chat" not in theirs.stdout
    assert "no serving replica of yours or your teams'" in theirs.stdout

    replica = gpufleet_as(ana, "workflow", "slurm-303", munged=munged, service=service)
    assert replica.returncode == 0, replica.stderr
    assert "What it served\nA replica of ana-chat (vllm), judged by its traffic: 300 requests in its 5 windows" \
        in replica.stdout
