"""The cluster form of the DDL: generated for every table and parsed by the embedded engine.
No ClickHouse cluster runs here, so the statements are not executed (docs/operating.md says so)."""

import re

import pytest

from sinks.clickhouse_cluster import cluster_statements, sharded_tables
from sinks.clickhouse_ddl import TABLES
from tests.support.sql import sql_literal


@pytest.fixture(scope="module")
def statements():
    return cluster_statements("gpufleet", "fleet")


def test_every_statement_parses(chdb_client, statements):
    for statement in statements:
        formatted = chdb_client.query(f"SELECT formatQuery({sql_literal(statement)})").result_rows[0][0]
        assert "ON CLUSTER fleet" in formatted, statement[:120]


def test_the_parser_refuses_what_is_not_sql(chdb_client):
    with pytest.raises(Exception, match="Syntax error"):
        chdb_client.query(f"SELECT formatQuery({sql_literal('CREATE TABLE x (')})")


def test_each_table_is_replicated_per_shard_and_distributed_under_its_name(statements):
    assert {t.name for t in TABLES} | {"workflows", "gpu_hours_hourly", "gpu_hours_daily"} <= sharded_tables()
    for name in sharded_tables():
        (local,) = [s for s in statements if s.startswith(f"CREATE TABLE IF NOT EXISTS gpufleet.{name}_local ")]
        assert re.search(r"ENGINE = Replicated\w*MergeTree\('/clickhouse/tables/\{shard\}/gpufleet/"
                         + name + r"_local', '\{replica\}'", local), local
        (distributed,) = [s for s in statements if s.startswith(f"CREATE TABLE IF NOT EXISTS gpufleet.{name} ")]
        assert f"Distributed(fleet, gpufleet, {name}_local, " in distributed
    windows = next(s for s in statements if s.startswith("CREATE TABLE IF NOT EXISTS gpufleet.workflow_windows_local"))
    assert "{replica}', version)" in windows  # the highest version still wins
    assert any(s.startswith("CREATE TABLE IF NOT EXISTS gpufleet.workflow_windows ") and
               s.endswith("cityHash64(workflow_id))") for s in statements)


def test_views_read_and_write_the_tables_of_their_own_node(statements):
    views = [s for s in statements if s.startswith("CREATE MATERIALIZED VIEW")]
    assert len(views) == 5  # workflows, the two rollups, the GPUs per minute, the alert transitions
    for view in views:
        named = set(re.findall(r"gpufleet\.(\w+)", view))
        assert all(n.endswith(("_local", "_mv")) for n in named), view
    projections = [s for s in statements if "ADD PROJECTION" in s]
    assert len(projections) == len(TABLES) and all("_local ON CLUSTER" in s for s in projections)
