"""Every version's ``.avsc`` is made from its record's one field list (``schemas/records/``):
the files are what the lists make, and the lists keep their own rules."""

from __future__ import annotations

import json

import pytest

from schemas.codec import SCHEMA_DIR, load_catalog
from schemas.fields import TIMESTAMP_MS, Field, Record, Versioned, array, conform, optional
from schemas.generate import stale
from schemas.records import BY_NAME, RECORDS


def test_every_avsc_is_what_its_field_list_makes():
    """A hand edit of an ``.avsc``, or a field list changed without ``python -m schemas.generate``, fails here."""
    assert stale() == []


def test_a_hand_edited_file_is_found(tmp_path):
    """A released file that no longer says what its list makes is found (its docs are the lock's to
    hold: ``test_released``); a version not yet released must be what its list makes, to the byte."""
    for f in (*SCHEMA_DIR.glob("*.avsc"), SCHEMA_DIR / "catalog.json", SCHEMA_DIR / "released.json"):
        (tmp_path / f.name).write_text(f.read_text())
    alert = json.loads((tmp_path / "alert.v3.avsc").read_text())
    next(f for f in alert["fields"] if f["name"] == "status")["default"] = "RESOLVED"
    (tmp_path / "alert.v3.avsc").write_text(json.dumps(alert, indent=2))
    assert stale(tmp_path, tmp_path / "released.json") == ["alert.v3.avsc"]
    lock = json.loads((tmp_path / "released.json").read_text())
    del lock["released"][str(next(v.id for v in load_catalog() if (v.name, v.version) == ("Alert", 2)))]
    (tmp_path / "released.json").write_text(json.dumps(lock))  # as if Alert v2 were not released yet
    assert stale(tmp_path, tmp_path / "released.json") == ["alert.v2.avsc", "alert.v3.avsc"]


def test_the_catalog_and_the_field_lists_name_the_same_versions():
    listed = {(v.name, v.version) for v in load_catalog()}
    assert listed == {(r.name, v) for r in RECORDS for v in r.versions}


def test_a_version_holds_the_fields_since_it_in_the_lists_order():
    r = Record("Thing", versions={1: "first", 2: "second, with size"}, fields=(
        Field("id", "string", "Its id."),
        Field("size", optional("long"), "How big.", since=2, default=None),
        Field("at", TIMESTAMP_MS, "When."),
        Field("parts", array(Versioned({1: "int", 2: "long"})), "Its parts."),
    ))
    assert r.schema(1) == {"type": "record", "name": "Thing", "namespace": "gpufleet", "doc": "first", "fields": [
        {"name": "id", "type": "string", "doc": "Its id."},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}, "doc": "When."},
        {"name": "parts", "type": {"type": "array", "items": "int"}, "doc": "Its parts."}]}
    assert [f["name"] for f in r.schema(2)["fields"]] == ["id", "size", "at", "parts"]
    assert r.schema()["fields"][3]["type"]["items"] == "long"
    with pytest.raises(ValueError, match="no version 3"):
        r.schema(3)


def test_a_field_added_after_the_first_version_must_have_a_default():
    with pytest.raises(ValueError, match="needs a default"):
        Field("late", "long", "Added later.", since=2)


def test_a_named_type_is_written_once_then_named():
    inner = Record("Part", fields=(Field("n", "int", "A number."),))
    r = Record("Whole", versions={1: "two of the same"}, fields=(
        Field("a", inner, "One."), Field("b", optional(inner), "Another.", default=None)))
    fields = r.schema()["fields"]
    assert fields[0]["type"]["type"] == "record" and fields[1]["type"] == ["null", "Part"]


def test_a_nested_record_of_another_version_is_that_version():
    """``GpuSampleBatch`` v1 carries ``GpuSample`` v3, v2 carries v4."""
    batch = BY_NAME["GpuSampleBatch"]
    for version, nested in ((1, 3), (2, 4)):
        assert batch.schema(version)["fields"][3]["type"]["items"] == BY_NAME["GpuSample"].schema(nested)


def test_a_record_is_conformed_to_its_field_list():
    """What a stage builds is checked against the shape: no value the wire would drop, no field
    without a value or a default, doubles as floats (nested too)."""
    part = Record("Part", fields=(Field("n", "double", "A number."), Field("name", "string", "Its name.")))
    r = Record("Whole", versions={1: "one", 2: "two"}, fields=(
        Field("id", "string", "Its id."), Field("total", optional("double"), "The total.", default=None),
        Field("parts", array(part), "Its parts.", since=2, default=[])))
    assert conform(r, {"total": 3, "id": "x"}) == {"total": 3.0, "id": "x", "parts": []}
    parts = conform(r, {"id": "x", "parts": [{"n": 1, "name": "a", "extra": True}]})["parts"]
    assert parts == [{"n": 1.0, "name": "a"}]
    with pytest.raises(ValueError, match="no field 'size'"):
        conform(r, {"id": "x", "size": 1})
    with pytest.raises(ValueError, match="Whole.id has no value and no default"):
        conform(r, {"total": None})
    assert conform(r, {"id": "x"}, version=1) == {"id": "x", "total": None}


def test_every_field_has_its_one_doc():
    """Each field, nested ones too, says what it holds, once for every version that has it."""
    def undocumented(r: Record, seen: set[str]) -> list[str]:
        out = []
        for f in r.fields:
            out += [] if f.doc else [f"{r.name}.{f.name}"]
            for t in f.type if isinstance(f.type, list) else [f.type]:
                t = t["items"] if isinstance(t, dict) and t.get("type") == "array" else t
                t = t.at(max(t.by_version)) if isinstance(t, Versioned) else t
                if isinstance(t, Record) and t.name not in seen:
                    seen.add(t.name)
                    out += undocumented(t, seen)
        return out

    seen: set[str] = set()
    assert [name for r in RECORDS for name in undocumented(r, seen)] == []
