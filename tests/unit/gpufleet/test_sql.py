import json

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from gpufleet.sql import format_csv, format_json, format_table, run_query
from sinks.write_clickhouse import connect


def test_table_aligns_numbers_right_and_counts_rows():
    out = format_table(["name", "n"], [("a", 1), ("bbb", 22.5), ("c", None)]).splitlines()
    assert out[0].split() == ["name", "n"]
    assert out[2].endswith("   1") and out[3].endswith("22.5") and out[4].endswith("NULL")
    assert out[-1] == "(3 rows)"


def test_csv_and_json():
    assert format_csv(["a", "b"], [(1, None)]).splitlines() == ["a,b", "1,"]
    assert json.loads(format_json(["a"], [(1,)])) == [{"a": 1}]


def test_read_only_sessions_refuse_writes(chdb_client, database):
    chdb_client.command(f"CREATE DATABASE {database}")
    chdb_client.command(f"CREATE TABLE {database}.t (x UInt8) ENGINE = MergeTree ORDER BY x")
    reader = connect(f"chdb://{chdb_client.path}", read_only=True)
    with pytest.raises(DatabaseError, match="readonly"):
        run_query(reader, f"INSERT INTO {database}.t VALUES (1)")
    run_query(chdb_client, f"INSERT INTO {database}.t VALUES (1)")
    assert run_query(reader, f"SELECT count() AS n FROM {database}.t") == (["n"], [(1,)])
