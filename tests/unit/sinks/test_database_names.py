"""A database's name that gpufleet's queries would read as something else is refused where it is
named, before anything is created: ClickHouse's analyzer takes ``s.workflow_windows`` for the
table that a query calls ``s`` (``JOIN (...) AS s``), quoted or not, so a database named ``s``
could hold neither the views nor answer a report."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from sinks.write_clickhouse import QUERY_ALIASES, ClickHouseWriter

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("sinks", "gpufleet", "streams", "schemas")
SQL = re.compile(r"\b(SELECT|FROM|JOIN)\b")
QUALIFIER = re.compile(r"(?<![\w.{}`])([A-Za-z_]\w*)\.(?=[A-Za-z_`])")


def modules() -> set[str]:
    """The names of the repository's own modules and packages (a string's ``sinks.route_alerts``),
    not those of what is installed in it (its hidden virtual environments)."""
    own = [p.relative_to(ROOT) for p in ROOT.rglob("*.py")]
    return {p.stem for p in own if not any(part.startswith(".") for part in p.parts)} | {
        p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}


def strings(tree: ast.AST):
    """The module's string literals, each as written whole (adjacent ones joined, as Python joins
    them); an f-string's fields as ``{}``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def qualifiers() -> dict[str, str]:
    """Every name that qualifies another in the strings of gpufleet's SQL (``w.team``,
    ``s.state``, ``system.tables``), with a file it is in."""
    found: dict[str, str] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for text in strings(ast.parse(path.read_text())):
                if SQL.search(text):
                    for name in QUALIFIER.findall(text):
                        found.setdefault(name, str(path.relative_to(ROOT)))
    return found


def test_the_scan_finds_the_queries_aliases():
    found = qualifiers()
    assert {"w", "s", "f"} <= set(found)  # (judged_windows, the waste view, the reports)


def test_every_name_a_query_gives_a_table_is_refused_as_a_database():
    own = modules()
    for name, where in qualifiers().items():
        if name in own:
            continue  # (a module named in a docstring beside SQL)
        with pytest.raises(ValueError, match="choose another name"):
            ClickHouseWriter.check_database(name)
        assert name in QUERY_ALIASES or name.lower() in {"system", "information_schema"}, where


@pytest.mark.parametrize("name", ["s", "w", "system", "INFORMATION_SCHEMA", "x; DROP TABLE y", "", "é", "123"])
def test_a_name_clickhouse_would_misread_is_refused_before_anything_is_created(chdb_client, name):
    with pytest.raises(ValueError, match="database name"):
        ClickHouseWriter(chdb_client, name)


def test_the_collision_is_clickhouses_and_an_unrefused_short_name_holds_the_tables(chdb_client):
    """What the refusal stands for, on the real engine: the views of a database named like an alias
    cannot be made; one named otherwise, as short, holds every table and view."""
    chdb_client.command("CREATE DATABASE IF NOT EXISTS s")
    chdb_client.command("CREATE TABLE IF NOT EXISTS s.t (a Int32) ENGINE = MergeTree ORDER BY a")
    with pytest.raises(DatabaseError, match="cannot be resolved"):
        chdb_client.query("SELECT * FROM s.t AS w LEFT JOIN (SELECT 1 AS a) AS s ON s.a = w.a")
    chdb_client.command("DROP DATABASE s")
    with pytest.raises(DatabaseError, match="SYNTAX_ERROR"):
        chdb_client.command("CREATE DATABASE 123")  # (a name of digits alone)
    writer = ClickHouseWriter(chdb_client, "x")
    writer.ensure_tables()
    try:
        names = {r[0] for r in chdb_client.query("SHOW TABLES FROM x").result_rows}
        assert {"judged_windows", "waste", "goodput_hourly", "workflow_windows"} <= names
    finally:
        chdb_client.command("DROP DATABASE x")
