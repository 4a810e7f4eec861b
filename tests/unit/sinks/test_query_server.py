"""While one process owns the embedded engine, `gpufleet sql` in another reads through it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from gpufleet.asgi_server import AsgiServer
from sinks.query_server import INFO_FILE, QueryServer, find_server


@pytest.fixture
def served(chdb_client, database):
    chdb_client.command(f"CREATE DATABASE {database}")
    chdb_client.command(f"CREATE TABLE {database}.t (x UInt32, at DateTime64(3, 'UTC')) ENGINE = MergeTree ORDER BY x")
    chdb_client.command(f"INSERT INTO {database}.t VALUES (1, '2026-01-01 00:00:00'), (2, '2026-01-01 00:01:00')")
    server = QueryServer(chdb_client.path).start(AsgiServer)
    yield chdb_client, database, server
    server.stop()


def test_another_process_queries_while_this_one_owns_the_engine(served, tmp_path):
    client, database, _ = served
    run = subprocess.run(
        [sys.executable, "-m", "gpufleet", "--data-dir", str(tmp_path), "sql", "--format", "json",
         "--clickhouse-dsn", f"chdb://{client.path}", f"SELECT x, at FROM {database}.t ORDER BY x"],
        check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [{"x": 1, "at": "2026-01-01T00:00:00"}, {"x": 2, "at": "2026-01-01T00:01:00"}]
    client.command(f"INSERT INTO {database}.t VALUES (3, now())")  # the owner still writes
    assert find_server(client.path).query(f"SELECT count() FROM {database}.t").result_rows == [(3,)]


def test_served_queries_are_read_only_and_errors_come_back(served):
    client, database, _ = served
    remote = find_server(client.path)
    with pytest.raises(DatabaseError, match="INSERT is refused on the read path"):
        remote.query(f"INSERT INTO {database}.t VALUES (9, now())")
    with pytest.raises(DatabaseError, match="^refused: gpufleet's query path is read-only.*READONLY"):
        remote.query(f"SELECT * FROM {database}.t SETTINGS readonly = 0")  # (ClickHouse's refusal, passed on)
    with pytest.raises(DatabaseError, match=r"^file\(\) is refused on the read path: it reads the host's files"):
        remote.query("SELECT * FROM file('/etc/passwd', 'LineAsString')")
    with pytest.raises(DatabaseError, match="UNKNOWN_TABLE|Unknown table"):
        remote.query(f"SELECT * FROM {database}.missing")
    result = remote.query(f"SELECT max(at) AS last FROM {database}.t")
    assert result.column_names == ["last"] and result.result_rows[0][0].minute == 1  # a datetime again


def test_the_secret_is_private_and_a_stopped_server_is_not_used(served, tmp_path):
    client, _, server = served
    info = Path(client.path) / INFO_FILE
    assert info.stat().st_mode & 0o777 == 0o600 and json.loads(info.read_text())["token"] == server.token
    server.stop()
    assert find_server(client.path) is None
    (tmp_path / INFO_FILE).write_text(json.dumps({"port": 1, "pid": 2**22 + 12345, "token": "x"}))
    assert find_server(tmp_path) is None  # its process is gone


SLOW = "SELECT sum(sipHash64(number)) FROM system.numbers"  # runs until its time limit stops it


@pytest.fixture
def limited(monkeypatch):
    monkeypatch.setenv("GPUFLEET_QUERY_MAX_SECONDS", "3")


def test_one_analysts_slow_query_holds_up_no_other(limited, served):
    """Each query has a session of its own: a SELECT 1 is answered while another analyst's
    query runs to its time limit, which then stops it."""
    import threading

    client, _, _ = served
    slow_server = QueryServer(client.path).start(AsgiServer)  # (the fixture's was opened before the limit was set)
    remote = find_server(client.path)
    outcome = {}

    def slow():
        try:
            remote.query(SLOW)
        except DatabaseError as exc:
            outcome["slow"] = str(exc)

    worker = threading.Thread(target=slow)
    worker.start()
    try:
        assert remote.query("SELECT 1").result_rows == [(1,)]
        assert worker.is_alive()  # answered while the slow one still runs
    finally:
        worker.join(30)
        slow_server.stop()
    assert "TIMEOUT_EXCEEDED" in outcome["slow"] or "Timeout exceeded" in outcome["slow"]


def test_one_analyst_cannot_hold_every_session(limited, served, monkeypatch):
    """Four never-ending queries of one analyst take half the four sessions; another analyst's
    query is answered at once, and the first analyst's others run as theirs end."""
    import threading

    client, _, _ = served
    server = QueryServer(client.path, sessions=4).start(AsgiServer)  # (opened after the time limit was set)
    remote = find_server(client.path)
    monkeypatch.setenv("GPUFLEET_ANALYST", "ana")
    outcomes: list[str] = []

    def slow():
        try:
            remote.query(SLOW)
        except DatabaseError as exc:
            outcomes.append(str(exc))

    workers = [threading.Thread(target=slow) for _ in range(4)]
    try:
        for w in workers:
            w.start()
        assert server.holding("ana", at_least=server.share, wait_s=10) == server.share == 2
        monkeypatch.setenv("GPUFLEET_ANALYST", "bo")
        assert remote.query("SELECT 1").result_rows == [(1,)]
        # Answered while all four of ana's still run (none ends before its time limit), two waiting.
        assert sum(w.is_alive() for w in workers) == 4 and server.holding("ana") == 2
    finally:
        for w in workers:
            w.join(30)
        server.stop()
    assert len(outcomes) == 4 and all("TIMEOUT_EXCEEDED" in o or "Timeout exceeded" in o for o in outcomes)


