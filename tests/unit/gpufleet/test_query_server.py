"""While one process owns the embedded engine, `gpufleet sql` in another reads through it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from gpufleet.query_server import INFO_FILE, QueryServer, find_server


@pytest.fixture
def served(chdb_client, database):
    chdb_client.command(f"CREATE DATABASE {database}")
    chdb_client.command(f"CREATE TABLE {database}.t (x UInt32, at DateTime64(3, 'UTC')) ENGINE = MergeTree ORDER BY x")
    chdb_client.command(f"INSERT INTO {database}.t VALUES (1, '2026-01-01 00:00:00'), (2, '2026-01-01 00:01:00')")
    server = QueryServer(chdb_client.path).start()
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
    with pytest.raises(DatabaseError, match="readonly"):
        remote.query(f"INSERT INTO {database}.t VALUES (9, now())")
    with pytest.raises(DatabaseError, match="^refused: gpufleet's query path is read-only.*READONLY"):
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
