"""``gpufleet sql``: runs one query against gpufleet's ClickHouse and prints the result."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

from clickhouse_connect.driver.client import Client

# System tables an analyst may read: harmless ones. The others show the server's paths, disks,
# settings, users and running queries: refused on the read path (ClickHouse's own grants decide
# for a server's users too).
SYSTEM_ALLOWED = frozenset({"one", "numbers", "numbers_mt", "zeros", "functions", "data_type_families",
                            "table_functions", "time_zones"})
# What SHOW may list: gpufleet's tables and how they are made. The others (PROCESSLIST, SETTINGS,
# GRANTS, USERS, ...) show other analysts' queries or the server's settings and access.
SHOW_ALLOWED = ("TABLES", "DATABASES", "CREATE", "COLUMNS", "FULL", "EXTENDED", "INDEX", "INDEXES", "INDICES", "KEYS",
                "DICTIONARIES")
# The statements that read, the only kinds the read path passes on. The rest change or stop
# something even where readonly lets them through (SYSTEM STOP MERGES without a table, SET).
READ_STATEMENTS = ("SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS")
# Table functions that read other databases' tables by name or pattern (``merge('system', ...)``
# reads every system table) or other servers': not needed to analyse gpufleet's tables.
FUNCTIONS_REFUSED = ("merge", "cluster", "clusterAllReplicas", "remote", "remoteSecure")
_TOKENS = re.compile(r"""'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.)*"|`(?:[^`\\]|\\.)*`|--[^\n]*|/\*.*?\*/|[^'"`/-]+|.""",
                     re.DOTALL)


def _code(sql: str) -> str:
    """``sql`` without its string literals and comments (each a space); quoted identifiers kept
    without their quotes, so ``system``.`query_log` is seen as system.query_log."""
    out = []
    for token in _TOKENS.findall(sql):
        if token.startswith(("'", "--", "/*")):
            out.append(" ")
        elif token.startswith(('"', "`")):
            out.append(token[1:-1])
        else:
            out.append(token)
    return "".join(out)


def check_query(sql: str) -> str:
    """The one statement a read-path query may be, or ValueError saying why not: empty; more
    than one statement; a statement that does not read (``READ_STATEMENTS``: KILL, SYSTEM, SET,
    OPTIMIZE, ...); a system table outside ``SYSTEM_ALLOWED``."""
    code = _code(sql)
    if not code.strip():
        raise ValueError("an empty query: give one statement, such as SELECT count() FROM gpufleet.gpu_samples")
    statements = [part for part in code.split(";") if part.strip()]
    if len(statements) > 1:
        raise ValueError(f"{len(statements)} statements: give one statement at a time")
    if re.match(r"\s*KILL\b", code, re.IGNORECASE):
        raise ValueError("KILL is refused on the read path: it would stop other analysts' queries or the sink's "
                         "inserts; a query that runs too long stops at its time limit (GPUFLEET_QUERY_MAX_SECONDS)")
    kind = (re.match(r"[\s(]*(\w*)", code).group(1) or code.strip()[:1]).upper()
    if kind == "SYSTEM":
        raise ValueError("SYSTEM statements are refused on the read path: they stop, start, flush or reload the "
                         "server's own work (merges, logs, caches, replicas), which is its operators' to do")
    if kind not in READ_STATEMENTS:
        raise ValueError(f"{kind} is refused on the read path: it reads with {', '.join(READ_STATEMENTS)}")
    show = re.match(r"\s*SHOW\s+(\w+)", code, re.IGNORECASE)
    if show and show.group(1).upper() not in SHOW_ALLOWED:
        raise ValueError(f"SHOW {show.group(1).upper()} is refused on the read path (it shows other analysts' queries "
                         f"or the server's settings and access); allowed: SHOW {', '.join(SHOW_ALLOWED[:4])}, ...")
    if re.search(r"\b(?:FROM|IN)\s+system\b(?!\s*\.)", code, re.IGNORECASE):
        raise ValueError("listing the system database is refused on the read path: SHOW TABLES FROM gpufleet lists "
                         "gpufleet's tables")
    for name in FUNCTIONS_REFUSED:
        if re.search(rf"\b{name}\s*\(", code, re.IGNORECASE):
            raise ValueError(f"{name}() is refused on the read path: it reads other databases' or servers' tables; "
                             "query gpufleet's tables by name")
    for table in re.findall(r"\bsystem\s*\.\s*(\w+)", code, re.IGNORECASE):
        if table.lower() not in SYSTEM_ALLOWED:
            raise ValueError(f"system.{table} is refused on the read path (it shows the server's paths, settings, "
                             f"users or queries); allowed: {', '.join(f'system.{t}' for t in sorted(SYSTEM_ALLOWED))}")
    return sql


def run_query(client: Client, sql: str, parameters: dict | None = None) -> tuple[list[str], list[tuple]]:
    """Column names and rows of ``sql`` (``%(name)s`` placeholders filled from ``parameters``).
    Open the client with ``connect(dsn, read_only=True)`` to have ClickHouse refuse writes."""
    result = client.query(sql, parameters=parameters)
    return list(result.column_names), [tuple(r) for r in result.result_rows]


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e15 else f"{value:.6e}"
    if isinstance(value, datetime | date):
        return value.isoformat(sep=" ") if isinstance(value, datetime) else value.isoformat()
    return str(value)


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(row[i], int | float) or row[i] is None for row in rows) for i in range(len(columns))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [line(columns), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def format_csv(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(columns)
    writer.writerows([[("" if v is None else v) for v in r] for r in rows])
    return buf.getvalue().rstrip("\n")


def format_json(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def default(v: Any) -> Any:
        if isinstance(v, datetime | date):
            return v.isoformat()
        if isinstance(v, bytes):
            return v.decode(errors="replace")
        return str(v)

    return json.dumps([dict(zip(columns, r)) for r in rows], default=default, indent=1)


FORMATS = {"table": format_table, "csv": format_csv, "json": format_json}