@pytest.mark.parametrize("sql, says", [
    ("KILL QUERY WHERE 1", "KILL is refused"),
    ("SELECT 'a'; SELECT 'b'", "one statement at a time"),
    ("SELECT * FROM system.tables", "system.tables is refused"),
    ("SELECT * FROM `system`.`query_log`", "system.query_log is refused"),
    ("", "an empty query"),
])
def test_what_the_read_path_refuses_is_refused_with_the_reason(served, sql, says):
    client, _, _ = served
    with pytest.raises(DatabaseError, match=says):
        find_server(client.path).query(sql)


def test_results_are_capped(served, monkeypatch):
    client, _, _ = served
    monkeypatch.setenv("GPUFLEET_QUERY_MAX_ROWS", "1000")
    capped = QueryServer(client.path)
    with pytest.raises(DatabaseError, match="TOO_MANY_ROWS|Limit for result exceeded"):
        capped.query("SELECT number FROM numbers(5000)")


def test_stop_waits_for_the_query_in_flight(limited, served):
    """The owner must not close the engine under a running query (the sink crashed on SIGTERM)."""
    import threading

    client, _, _ = served
    server = QueryServer(client.path)
    started, outcome = threading.Event(), {}

    def slow():
        started.set()
        try:
            server.query(SLOW)
        except DatabaseError as exc:
            outcome["slow"] = str(exc)

    worker = threading.Thread(target=slow)
    worker.start()
    started.wait(10)
    while server._busy == 0 and worker.is_alive():
        worker.join(0.01)
    server.stop()
    assert not worker.is_alive() and "slow" in outcome  # stop returned once the query had ended


def test_a_request_that_is_not_one_gets_an_answer(served):
    import urllib.error
    import urllib.request

    client, _, server = served
    port = json.loads((Path(client.path) / INFO_FILE).read_text())["port"]
    request = urllib.request.Request(f"http://127.0.0.1:{port}/query", data=b"{}", method="POST",
                                     headers={"Authorization": f"Bearer {server.token}", "Content-Length": "abc"})
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, timeout=10)
    assert answer.value.code == 400


def test_the_port_can_be_chosen_and_a_taken_one_is_refused(chdb_client):
    from gpufleet.local.ports import free_port

    port = free_port()
    server = QueryServer(chdb_client.path, port=port).start(AsgiServer)
    try:
        assert json.loads((Path(chdb_client.path) / INFO_FILE).read_text())["port"] == port
        assert find_server(chdb_client.path).query("SELECT 7").result_rows == [(7,)]
        with pytest.raises(OSError, match="in use"):
            QueryServer(chdb_client.path, port=port).start(AsgiServer)
    finally:
        server.stop()


def test_a_client_that_never_asks_or_stops_mid_body_holds_no_connection(chdb_client):
    """Served by Hypercorn (``gpufleet.asgi_server``): connections that send nothing, or a body
    shorter than their Content-Length, are closed by the server; an analyst's query is answered
    meanwhile. (Before, http.server kept each one, and a thread, for as long as the client liked.)"""
    import socket

    def quick(app, **kwargs):
        return AsgiServer(app, idle_s=0.5, read_s=0.5, **kwargs)

    server = QueryServer(chdb_client.path).start(quick)
    try:
        port = json.loads((Path(chdb_client.path) / INFO_FILE).read_text())["port"]
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
        short = socket.create_connection(("127.0.0.1", port))
        short.sendall(b"POST /query HTTP/1.1\r\nHost: q\r\nAuthorization: Bearer " + server.token.encode()
                      + b"\r\nContent-Length: 100\r\n\r\n{\"sql\":")
        assert find_server(chdb_client.path).query("SELECT 7").result_rows == [(7,)]
        for conn in [*idle, short]:
            conn.settimeout(30)  # far beyond the server's timeouts: a hang fails here
            while conn.recv(4096):  # (a 408 first, perhaps): read until the server closes it
                pass
            conn.close()
    finally:
        server.stop()
