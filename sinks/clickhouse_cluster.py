"""The same tables on a ClickHouse cluster: replicated per shard, one Distributed table each.

``cluster_statements(database, cluster)`` turns the single-server DDL of ``clickhouse_ddl``
into a cluster's, statement by statement:

* each table becomes ``<name>_local`` on every node (``ON CLUSTER``), its engine the
  ``Replicated`` form of the same one (the replica path from the ``{shard}`` and
  ``{replica}`` macros every node defines), plus a ``Distributed`` table under the original
  name. Inserts and queries keep using the original names: the insert path and every query
  are unchanged.
* a table the sink writes is sharded by its first key column (``workflow_id`` for most), so
  the rows a ``ReplacingMergeTree`` must collapse meet on one shard and ``FINAL`` stays exact;
* materialized views read and write the ``_local`` tables of their own node (a view on a
  ``Distributed`` table would never fire: rows are inserted into the shards);
* plain views, column additions, settings and projections are run ``ON CLUSTER``.

The migrations of ``clickhouse_ddl`` change a single server's existing tables; a cluster is
created at the current definitions and records them as applied. No ClickHouse server can run
on the machines this project is built on: these statements are generated for every table and
parsed by the embedded engine in the tests, not executed on a cluster.
"""

from __future__ import annotations

import re

from sinks.clickhouse_ddl import DERIVED, MIGRATIONS_TABLE, TABLES, create_statements

LOCAL = "_local"
_CREATE_TABLE = re.compile(r"^CREATE TABLE IF NOT EXISTS (\w+)\.(\w+) \(")
_ENGINE = re.compile(r"ENGINE = (\w*MergeTree)(?:\(([^)]*)\))?")
_ORDER_BY = re.compile(r"ORDER BY \(?\s*(\w+)")
_ALTER = re.compile(r"^ALTER TABLE (\w+)\.(\w+) (.*)$", re.DOTALL)
_VIEW = re.compile(r"^CREATE MATERIALIZED VIEW IF NOT EXISTS (\w+)\.(\w+) TO (\w+)\.(\w+) AS", re.DOTALL)
_PLAIN_VIEW = re.compile(r"^CREATE OR REPLACE VIEW (\w+)\.(\w+) AS", re.DOTALL)


def sharded_tables() -> set[str]:
    """The tables that get a ``_local`` table and a ``Distributed`` one: the sink's and the
    derived ones (rollups, latest metadata)."""
    derived = {m.group(2) for d in DERIVED if (m := _CREATE_TABLE.match(d.strip().format(db="db")))}
    return {t.name for t in TABLES} | derived


def cluster_statements(database: str, cluster: str) -> list[str]:
    """Everything to run, in order, to create gpufleet's tables on ``cluster`` (idempotent)."""
    if not re.fullmatch(r"\w+", cluster):
        raise ValueError(f"cluster name {cluster!r} must be letters, digits and _")
    tables = sharded_tables()
    sink_tables = {t.name for t in TABLES}
    out = [f"CREATE DATABASE IF NOT EXISTS {database} ON CLUSTER {cluster}"]
    for statement in create_statements(database)[1:]:
        out += _on_cluster(statement, database, cluster, tables, sink_tables)
    out += _on_cluster(MIGRATIONS_TABLE.format(db=database).strip(), database, cluster, tables | {"schema_migrations"},
                       set())
    return out


def _on_cluster(statement: str, db: str, cluster: str, tables: set[str], sink_tables: set[str]) -> list[str]:
    if m := _CREATE_TABLE.match(statement):
        name = m.group(2)
        local = statement.replace(f"{db}.{name} (", f"{db}.{name}{LOCAL} ON CLUSTER {cluster} (", 1)
        local = _ENGINE.sub(lambda e: _replicated(e, db, name), local, count=1)
        key = _ORDER_BY.search(statement)
        shard = f"cityHash64({key.group(1)})" if name in sink_tables and key else "rand()"
        distributed = (f"CREATE TABLE IF NOT EXISTS {db}.{name} ON CLUSTER {cluster} AS {db}.{name}{LOCAL} "
                       f"ENGINE = Distributed({cluster}, {db}, {name}{LOCAL}, {shard})")
        return [local, distributed]
    if m := _ALTER.match(statement):
        name, rest = m.group(2), m.group(3)
        rest = rest.replace("non_replicated_deduplication_window", "replicated_deduplication_window")
        local = f"ALTER TABLE {db}.{name}{LOCAL} ON CLUSTER {cluster} {rest}"
        if name in tables and rest.startswith("ADD COLUMN"):  # the Distributed table shows it too
            return [local, f"ALTER TABLE {db}.{name} ON CLUSTER {cluster} {rest}"]
        return [local]
    if m := _VIEW.match(statement):
        view, target = m.group(2), m.group(4)
        body = statement[m.end():]
        for name in tables:
            body = re.sub(rf"\b{db}\.{name}\b", f"{db}.{name}{LOCAL}", body)
        return [(f"CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.{view} ON CLUSTER {cluster} "
                 f"TO {db}.{target}{LOCAL} AS{body}")]
    if m := _PLAIN_VIEW.match(statement):
        return [f"CREATE OR REPLACE VIEW {db}.{m.group(2)} ON CLUSTER {cluster} AS{statement[m.end():]}"]
    raise ValueError(f"no cluster form for: {statement[:80]}")


def _replicated(engine: re.Match, db: str, name: str) -> str:
    path = f"'/clickhouse/tables/{{shard}}/{db}/{name}{LOCAL}', '{{replica}}'"
    args = engine.group(2)
    return f"ENGINE = Replicated{engine.group(1)}({path}{', ' + args if args else ''})"
