"""The read path's rules (``sinks.read_path``): what ClickHouse refuses in a read-only session,
and what the read path refuses before ClickHouse sees it."""

import re

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from gpufleet.sql import run_query
from sinks.read_path import check_query, connect_reader, refusal


def test_read_only_sessions_refuse_writes(chdb_client, database):
    chdb_client.command(f"CREATE DATABASE {database}")
    chdb_client.command(f"CREATE TABLE {database}.t (x UInt8) ENGINE = MergeTree ORDER BY x")
    reader = connect_reader(f"chdb://{chdb_client.path}")
    with pytest.raises(DatabaseError, match="readonly"):
        run_query(reader, f"INSERT INTO {database}.t VALUES (1)")
    run_query(chdb_client, f"INSERT INTO {database}.t VALUES (1)")
    assert run_query(reader, f"SELECT count() AS n FROM {database}.t") == (["n"], [(1,)])


# What a read-only session must refuse: writes, DDL, settings, and every table function that
# reaches the host's files, other servers or the network.
REFUSED = [
    "INSERT INTO {db}.t VALUES (1)",
    "CREATE TABLE {db}.u (x UInt8) ENGINE = Memory",
    "DROP TABLE {db}.t",
    "SET max_threads = 1",
    "SELECT * FROM file('/etc/passwd', 'LineAsString')",
    "SELECT * FROM url('http://127.0.0.1:9/x', 'CSV', 'a String')",
    "SELECT * FROM remote('127.0.0.1:9', system.one)",
    "SELECT * FROM s3('http://127.0.0.1:9/bucket-name/x.csv', 'CSV', 'a String')",
    "SELECT * FROM mysql('127.0.0.1:9', 'd', 't', 'u', 'p')",
    "SELECT * FROM executable('cat /etc/passwd', 'LineAsString', 'a String')",
    "SELECT * FROM {db}.t SETTINGS readonly = 0",
]


@pytest.mark.parametrize("sql", REFUSED)
def test_read_only_sessions_refuse_writes_settings_and_table_functions_that_reach_out(chdb_client, database, sql):
    chdb_client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    chdb_client.command(f"CREATE TABLE IF NOT EXISTS {database}.t (x UInt8) ENGINE = MergeTree ORDER BY x")
    reader = connect_reader(f"chdb://{chdb_client.path}")
    with pytest.raises(DatabaseError) as raised:
        run_query(reader, sql.format(db=database))
    assert refusal(raised.value).startswith("refused: gpufleet's query path is read-only")
    assert run_query(reader, f"SELECT count() AS n FROM {database}.t") == (["n"], [(0,)])  # reads still work



# What the read path refuses before ClickHouse sees it: what readonly=1 lets through but shows
# another analyst's queries, the server's settings or paths, or stops others' work.
BEFORE_CLICKHOUSE = [
    ("KILL QUERY WHERE 1", "KILL is refused"),
    ("SELECT 'a'; SELECT 'b'", "one statement at a time"),
    ("SELECT * FROM system.settings", "system.settings is refused"),
    ('SELECT * FROM "system"."disks"', "system.disks is refused"),
    ("SHOW PROCESSLIST", "SHOW PROCESSLIST is refused"),
    ("show settings like '%path%'", "SHOW SETTINGS is refused"),
    ("SHOW GRANTS", "SHOW GRANTS is refused"),
    ("SHOW TABLES FROM system", "the system database"),
    ("SELECT name FROM merge('system', '^settings$')", "merge() is refused"),
    ("SELECT * FROM clusterAllReplicas('default', system.one)", "clusterAllReplicas() is refused"),
    ("   ", "an empty query"),
    # SYSTEM whole: readonly lets some through without a table (they stop the server's merges).
    ("SYSTEM STOP MERGES", "SYSTEM statements are refused"),
    ("SYSTEM STOP TTL MERGES", "SYSTEM statements are refused"),
    ("system start merges", "SYSTEM statements are refused"),
    ("/* a comment */ SYSTEM FLUSH LOGS", "SYSTEM statements are refused"),
    ("SYSTEM DROP DNS CACHE", "SYSTEM statements are refused"),
    # Only what reads: no statement of another kind reaches ClickHouse at all.
    ("OPTIMIZE TABLE gpufleet.alerts FINAL", "OPTIMIZE is refused"),
    ("SET max_execution_time = 0", "SET is refused"),
    ("USE system", "USE is refused"),
]


@pytest.mark.parametrize("sql, says", BEFORE_CLICKHOUSE)
def test_the_read_path_refuses_what_readonly_lets_through(sql, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        check_query(sql)


@pytest.mark.parametrize("sql", [
    "SELECT count() FROM gpufleet.gpu_samples WHERE host = 'system.settings; KILL'",  # words in a string
    "SHOW TABLES FROM gpufleet", "SHOW CREATE TABLE gpufleet.gpu_samples", "DESCRIBE gpufleet.alerts",
    "SELECT number FROM system.numbers LIMIT 3", "SELECT * FROM numbers(3) -- ; KILL QUERY",
    "SELECT merged FROM gpufleet.t", "WITH 1 AS x SELECT x", "(SELECT 1) UNION ALL (SELECT 2)",
    "EXPLAIN SELECT 1", "EXISTS TABLE gpufleet.alerts", "desc gpufleet.alerts", "SELECT system FROM gpufleet.t",
])
def test_what_an_analyst_writes_passes(sql):
    assert check_query(sql) == sql
