"""Released schemas stay as released (``schemas/released.json``), and every newer version of a
record reads what each older one wrote (Avro schema resolution), as a subscriber holding an
old id and gpufleet's own readers rely on (the registry serving every version is
``test_registry.py``'s)."""

from __future__ import annotations

import io
import json
import shutil
from collections import defaultdict

import fastavro
import pytest

from schemas.codec import SCHEMA_DIR, load_catalog
from schemas.released import changed, fingerprint, record, unreleased


def test_no_released_schema_changed_in_place():
    assert changed() == []


def test_every_schema_in_the_catalog_is_recorded():
    """A new id is recorded when it is made (``python -m schemas.released``): from then on it is frozen."""
    assert unreleased() == []


def test_a_change_to_a_released_schema_is_refused_and_a_new_id_recorded(tmp_path):
    for f in (*SCHEMA_DIR.glob("*.avsc"), SCHEMA_DIR / "catalog.json", SCHEMA_DIR / "released.json"):
        shutil.copy(f, tmp_path)
    alert = json.loads((tmp_path / "alert.v1.avsc").read_text())
    alert["fields"].append({"name": "extra", "type": ["null", "string"], "default": None})
    (tmp_path / "alert.v1.avsc").write_text(json.dumps(alert))
    assert changed(tmp_path, tmp_path / "released.json") == [(
        "alert.v1.avsc (id 3, released) changed: put the change in a new file with a new id in catalog.json, "
        "Alert version 2")]
    with pytest.raises(SystemExit, match="changed in place"):
        record(tmp_path, tmp_path / "released.json")
    shutil.copy(SCHEMA_DIR / "alert.v1.avsc", tmp_path)  # put back; the change goes to a new id
    (tmp_path / "alert.next.avsc").write_text(json.dumps(alert))
    catalog = json.loads((tmp_path / "catalog.json").read_text())
    catalog["schemas"].append({"id": 999, "name": "Alert", "version": 99, "file": "alert.next.avsc"})
    (tmp_path / "catalog.json").write_text(json.dumps(catalog))
    assert record(tmp_path, tmp_path / "released.json") == [999]
    assert json.loads((tmp_path / "released.json").read_text())["released"]["999"] == \
        fingerprint(tmp_path / "alert.next.avsc")


def example(schema, named: dict):
    """A value of ``schema`` (parsed by fastavro) with something in every field: each union's
    last branch, one item in every array and map."""
    if isinstance(schema, str):
        return {"null": None, "boolean": True, "int": 7, "long": 7, "float": 1.5, "double": 1.5, "string": "x",
                "bytes": b"x"}.get(schema) if schema in ("null", "boolean", "int", "long", "float", "double",
                                                          "string", "bytes") else example(named[schema], named)
    if isinstance(schema, list):
        return example(schema[-1], named)
    kind = schema["type"]
    if kind == "record":
        named[schema["name"]] = schema
        return {f["name"]: example(f["type"], named) for f in schema["fields"]}
    if kind == "enum":
        named[schema["name"]] = schema
        return schema["symbols"][0]
    if kind == "array":
        return [example(schema["items"], named)]
    if kind == "map":
        return {"k": example(schema["values"], named)}
    if kind == "fixed":
        named[schema["name"]] = schema
        return b"\0" * schema["size"]
    return example(kind, named)


VERSIONS = defaultdict(list)
for _v in load_catalog():
    VERSIONS[_v.name].append(_v)
PAIRS = [(old, new) for vs in VERSIONS.values() for old in vs for new in vs if new.version > old.version]


@pytest.mark.parametrize("old, new", PAIRS, ids=[f"{o.name}.v{o.version}->v{n.version}" for o, n in PAIRS])
def test_each_newer_version_reads_what_an_older_one_wrote(old, new):
    written = example(old.parsed, {})
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, old.parsed, written)
    buf.seek(0)
    read = fastavro.schemaless_reader(buf, old.parsed, new.parsed)
    # What both versions have comes through as written (nested records too); what only the newer
    # has, as its default.
    assert common(read, written) == common(written, read)
    both = {f["name"] for f in old.parsed["fields"]} & {f["name"] for f in new.parsed["fields"]}
    for f in new.parsed["fields"]:
        if f["name"] not in both:
            assert read[f["name"]] == f["default"], f["name"]


def common(a, b):
    """``a`` with only what ``b`` has too, all the way down."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: common(a[k], b[k]) for k in a if k in b}
    if isinstance(a, list) and isinstance(b, list):
        return [common(x, y) for x, y in zip(a, b)]
    return a
