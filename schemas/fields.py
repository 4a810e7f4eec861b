"""The one place a record's shape is written: its fields in order, each with its type, its doc and
the version it first appeared in (``since``), and a doc per version of the record. Every
version's Avro schema is made from that list (``Record.schema(version)``): version N holds the
fields with ``since <= N``, in the list's order. ``python -m schemas.generate`` writes the
versions not yet released as the ``.avsc`` files the catalog names; a released file stays as
released, docs too (``schemas/released.py``), and ``tests/unit/schemas/test_generate.py`` fails
where it is not what its list makes on the wire, or an unreleased file not to the byte.

A type is an Avro type as JSON has it (``"long"``, ``["null", "string"]``, a dict), or one of
the named types below (``Record``, ``Enum``), written inline where a schema first uses it and
by name after, as Avro wants; ``Versioned`` where a field's type changed with the record's
version (a nested record of a newer version)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NO_DEFAULT: Any = type("NoDefault", (), {"__repr__": lambda self: "NO_DEFAULT"})()
NAMESPACE = "gpufleet"
TIMESTAMP_MS = {"type": "long", "logicalType": "timestamp-millis"}  # epoch milliseconds (int in Python)


def optional(avro_type: Any) -> list:
    """A value or null (give the field ``default=None``)."""
    return ["null", avro_type]


def array(items: Any) -> dict:
    return {"type": "array", "items": items}


def map_of(values: Any) -> dict:
    return {"type": "map", "values": values}


@dataclass(frozen=True)
class Versioned:
    """A field type that changed with the record's version: ``{first version: type}``."""

    by_version: dict[int, Any]

    def at(self, version: int) -> Any:
        return self.by_version[max(v for v in self.by_version if v <= version)]


@dataclass(frozen=True)
class Field:
    name: str
    type: Any
    doc: str | None = None
    since: int = 1  # the record's first version that has this field
    default: Any = NO_DEFAULT

    def __post_init__(self) -> None:
        if self.since > 1 and self.default is NO_DEFAULT:
            raise ValueError(f"field {self.name!r}, added in version {self.since}, needs a default: a reader of "
                             "this version must read what older writers wrote")


@dataclass(frozen=True)
class Enum:
    name: str
    symbols: tuple[str, ...]
    doc: str | None = None
    namespace: str | None = None

    def avro(self, version: int, defined: set[str]) -> Any:
        if self.name in defined:
            return self.name
        defined.add(self.name)
        out: dict[str, Any] = {"type": "enum", "name": self.name}
        if self.namespace is not None:
            out["namespace"] = self.namespace
        if self.doc is not None:
            out["doc"] = self.doc
        out["symbols"] = list(self.symbols)
        return out


@dataclass(frozen=True)
class Record:
    """A record. Top-level ones (on a topic) have ``versions``: each version's doc; a nested
    one has a single form (``doc``), or is a top-level one at one of its versions (``at``)."""

    name: str
    fields: tuple[Field, ...]
    versions: dict[int, str] = field(default_factory=dict)
    doc: str | None = None
    namespace: str | None = None
    pinned: int | None = None  # a nested use of a top-level record: the version it is at

    def __post_init__(self) -> None:
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: a field named twice")
        newest = max(self.versions, default=1)
        for f in self.fields:
            if not 1 <= f.since <= newest:
                raise ValueError(f"{self.name}.{f.name}: since {f.since}, but versions go to {newest}")

    @property
    def newest(self) -> int:
        return max(self.versions, default=1)

    def at(self, version: int) -> Record:
        """This record at ``version``, to nest in another's field."""
        return Record(self.name, self.fields, self.versions, self.doc, self.namespace, pinned=version)

    def fields_at(self, version: int) -> list[Field]:
        return [f for f in self.fields if f.since <= version]

    def schema(self, version: int | None = None) -> dict:
        """The Avro schema of ``version`` (the newest by default), as its ``.avsc`` holds it."""
        version = self.newest if version is None else version
        if self.versions and version not in self.versions:
            raise ValueError(f"{self.name} has no version {version}")
        return self.avro(version, set())

    def avro(self, version: int, defined: set[str]) -> Any:
        if self.name in defined:
            return self.name
        defined.add(self.name)
        version = self.pinned if self.pinned is not None else version
        out: dict[str, Any] = {"type": "record", "name": self.name}
        if self.versions:
            out["namespace"] = self.namespace or NAMESPACE
            out["doc"] = self.versions[version]
        else:
            if self.namespace is not None:
                out["namespace"] = self.namespace
            if self.doc is not None:
                out["doc"] = self.doc
        out["fields"] = [_field(f, version, defined) for f in self.fields_at(version)]
        return out


