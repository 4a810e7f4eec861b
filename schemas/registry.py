"""The read side of the Confluent Schema Registry REST API, over the schemas gpufleet ships.

gpufleet's messages are in the Confluent wire format (a zero byte, the schema id, Avro binary),
with ids from ``catalog.json``. A subscriber with a standard Confluent deserializer (confluent-
kafka's ``AvroDeserializer``, the Java ``KafkaAvroDeserializer``, ClickHouse's ``AvroConfluent``
format) asks a registry for the schema of each id: ``gpufleet schemas serve`` is that registry.
It serves the files of this folder and nothing else, so it is read-only (``/mode`` says
READONLY); registering a schema it does not have is refused.

Subjects, as Confluent's serializers name them:
- ``<topic>-value`` (the default, TopicNameStrategy): the versions of the topic's record type;
- ``<namespace>.<Name>`` (RecordNameStrategy): every versioned record type, also those that
  share a topic with another (the sample topic's columns and partition clocks).
A subject's version numbers are the catalog's versions of the record type.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from fastavro.schema import SchemaParseException, to_parsing_canonical_form

from schemas.codec import SCHEMA_DIR, load_catalog
from schemas.topics import ALL_TOPICS

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"

# The registry's own error codes (HTTP status * 100 + a number), as its clients expect them.
SUBJECT_NOT_FOUND, VERSION_NOT_FOUND, SCHEMA_NOT_FOUND = 40401, 40402, 40403
INVALID_VERSION, INVALID_SCHEMA, READ_ONLY = 42202, 42201, 42205
# A new version of a record type reads the old ones (Avro resolution, ``schemas.codec``).
COMPATIBILITY = {"compatibilityLevel": "BACKWARD"}
MODE = {"mode": "READONLY"}


@dataclass(frozen=True)
class Schema:
    id: int
    name: str  # the record's full name, namespace included
    version: int
    text: str  # the .avsc as shipped, in compact JSON
    canonical: str  # Avro's parsing canonical form: how two texts of one schema compare


class RegistryError(Exception):
    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


Response = tuple[int, Any]


class SchemaRegistry:
    """The registry's answers, without HTTP: ``answer(method, path, body)``."""

    def __init__(self, topic_prefix: str = "", schema_dir: Path = SCHEMA_DIR) -> None:
        by_name: dict[str, list[Schema]] = {}
        for entry in load_catalog(schema_dir):
            raw = json.loads((schema_dir / entry.file).read_text())
            full = f"{raw['namespace']}.{raw['name']}" if raw.get("namespace") else raw["name"]
            schema = Schema(entry.id, full, entry.version, json.dumps(raw, separators=(",", ":")),
                            _canonical(raw))
            by_name.setdefault(entry.name, []).append(schema)
        for versions in by_name.values():
            versions.sort(key=lambda s: s.version)
        self.by_id = {s.id: s for versions in by_name.values() for s in versions}
        self.subjects: dict[str, list[Schema]] = {}
        for spec in ALL_TOPICS:
            self.subjects[f"{topic_prefix}{spec.name}-value"] = by_name[spec.schema]
        for versions in by_name.values():
            self.subjects[versions[0].name] = versions

    # -- the API ------------------------------------------------------------------------

    def answer(self, method: str, path: str, body: bytes = b"") -> Response:
        """The HTTP status and JSON body for a request; errors as the registry words them."""
        parts = [unquote(p) for p in urlsplit(path).path.split("/") if p]
        try:
            for route_method, pattern, handler in self._routes():
                if route_method == method and _matches(pattern, parts):
                    args = [p for p, want in zip(parts, pattern) if want is None]
                    return 200, (handler(*args, body) if method == "POST" else handler(*args))
            raise RegistryError(404 if method in ("GET", "POST") else 405,
                                40400 if method in ("GET", "POST") else 40500,
                                f"HTTP {'404 Not Found' if method in ('GET', 'POST') else '405 Method Not Allowed'}: "
                                f"{method} /{'/'.join(parts)} (this registry is read-only)")
        except RegistryError as exc:
            return exc.status, {"error_code": exc.code, "message": exc.message}

    def _routes(self) -> list[tuple[str, tuple[str | None, ...], Callable]]:
        return [
            ("GET", ("schemas", "types"), lambda: ["AVRO"]),
            ("GET", ("schemas",), self.all_schemas),
            ("GET", ("schemas", "ids", None), lambda i: {"schema": self._by_id(i).text}),
            ("GET", ("schemas", "ids", None, "schema"), lambda i: json.loads(self._by_id(i).text)),
            ("GET", ("schemas", "ids", None, "subjects"), lambda i: [s for s, _ in self._uses(i)]),
            ("GET", ("schemas", "ids", None, "versions"),
             lambda i: [{"subject": s, "version": v} for s, v in self._uses(i)]),
            ("GET", ("subjects",), lambda: sorted(self.subjects)),
            ("GET", ("subjects", None, "versions"), lambda s: [v.version for v in self._subject(s)]),
            ("GET", ("subjects", None, "versions", None), lambda s, v: self._version_of(s, v)),
            ("GET", ("subjects", None, "versions", None, "schema"),
             lambda s, v: json.loads(self._version_of(s, v)["schema"])),
            ("GET", ("config",), lambda: COMPATIBILITY),
            ("GET", ("config", None), lambda s: self._subject(s) and COMPATIBILITY),
            ("GET", ("mode",), lambda: MODE),
            ("GET", ("mode", None), lambda s: self._subject(s) and MODE),
            ("POST", ("subjects", None), self.lookup),
            ("POST", ("subjects", None, "versions"), self.register),
        ]

    def all_schemas(self) -> list[dict]:
        return [self._described(subject, schema) for subject, versions in sorted(self.subjects.items())
                for schema in versions]

    def lookup(self, subject: str, body: bytes) -> dict:
        """The version of ``subject`` whose schema is the one in ``body`` (a serializer checks
        its schema this way when it may not register)."""
        schema = self._find(subject, body)
        if schema is None:
            raise RegistryError(404, SCHEMA_NOT_FOUND, f"Schema not found under subject {subject!r}")
        return self._described(subject, schema)

    def register(self, subject: str, body: bytes) -> dict:
        """Registering a schema the subject has already answers with its id, as a registry
        does; any other is refused: the schemas are gpufleet's, shipped with it."""
        schema = self._find(subject, body)
        if schema is None:
            raise RegistryError(422, READ_ONLY, f"Subject {subject!r} is in read-only mode: gpufleet's schemas "
                                                "change with a gpufleet release, not through this registry")
        return {"id": schema.id}

    # -- lookups ------------------------------------------------------------------------

    def _by_id(self, text: str) -> Schema:
        schema = self.by_id.get(_int(text)) if text.lstrip("-").isdigit() else None
        if schema is None:
            raise RegistryError(404, SCHEMA_NOT_FOUND, f"Schema {text} not found")
        return schema

    def _uses(self, text: str) -> list[tuple[str, int]]:
        schema = self._by_id(text)
        return [(subject, schema.version) for subject, versions in sorted(self.subjects.items())
                if schema in versions]

    def _subject(self, subject: str) -> list[Schema]:
        versions = self.subjects.get(subject)
        if versions is None:
            raise RegistryError(404, SUBJECT_NOT_FOUND, f"Subject {subject!r} not found.")
        return versions

    def _version_of(self, subject: str, version: str) -> dict:
        versions = self._subject(subject)
        if version in ("latest", "-1"):
            return self._described(subject, versions[-1])
        if not version.isdigit() or int(version) < 1:
            raise RegistryError(422, INVALID_VERSION, f"The specified version '{version}' is not a valid "
                                                      "version id. Allowed values are between [1, 2^31-1] "
                                                      "and the string \"latest\"")
        for schema in versions:
            if schema.version == int(version):
                return self._described(subject, schema)
        raise RegistryError(404, VERSION_NOT_FOUND, f"Version {version} not found.")

    def _find(self, subject: str, body: bytes) -> Schema | None:
        versions = self._subject(subject)
        try:
            request = json.loads(body or b"{}")
            if request.get("schemaType", "AVRO") != "AVRO":
                raise ValueError(f"schemaType {request['schemaType']}: gpufleet's schemas are Avro")
            canonical = _canonical(json.loads(request["schema"]))
        except (ValueError, KeyError, TypeError, AttributeError, SchemaParseException) as exc:
            raise RegistryError(422, INVALID_SCHEMA, f"Invalid schema: {exc}") from None
        return next((s for s in versions if s.canonical == canonical), None)

    @staticmethod
    def _described(subject: str, schema: Schema) -> dict:
        return {"subject": subject, "version": schema.version, "id": schema.id, "schema": schema.text}


def _canonical(raw: Any) -> str:
    return to_parsing_canonical_form(raw)


def _int(text: str) -> int:
    return int(text) if len(text) < 12 else -1  # an id is at most 2^31-1: no huge ints from a path


def _matches(pattern: tuple[str | None, ...], parts: list[str]) -> bool:
    return len(pattern) == len(parts) and all(want is None or want == got for want, got in zip(pattern, parts))
