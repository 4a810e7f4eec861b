"""``gpufleet sql``: runs one query against gpufleet's ClickHouse and prints the result."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from schemas.validate_ids import printable


def run_query(client: Client, sql: str, parameters: dict | None = None) -> tuple[list[str], list[tuple]]:
    """Column names and rows of ``sql`` (``%(name)s`` placeholders filled from ``parameters``).
    Open the client with ``sinks.read_path.connect_reader`` to have ClickHouse refuse writes."""
    result = client.query(sql, parameters=parameters)
    return list(result.column_names), [tuple(r) for r in result.result_rows]


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e15 else f"{value:.6e}"
    if isinstance(value, datetime | date):
        return value.isoformat(sep=" ") if isinstance(value, datetime) else value.isoformat()
    return printable(str(value))


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """The rows as a terminal shows them, aligned (what is not printable escaped:
    ``schemas.validate_ids.printable``: a job's name is its owner's to choose)."""
    columns = [printable(c) for c in columns]
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