def _field(f: Field, version: int, defined: set[str]) -> dict:
    out: dict[str, Any] = {"name": f.name, "type": avro_type(f.type, version, defined)}
    if f.default is not NO_DEFAULT:
        out["default"] = f.default
    if f.doc is not None:
        out["doc"] = f.doc
    return out


def avro_type(t: Any, version: int, defined: set[str]) -> Any:
    """``t`` as Avro's JSON, named types inline at their first use and by name after."""
    if isinstance(t, Versioned):
        return avro_type(t.at(version), version, defined)
    if isinstance(t, Record | Enum):
        return t.avro(version, defined)
    if isinstance(t, list):
        return [avro_type(x, version, defined) for x in t]
    if isinstance(t, dict):
        if t.get("type") == "array":
            return {"type": "array", "items": avro_type(t["items"], version, defined)}
        if t.get("type") == "map":
            return {"type": "map", "values": avro_type(t["values"], version, defined)}
        return dict(t)
    return t


def conform(record: Record, values: dict, version: int | None = None) -> dict:
    """``values`` as a record of ``record`` (its newest version by default): each key a field of
    it (a key that is none is an error: a value the schema would drop), each field the schema has
    and ``values`` lacks its default (a field without one is an error), numbers where the schema
    says double as floats; a nested record holds its own fields only (what the wire carries of a
    richer dict). The keys keep ``values``' order, the fields filled in follow."""
    fields = {f.name: f for f in record.fields_at(record.newest if version is None else version)}
    unknown = [k for k in values if k not in fields]
    if unknown:
        raise ValueError(f"{record.name} has no field {', '.join(map(repr, unknown))}")
    out = {k: _conformed(fields[k].type, v, version or record.newest) for k, v in values.items()}
    for name, f in fields.items():
        if name not in out:
            out[name] = _default(record, f)
    return out


def _conformed(t: Any, value: Any, version: int) -> Any:
    if isinstance(t, Versioned):
        t = t.at(version)
    if value is None:
        return None
    if t == "double" or t == "float":
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(t, list):  # a union: where it can hold a double, the number is one
        branches = [b for b in t if b != "null"]
        return _conformed(branches[0], value, version) if len(branches) == 1 else value
    if isinstance(t, dict) and t.get("type") == "array" and isinstance(value, list):
        return [_conformed(t["items"], v, version) for v in value]
    if isinstance(t, Record) and isinstance(value, dict):  # its fields, as the wire carries them
        return {f.name: _conformed(f.type, value[f.name], version) if f.name in value else _default(t, f)
                for f in t.fields_at(t.pinned or version)}
    return value


def _default(record: Record, f: Field) -> Any:
    if f.default is NO_DEFAULT:
        raise ValueError(f"{record.name}.{f.name} has no value and no default")
    return f.default


# The fields many records carry alike, written once.
OWNER = Field("owner", optional("string"), "The job's owner, as its scheduler (or its processes) say.", default=None)
TEAM = Field("team", optional("string"), "The job's team (its Slurm account, Kubernetes namespace or team label).",
             default=None)

# Each observed goodput bucket (schemas.goodput_buckets) as a window and a job's summary carry it:
# its GPU-seconds, then its energy. What puts a GPU-second in each: streams.windows.goodput.
_BUCKET_DOCS = {
    "unhealthy": "XID, uncorrected ECC, pending row remapping, or a power or thermal clock limit",
    "startup": "before the workflow's GPUs first did any work (at most the start-up limit after its first sample)",
    "idle": "the GPU at 0 % while held",
    "input_bound": "under the input-bound utilisation while the host starved the input (CPU per GPU or I/O wait)",
    "low_util": "under the low-utilisation threshold for another reason",
    "productive": "the rest",
}


def goodput_fields(since: int) -> tuple[Field, ...]:
    """The observed buckets' ``<bucket>_gpu_seconds`` then ``<bucket>_joules``, added in version ``since``."""
    from schemas.goodput_buckets import OBSERVED_BUCKETS

    seconds = tuple(Field(f"{b}_gpu_seconds", "double", f"Goodput bucket {b}: {_BUCKET_DOCS[b]} (GPU-seconds, "
                          "weighted by share; the six buckets sum to gpu_seconds).", since=since, default=0.0)
                    for b in OBSERVED_BUCKETS)
    joules = tuple(Field(f"{b}_joules", "double", f"Energy of the {b} bucket's samples (the GPU's energy counter "
                         "where read, else power x interval).", since=since, default=0.0) for b in OBSERVED_BUCKETS)
    return (*seconds, *joules)
