import io
import json
import shutil
import struct

import fastavro
import pytest

from schemas.codec import SCHEMA_DIR, Codec, CodecError, load_catalog
from schemas.topics import ALL_TOPICS
from tests.support.samples import sample, window


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec()


def test_every_topic_schema_is_in_the_catalog(codec):
    for spec in ALL_TOPICS:
        assert spec.schema in codec.names()


def test_round_trip_keeps_every_field(codec):
    s = sample(memory_used_bytes=None, power_watts=None)
    name, back = codec.decode(codec.encode("GpuSample", s))
    assert name == "GpuSample"
    assert {k: back[k] for k in s} == pytest.approx(s)  # floats travel as Avro float (32 bit)
    assert back["event_time"] == s["event_time"] and isinstance(back["event_time"], int)
    # Fields the record did not set take their defaults.
    assert back["share"] is None and back["xids"] == []


def test_wire_header_is_magic_zero_and_big_endian_schema_id(codec):
    data = codec.encode("WorkflowWindow", window())
    magic, schema_id = struct.unpack(">BI", data[:5])
    assert magic == 0
    ids = {v.name: v.id for v in load_catalog()}
    assert schema_id == ids["WorkflowWindow"] == codec.schema_id("WorkflowWindow")


@pytest.mark.parametrize(
    "data, reason",
    [
        (None, "null value"),
        (b"\x00\x00", "shorter than the 5-byte"),
        (b"\x07\x00\x00\x00\x01abc", "starts with byte 0x07, where the Confluent wire format has 0x00"),
        # A high first byte is named as sent (it was once read as signed: "-100").
        (b"\x9c\x00\x00\x00\x01abc", "starts with byte 0x9c,"),
        (b"\x00\x00\x00\x03\xe7abc", "unknown schema id 999"),
    ],
)
def test_malformed_messages_say_why(codec, data, reason):
    with pytest.raises(CodecError, match=reason):
        codec.decode(data)


def test_truncated_and_padded_payloads_are_rejected(codec):
    data = codec.encode("GpuSample", sample())
    with pytest.raises(CodecError, match="corrupt GpuSample v"):
        codec.decode(data[:-7])
    with pytest.raises(CodecError, match="trailing bytes"):
        codec.decode(data + b"\x00\x01")


def test_encoding_a_record_that_breaks_the_schema_fails_clearly(codec):
    bad = sample()
    bad["utilization_pct"] = "high"
    with pytest.raises(CodecError, match="cannot encode GpuSample"):
        codec.encode("GpuSample", bad)
    with pytest.raises(CodecError, match="unknown schema 'Nope'"):
        codec.encode("Nope", {})


def test_decode_many_splits_good_from_bad(codec):
    good = codec.encode("GpuSample", sample())
    ok, errors = codec.decode_many([good, b"junk!", good])
    assert [i for i, _, _ in ok] == [0, 2]
    assert [i for i, _ in errors] == [1]


def test_old_versions_decode_into_the_newest_reader_schema(tmp_path):
    """A next version of GpuSample (new id, new field with a default) still reads every older one."""
    for f in SCHEMA_DIR.glob("*.avsc"):
        shutil.copy(f, tmp_path)
    catalog = json.loads((SCHEMA_DIR / "catalog.json").read_text())
    versions = sorted((v for v in load_catalog() if v.name == "GpuSample"), key=lambda v: v.version)
    latest = versions[-1]
    nxt = json.loads((SCHEMA_DIR / latest.file).read_text())
    nxt["fields"].append({"name": "rack", "type": ["null", "string"], "default": None})
    (tmp_path / "gpu_sample.next.avsc").write_text(json.dumps(nxt))
    catalog["schemas"].append({"id": 99, "name": "GpuSample", "version": latest.version + 1,
                               "file": "gpu_sample.next.avsc"})
    (tmp_path / "catalog.json").write_text(json.dumps(catalog))

    old, new = Codec(), Codec(tmp_path)
    name, record = new.decode(old.encode("GpuSample", {**sample(), "share": 0.5}))
    assert name == "GpuSample" and record["rack"] is None and record["share"] == 0.5
    for v in versions:  # bytes written by every released version
        buf = io.BytesIO()
        buf.write(struct.pack(">bI", 0, v.id))
        fastavro.schemaless_writer(buf, v.parsed, sample())
        _, decoded = new.decode(buf.getvalue())
        assert decoded["rack"] is None and decoded["utilization_pct"] == 50.0 and decoded["xids"] == [], v.version
    assert new.schema_id("GpuSample") == 99
    assert struct.unpack(">bI", new.encode("GpuSample", {**sample(), "rack": "r1"})[:5])[1] == 99


def test_catalog_rejects_duplicate_ids(tmp_path):
    for f in SCHEMA_DIR.glob("*.avsc"):
        shutil.copy(f, tmp_path)
    catalog = json.loads((SCHEMA_DIR / "catalog.json").read_text())
    catalog["schemas"][1]["id"] = catalog["schemas"][0]["id"]
    (tmp_path / "catalog.json").write_text(json.dumps(catalog))
    with pytest.raises(CodecError, match="duplicate schema ids"):
        Codec(tmp_path)
