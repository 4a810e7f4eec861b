"""A table's columns made from its record's field list (``schemas.fields``), so the shape of a
record is written once: each field a column of its name, in the schema's order; a nested record
a ``Tuple`` of its fields in their order (an array of them an ``Array(Tuple(...))``), or, where
the table wants it flat, a column per field named ``<field>_<its field>``; the type from the Avro
type, nullable where the field is, with the storage the table chooses for some names (an
unsigned or narrower integer, ``LowCardinality``). A field added in a later version is a column
added to tables made before it (``added``), in the order of the versions that brought them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from schemas.fields import TIMESTAMP_MS, Enum, Record, Versioned

_PRIMITIVE = {"string": "String", "boolean": "Bool", "int": "Int32", "long": "Int64", "float": "Float32",
              "double": "Float64", "bytes": "String"}


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    since: int  # the record's version that brought it


def column_type(avro: Any, name: str, storage: Mapping[str, str], version: int) -> str:
    """The ClickHouse type of a field ``name`` of Avro type ``avro``; ``storage``: a base type
    chosen for some names, at any depth (``{"launches": "UInt64"}``)."""
    if isinstance(avro, Versioned):
        avro = avro.at(version)
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        if len(branches) != 1:
            raise ValueError(f"{name}: a union of {avro} has no one ClickHouse type")
        inner = column_type(branches[0], name, storage, version)
        if "null" not in avro:
            return inner
        if inner.startswith("LowCardinality("):
            return f"LowCardinality(Nullable({inner[len('LowCardinality('):-1]}))"
        return f"Nullable({inner})"
    if isinstance(avro, Record):
        parts = [f"{f.name} {column_type(f.type, f.name, storage, version)}"
                 for f in avro.fields_at(avro.pinned or version)]
        return f"Tuple({', '.join(parts)})"
    if isinstance(avro, Enum):
        return storage.get(name, "LowCardinality(String)")
    if avro == TIMESTAMP_MS:
        return "DateTime64(3, 'UTC')"
    if isinstance(avro, dict) and avro.get("type") == "array":
        return f"Array({column_type(avro['items'], name, storage, version)})"
    if isinstance(avro, dict) and avro.get("type") == "map":
        return f"Map(String, {column_type(avro['values'], name, {}, version)})"
    if avro in _PRIMITIVE:
        return storage.get(name, _PRIMITIVE[avro])
    raise ValueError(f"{name}: no ClickHouse type for Avro {avro!r}")


def columns(record: Record, storage: Mapping[str, str] = {}, flat: tuple[str, ...] = ()) -> list[Column]:
    """The columns of ``record``'s newest version; the nested records named in ``flat`` as a
    column per field (nullable where the record may be absent)."""
    out = []
    version = record.newest
    for f in record.fields:
        if f.name not in flat:
            out.append(Column(f.name, column_type(f.type, f.name, storage, version), f.since))
            continue
        nested = _record_in(f.type)
        optional = isinstance(f.type, list) and "null" in f.type
        for g in nested.fields_at(nested.pinned or version):
            typ = column_type(optional_of(g.type) if optional else g.type, g.name, storage, version)
            out.append(Column(f"{f.name}_{g.name}", typ, max(f.since, g.since)))
    return out


def optional_of(avro: Any) -> Any:
    return avro if isinstance(avro, list) and "null" in avro else ["null", avro]


def _record_in(avro: Any) -> Record:
    for t in avro if isinstance(avro, list) else [avro]:
        if isinstance(t, Record):
            return t
    raise ValueError(f"no record in {avro!r} to store flat")


def first(cols: list[Column]) -> list[Column]:
    """The columns the table was first made with (its record's first version)."""
    return [c for c in cols if c.since == 1]


def added(cols: list[Column]) -> tuple[tuple[str, str], ...]:
    """The columns later versions brought, version by version: ``Table.added_columns``."""
    return tuple((c.name, c.type) for c in sorted((c for c in cols if c.since > 1), key=lambda c: c.since))


def create_columns(cols: list[Column]) -> str:
    """The first version's columns as a ``CREATE TABLE``'s lines."""
    return ",\n".join(f"        {c.name} {c.type}" for c in first(cols))
