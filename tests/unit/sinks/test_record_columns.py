"""A table's columns made from its record's field list: the trace analyses' table is the
``TraceAnalysis`` record, field by field, in ClickHouse as in the schema."""

from __future__ import annotations

from schemas.fields import TIMESTAMP_MS, Enum, Field, Record, array, optional
from schemas.records.trace_analysis import TRACE_ANALYSIS
from schemas.records.trace_end import PROFILE_SYSTEM_CONTEXT
from sinks.ddl_traces import TRACE_ANALYSES_TABLE, TRACE_ANALYSIS_COLUMNS
from sinks.record_columns import added, column_type, columns, first
from sinks.write_clickhouse import ClickHouseWriter


def test_avro_types_as_clickhouse_types():
    part = Record("Part", fields=(Field("kind", "string"), Field("n", "long"), Field("x", optional("double"))))
    storage = {"kind": "LowCardinality(String)", "n": "UInt64"}
    assert column_type("string", "a", {}, 1) == "String"
    assert column_type(optional("string"), "kind", storage, 1) == "LowCardinality(Nullable(String))"
    assert column_type(optional("long"), "n", storage, 1) == "Nullable(UInt64)"
    assert column_type(TIMESTAMP_MS, "at", {}, 1) == "DateTime64(3, 'UTC')"
    assert column_type(array("double"), "xs", {}, 1) == "Array(Float64)"
    assert column_type(Enum("E", ("A", "B")), "e", {}, 1) == "LowCardinality(String)"
    assert column_type(array(part), "parts", storage, 1) == \
        "Array(Tuple(kind LowCardinality(String), n UInt64, x Nullable(Float64)))"


def test_a_field_of_a_new_version_is_a_column_added_to_older_tables():
    inner = Record("Inner", fields=(Field("a", "int"), Field("b", "int")))
    r = Record("R", versions={1: "one", 2: "two", 3: "three"}, fields=(
        Field("id", "string"), Field("late", "long", since=3, default=0),
        Field("more", optional(inner), since=2, default=None), Field("end", "boolean")))
    cols = columns(r, flat=("more",))
    assert [(c.name, c.since) for c in cols] == [("id", 1), ("late", 3), ("more_a", 2), ("more_b", 2), ("end", 1)]
    assert added(cols) == (("more_a", "Nullable(Int32)"), ("more_b", "Nullable(Int32)"), ("late", "Int64"))


def test_the_trace_analyses_table_is_the_record(chdb_client, database):
    """Every field of the newest ``TraceAnalysis`` a column of its name (what the host saw flat),
    every nested list a tuple of its record's fields in their order, as ClickHouse reports them."""
    writer = ClickHouseWriter(chdb_client, database)
    writer.ensure_tables()
    got = chdb_client.query(f"SELECT name, type FROM system.columns WHERE database = '{database}' AND "
                            "table = 'trace_analyses' ORDER BY position").result_rows
    stored = [(n, t) for n, t in got if not n.startswith("kafka_")]
    assert sorted(stored) == sorted((c.name, c.type) for c in TRACE_ANALYSIS_COLUMNS)
    # in the order a table made by the first version and then given each later one's has them
    assert [n for n, _ in stored] == [c.name for c in first(TRACE_ANALYSIS_COLUMNS)] + \
        [n for n, _ in added(TRACE_ANALYSIS_COLUMNS)]
    assert {c.name for c in TRACE_ANALYSIS_COLUMNS} - {f"system_{f.name}" for f in PROFILE_SYSTEM_CONTEXT.fields} == \
        {f.name for f in TRACE_ANALYSIS.fields} - {"system"}
    assert set(TRACE_ANALYSES_TABLE.columns) == {c.name for c in TRACE_ANALYSIS_COLUMNS}
