"""Avro codec for every gpufleet record: Confluent wire format, schema ids from ``catalog.json``.

A message is ``b"\\x00" + id (4 bytes, big endian) + Avro binary``. Ids resolve from this
folder alone, so a subscriber needs no Schema Registry. Records are plain dicts; timestamps
(``timestamp-millis`` in the ``.avsc`` files) are epoch milliseconds as ``int`` in Python,
which keeps the hot path free of ``datetime`` objects.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro

SCHEMA_DIR = Path(__file__).resolve().parent
MAGIC = 0
_HEADER = struct.Struct(">BI")  # unsigned: a reason names the byte as it was sent
WIRE_HEADER_BYTES = _HEADER.size  # what every message starts with before its Avro record

Record = dict[str, Any]


class CodecError(ValueError):
    """A record could not be encoded or a message could not be decoded; the text says why."""


@dataclass(frozen=True)
class SchemaVersion:
    id: int
    name: str
    version: int
    file: str
    parsed: Any


def strip_timestamp_logical_types(node: Any) -> Any:
    """``node`` (a schema) with timestamps as plain longs: epoch milliseconds, as the records hold them."""
    if isinstance(node, dict):
        out = {k: strip_timestamp_logical_types(v) for k, v in node.items()}
        if out.get("logicalType") in ("timestamp-millis", "timestamp-micros"):
            del out["logicalType"]
        return out
    if isinstance(node, list):
        return [strip_timestamp_logical_types(v) for v in node]
    return node


def load_catalog(schema_dir: Path = SCHEMA_DIR) -> list[SchemaVersion]:
    """Read ``catalog.json`` and parse each schema it names."""
    catalog = json.loads((schema_dir / "catalog.json").read_text())
    versions = []
    for entry in catalog["schemas"]:
        raw = json.loads((schema_dir / entry["file"]).read_text())
        if raw.get("name") != entry["name"]:
            raise CodecError(f"{entry['file']} defines {raw.get('name')!r}, catalog says {entry['name']!r}")
        parsed = fastavro.parse_schema(strip_timestamp_logical_types(raw), named_schemas={})
        versions.append(SchemaVersion(entry["id"], entry["name"], entry["version"], entry["file"], parsed))
    ids = [v.id for v in versions]
    if len(set(ids)) != len(ids):
        raise CodecError(f"duplicate schema ids in catalog: {sorted(ids)}")
    return versions


def nested_records(schema: dict) -> dict[str, tuple[str, ...]]:
    """Each field of ``schema`` that holds an array of records (or a union with one), and the
    names of those records' fields, in the schema's order."""
    out = {}
    for f in schema["fields"]:
        for t in f["type"] if isinstance(f["type"], list) else [f["type"]]:
            if isinstance(t, dict) and t.get("type") == "array" and isinstance(t["items"], dict) \
                    and t["items"].get("type") == "record":
                out[f["name"]] = tuple(g["name"] for g in t["items"]["fields"])
    return out


class Codec:
    """Encodes with the newest version of a schema; decodes any version in the catalog.

    Decoding resolves an old writer schema to the newest reader schema of the same name,
    so consumers always see the current field set (Avro schema resolution).
    """

    def __init__(self, schema_dir: Path = SCHEMA_DIR) -> None:
        self._by_id: dict[int, SchemaVersion] = {}
        self._latest: dict[str, SchemaVersion] = {}
        for v in load_catalog(schema_dir):
            self._by_id[v.id] = v
            if v.name not in self._latest or v.version > self._latest[v.name].version:
                self._latest[v.name] = v

    def schema_id(self, name: str) -> int:
        return self._latest_version(name).id

    def names(self) -> list[str]:
        return sorted(self._latest)

    def wire_header(self, name: str) -> bytes:
        """The 5 bytes every message encoded now with schema ``name`` starts with."""
        return _HEADER.pack(MAGIC, self.schema_id(name))

    def schema_json(self, name: str) -> dict:
        """The newest version of schema ``name`` as its ``.avsc`` file holds it."""
        return json.loads((SCHEMA_DIR / self._latest_version(name).file).read_text())

    def _latest_version(self, name: str) -> SchemaVersion:
        try:
            return self._latest[name]
        except KeyError:
            raise CodecError(f"unknown schema {name!r}; known: {', '.join(self.names())}") from None

    def encode(self, name: str, record: Record) -> bytes:
        """Encode ``record`` with the newest version of schema ``name``."""
        version = self._latest_version(name)
        buf = io.BytesIO()
        buf.write(_HEADER.pack(MAGIC, version.id))
        try:
            fastavro.schemaless_writer(buf, version.parsed, record)
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:  # inf in a long: Overflow
            raise CodecError(f"cannot encode {name}: {exc}") from exc
        return buf.getvalue()

    def encode_many(self, name: str, records: Iterable[Record]) -> list[bytes]:
        return [self.encode(name, r) for r in records]

    def decode(self, data: bytes | None) -> tuple[str, Record]:
        """Return ``(schema name, record)``; raise :class:`CodecError` saying what is wrong."""
        if data is None:
            raise CodecError("empty message (null value)")
        if len(data) < _HEADER.size:
            raise CodecError(f"message of {len(data)} bytes is shorter than the 5-byte wire header")
        magic, schema_id = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise CodecError(f"not a gpufleet Avro message: it starts with byte 0x{magic:02x}, where the "
                             f"Confluent wire format has 0x{MAGIC:02x}")
        writer = self._by_id.get(schema_id)
        if writer is None:
            raise CodecError(f"unknown schema id {schema_id}: written with a schema this release does not know "
                             f"(a newer gpufleet, or not a gpufleet record)")
        reader = self._latest[writer.name]
        buf = io.BytesIO(data)
        buf.seek(_HEADER.size)
        try:
            record = fastavro.schemaless_reader(
                buf, writer.parsed, reader.parsed if reader is not writer else None
            )
        except (EOFError, ValueError, TypeError, IndexError, UnicodeDecodeError) as exc:
            raise CodecError(f"corrupt {writer.name} v{writer.version} payload: {exc!r}") from exc
        if buf.tell() != len(data):
            raise CodecError(
                f"{len(data) - buf.tell()} trailing bytes after a {writer.name} v{writer.version} record"
            )
        return writer.name, record  # type: ignore[return-value]

    def decode_many(
        self, values: Sequence[bytes | None]
    ) -> tuple[list[tuple[int, str, Record]], list[tuple[int, str]]]:
        """Decode a batch. Returns ``(ok, errors)``: ``(index, name, record)`` and ``(index, reason)``."""
        ok: list[tuple[int, str, Record]] = []
        errors: list[tuple[int, str]] = []
        for i, value in enumerate(values):
            try:
                name, record = self.decode(value)
            except CodecError as exc:
                errors.append((i, str(exc)))
            else:
                ok.append((i, name, record))
        return ok, errors
