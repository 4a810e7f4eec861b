"""The registry's answers, as the Confluent Schema Registry words them (clients read the error
codes), from the schemas gpufleet ships and nothing else."""

from __future__ import annotations

import json

import pytest

from schemas.codec import Codec, load_catalog
from schemas.registry import SchemaRegistry
from schemas.topics import ALERTS, ALL_TOPICS, GPU_SAMPLES


@pytest.fixture(scope="module")
def registry():
    return SchemaRegistry("site.")


def test_every_schema_id_of_the_catalog_is_served_as_shipped(registry):
    for entry in load_catalog():
        status, body = registry.answer("GET", f"/schemas/ids/{entry.id}")
        assert status == 200 and json.loads(body["schema"])["name"] == entry.name


def test_each_topic_has_a_value_subject_with_its_record_types_versions(registry):
    codec = Codec()
    for spec in ALL_TOPICS:
        subject = f"site.{spec.name}-value"
        status, versions = registry.answer("GET", f"/subjects/{subject}/versions")
        assert status == 200 and versions == list(range(1, len(versions) + 1))
        status, latest = registry.answer("GET", f"/subjects/{subject}/versions/latest")
        assert latest["id"] == codec.schema_id(spec.schema) and latest["version"] == versions[-1]
    # A record type that shares its topic with another has a subject of its own name.
    status, body = registry.answer("GET", "/subjects/gpufleet.GpuSampleColumns/versions/latest")
    assert status == 200 and body["id"] == codec.schema_id("GpuSampleColumns")
    status, uses = registry.answer("GET", f"/schemas/ids/{codec.schema_id('Alert')}/versions")
    newest = max(e.version for e in load_catalog() if e.name == "Alert")  # (the alerts topic's only record)
    assert {"subject": f"site.{ALERTS.name}-value", "version": newest} in uses


@pytest.mark.parametrize("path, status, code", [
    ("/schemas/ids/99999", 404, 40403),
    ("/schemas/ids/not-a-number", 404, 40403),
    ("/schemas/ids/99999999999999999999", 404, 40403),
    ("/subjects/nope-value/versions", 404, 40401),
    (f"/subjects/{GPU_SAMPLES.name}-value/versions/99", 404, 40401),  # no prefix: not this site's subject
    (f"/subjects/site.{GPU_SAMPLES.name}-value/versions/99", 404, 40402),
    (f"/subjects/site.{GPU_SAMPLES.name}-value/versions/first", 422, 42202),
    ("/no/such/path", 404, 40400),
])
def test_what_is_not_there_gets_the_registrys_error_code(registry, path, status, code):
    got, body = registry.answer("GET", path)
    assert (got, body["error_code"]) == (status, code) and body["message"]


def test_a_serializer_may_look_up_and_register_only_the_schemas_shipped(registry):
    subject = f"site.{ALERTS.name}-value"
    _, v2 = registry.answer("GET", f"/subjects/{subject}/versions/2")
    reformatted = json.dumps(json.loads(v2["schema"]), indent=2)  # the same schema, written otherwise
    status, found = registry.answer("POST", f"/subjects/{subject}", json.dumps({"schema": reformatted}).encode())
    assert status == 200 and (found["id"], found["version"]) == (v2["id"], 2)
    status, registered = registry.answer("POST", f"/subjects/{subject}/versions",
                                         json.dumps({"schema": reformatted}).encode())
    assert status == 200 and registered == {"id": v2["id"]}
    other = json.dumps({"schema": json.dumps({"type": "record", "name": "Alert", "fields": []})}).encode()
    assert registry.answer("POST", f"/subjects/{subject}", other)[1]["error_code"] == 40403
    assert registry.answer("POST", f"/subjects/{subject}/versions", other)[1]["error_code"] == 42205
    assert registry.answer("POST", f"/subjects/{subject}/versions", b"{not json")[1]["error_code"] == 42201
    assert registry.answer("DELETE", f"/subjects/{subject}")[0] == 405
    assert registry.answer("GET", "/mode") == (200, {"mode": "READONLY"})
