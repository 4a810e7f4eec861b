"""The writer against the real embedded ClickHouse engine (chdb), one database per test."""

import pytest

from schemas.codec import Codec
from schemas.sample_columns import columns_of, rows_of
from sinks.clickhouse_client import is_transient
from sinks.clickhouse_ddl import (
    ALERTS_TABLE,
    GPU_SAMPLES_TABLE,
    TABLES,
    TRACE_ANALYSES_TABLE,
    WORKFLOW_WINDOWS_TABLE,
)
from sinks.write_clickhouse import (
    Block,
    ClickHouseWriter,
    Position,
    Row,
    deduplication_token,
    offsets_query,
    table_for_topic,
)
from tests.support.samples import BASE_MS, sample, window


@pytest.fixture
def writer(chdb_client, database) -> ClickHouseWriter:
    w = ClickHouseWriter(chdb_client, database)
    w.ensure_tables()
    return w


def count(writer, table, final=False):
    return writer.client.query(
        f"SELECT count() FROM {writer.database}.{table.name}{' FINAL' if final else ''}"
    ).result_rows[0][0]


def test_tables_are_created_idempotently(writer):
    writer.ensure_tables()  # second time: no error, nothing changes
    names = {r[0] for r in writer.client.query(f"SHOW TABLES FROM {writer.database}").result_rows}
    derived = {"workflows", "workflows_mv", "gpu_hours_hourly", "gpu_hours_hourly_mv", "gpu_hours_daily",
               "gpu_hours_daily_mv", "judged_windows", "waste", "goodput_hourly", "goodput_daily", "capacity_hourly",
               "capacity_daily", "schema_migrations",
               "alert_transitions", "alert_transitions_mv", "gpu_minutes", "gpu_minutes_mv"}
    applied = writer.client.query(
        f"SELECT version FROM {writer.database}.schema_migrations FINAL ORDER BY version"
    ).result_rows
    assert applied == [(1,), (2,), (3,), (4,)]  # once each, though ensure_tables ran twice
    assert names == {t.name for t in TABLES} | derived


def test_samples_land_with_their_kafka_positions_and_resume_after_them(writer):
    rows = [Row(p, 100 + i, sample(event_time=BASE_MS + i * 1000), "a.samples", "id-1")
            for i, p in enumerate([0, 1, 1, 3])]
    assert writer.insert(GPU_SAMPLES_TABLE, rows) == []
    assert count(writer, GPU_SAMPLES_TABLE) == 4
    assert writer.resume_offsets(GPU_SAMPLES_TABLE, ["a.samples"]) == {
        Position("a.samples", "id-1", 0): 101, Position("a.samples", "id-1", 1): 103,
        Position("a.samples", "id-1", 3): 104}
    got = writer.client.query(
        f"SELECT toUnixTimestamp64Milli(event_time), utilization_pct, memory_total_bytes "
        f"FROM {writer.database}.gpu_samples ORDER BY event_time LIMIT 1"
    ).result_rows[0]
    assert got == (BASE_MS, 50.0, 80 * 1024**3)


def test_a_database_of_the_previous_release_is_migrated(chdb_client, database):
    """workflows and its view as they were before WorkflowEvent v2: the migration adds model
    and cluster, replaces the view, and the new fields flow through."""
    from sinks.clickhouse_ddl import WORKFLOW_EVENTS_TABLE

    db = database
    chdb_client.command(f"CREATE DATABASE {db}")
    chdb_client.command(WORKFLOW_EVENTS_TABLE.ddl.format(db=db, name="workflow_events"))
    chdb_client.command(f"""CREATE TABLE {db}.workflows (workflow_id LowCardinality(String),
        event LowCardinality(String), event_time DateTime64(3, 'UTC'), host LowCardinality(String),
        owner LowCardinality(Nullable(String)),
        team LowCardinality(Nullable(String)), cmdline Nullable(String), framework LowCardinality(Nullable(String)),
        framework_version LowCardinality(Nullable(String)), scheduler_job_id Nullable(String))
        ENGINE = ReplacingMergeTree(event_time) ORDER BY workflow_id""")
    chdb_client.command(f"""CREATE MATERIALIZED VIEW {db}.workflows_mv TO {db}.workflows AS
        SELECT workflow_id, event, event_time, host, owner, team, cmdline, framework, framework_version,
        scheduler_job_id FROM {db}.workflow_events""")
    writer = ClickHouseWriter(chdb_client, db)
    writer.ensure_tables()
    event = {"workflow_id": "wf-a", "event": "STARTED", "event_time": BASE_MS, "host": "h1", "owner": "ana",
             "team": "nlp", "gpu_uuids": ["GPU-0"], "pids": [1], "cmdline": "python train.py", "framework": "pytorch",
             "framework_version": "2.5", "scheduler_job_id": None, "attribution": "env", "model": "llama-8b",
             "cluster": "east", "service": "sd-xl"}
    assert writer.insert(WORKFLOW_EVENTS_TABLE, [Row(0, 0, event)]) == []
    assert chdb_client.query(f"SELECT model, cluster FROM {db}.workflows").result_rows == [("llama-8b", "east")]
    assert chdb_client.query(f"SELECT service FROM {db}.workflow_events").result_rows == [("sd-xl",)]  # (v6)
    assert chdb_client.query(f"SELECT version FROM {db}.schema_migrations ORDER BY version").result_rows == [
        (1,), (2,), (3,), (4,)]


def test_the_alerts_of_the_previous_release_join_the_transitions(chdb_client, database):
    """Before alert_transitions, alerts kept each episode's latest transition only: migration 3
    copies those, and every later transition comes through the view."""
    from sinks.clickhouse_ddl import ALERTS_TABLE
    from tests.support.alerts import alert

    chdb_client.command(f"CREATE DATABASE {database}")
    chdb_client.command(ALERTS_TABLE.ddl.format(db=database, name="alerts"))
    old = {**alert("a1", "FIRING", True, "nlp", "ana"), "window_end": BASE_MS}
    chdb_client.insert(f"{database}.alerts", [[old[c] if c != "findings" else [] for c in ALERTS_TABLE.columns[:17]]
                                              + [0, 0]], column_names=[*ALERTS_TABLE.columns[:17], "kafka_partition",
                                                                       "kafka_offset"])
    writer = ClickHouseWriter(chdb_client, database)
    writer.ensure_tables()
    later = {**old, "status": "RESOLVED", "window_end": BASE_MS + 60_000}
    assert writer.insert(ALERTS_TABLE, [Row(0, 1, later)]) == []
    rows = chdb_client.query(f"SELECT status FROM {database}.alert_transitions FINAL ORDER BY window_end").result_rows
    assert rows == [("FIRING",), ("RESOLVED",)]


def test_windows_of_the_previous_release_move_to_the_versioned_table(chdb_client, database):
    """workflow_windows as it was before WorkflowWindow v4 (no version, the last insert wins):
    migration 2 keeps its rows as version 1, and from then on the highest version wins."""
    db = database
    chdb_client.command(f"CREATE DATABASE {db}")
    old_ddl = (WORKFLOW_WINDOWS_TABLE.ddl.replace("ReplacingMergeTree(version)", "ReplacingMergeTree")
               .replace(",\n        version UInt32 DEFAULT 1", ""))
    assert "version UInt32" not in old_ddl and "(version)" not in old_ddl
    chdb_client.command(old_ddl.format(db=db, name="workflow_windows"))
    for column, typ in WORKFLOW_WINDOWS_TABLE.added_columns:
        if column != "version":
            chdb_client.command(f"ALTER TABLE {db}.workflow_windows ADD COLUMN {column} {typ}")
    old = window()
    old_columns = [c for c in WORKFLOW_WINDOWS_TABLE.columns if c != "version"]
    chdb_client.insert("workflow_windows", [[old.get(c) for c in old_columns] + [0, 5]],
                       column_names=[*old_columns, "kafka_partition", "kafka_offset"], database=db)
    writer = ClickHouseWriter(chdb_client, db)
    writer.ensure_tables()
    engine = chdb_client.query(f"SELECT engine_full FROM system.tables WHERE database = '{db}' "
                               "AND name = 'workflow_windows'").result_rows[0][0]
    assert engine.startswith("ReplacingMergeTree(version)")
    rows = f"SELECT version, gpu_seconds FROM {db}.workflow_windows FINAL"
    assert chdb_client.query(rows).result_rows == [(1, old["gpu_seconds"])]
    # A late-completed version, then a replay of the first emission: the complete one stays.
    assert writer.insert(WORKFLOW_WINDOWS_TABLE, [Row(0, 6, {**old, "version": 2, "gpu_seconds": 240.0})]) == []
    assert writer.insert(WORKFLOW_WINDOWS_TABLE, [Row(0, 7, {**old, "version": 1})]) == []
    assert chdb_client.query(rows).result_rows == [(2, 240.0)]


def test_a_batch_inserted_again_is_stored_once(writer):
    """As when the server stored a block but its answer was lost, and the insert is retried."""
    rows = [Row(p, 100 + i, sample(event_time=BASE_MS + i * 1000)) for i, p in enumerate([0, 1, 1, 3])]
    assert writer.insert(GPU_SAMPLES_TABLE, rows) == []
    assert writer.insert(GPU_SAMPLES_TABLE, rows) == []
    assert count(writer, GPU_SAMPLES_TABLE) == 4
    # The same samples at other offsets are another batch: the token is the Kafka position.
    assert writer.insert(GPU_SAMPLES_TABLE, [Row(0, 200 + i, r.record) for i, r in enumerate(rows)]) == []
    assert count(writer, GPU_SAMPLES_TABLE) == 8


def test_profile_requests_and_statuses_are_stored(writer):
    from sinks.clickhouse_ddl import PROFILE_REQUESTS_TABLE, PROFILE_STATUSES_TABLE

    req = {"request_id": "od-1", "workflow_id": "wf-a", "hosts": ["h1"], "ranks": [], "duration_ms": None, "steps": 5,
           "reason": "ON_DEMAND", "requester": "ana", "requested_at": BASE_MS, "deadline_ms": BASE_MS + 60_000}
    status = {"request_id": "od-1", "workflow_id": "wf-a", "host": "h1", "rank": 0, "pid": 42, "reason": None,
              "trace_id": None, "at": BASE_MS}
    assert writer.insert(PROFILE_REQUESTS_TABLE, [Row(0, 0, req)]) == []
    assert writer.insert(PROFILE_STATUSES_TABLE, [Row(0, 0, {**status, "state": "ACCEPTED"}),
                                                  Row(0, 1, {**status, "state": "FAILED", "reason": "exited"})]) == []
    rows = writer.client.query(
        f"SELECT r.requester, groupArray(s.state) FROM {writer.database}.profile_requests AS r "
        f"JOIN {writer.database}.profile_statuses AS s ON s.request_id = r.request_id GROUP BY r.requester").result_rows
    assert rows == [("ana", ["ACCEPTED", "FAILED"])]


def test_deduplication_tokens_name_the_topic_and_offset_ranges():
    rows = [Row(1, 7, {}, "p.s", "id"), Row(0, 3, {}, "p.s", "id"), Row(1, 5, {}, "p.s", "id")]
    assert deduplication_token(GPU_SAMPLES_TABLE, rows) == "gpu_samples/p.s#id[0]:3-3x1,p.s#id[1]:5-7x2"


def test_rows_of_other_topics_at_the_same_offsets_are_stored_and_resumed_apart(writer):
    """Two topic prefixes, and a topic created again under its name (a new id), in one
    database: the same offsets in each are different rows, and each resumes after its own."""
    def rows(topic, topic_id, n, first=0):
        return [Row(0, first + i, sample(event_time=BASE_MS + i * 1000, gpu_uuid=f"{topic}{topic_id}"), topic,
                    topic_id) for i in range(n)]
    assert writer.insert(GPU_SAMPLES_TABLE, rows("a.samples", "id-1", 40)) == []
    assert writer.insert(GPU_SAMPLES_TABLE, rows("b.samples", "id-2", 10)) == []
    assert writer.insert(GPU_SAMPLES_TABLE, rows("a.samples", "id-3", 10)) == []
    assert count(writer, GPU_SAMPLES_TABLE) == 60
    assert writer.resume_offsets(GPU_SAMPLES_TABLE, ["b.samples"]) == {Position("b.samples", "id-2", 0): 10}
    assert writer.resume_offsets(GPU_SAMPLES_TABLE, ["a.samples", "b.samples"]) == {
        Position("a.samples", "id-1", 0): 40, Position("b.samples", "id-2", 0): 10,
        Position("a.samples", "id-3", 0): 10}


def test_resuming_reads_the_offsets_projection_not_the_rows(writer):
    assert writer.insert(GPU_SAMPLES_TABLE, [Row(0, 0, sample(), "a.samples", "id-1")]) == []
    plan = "\n".join(r[0] for r in writer.client.query(
        "EXPLAIN " + offsets_query(writer.database, GPU_SAMPLES_TABLE), parameters={"topics": ["a.samples"]},
    ).result_rows)
    assert "ReadFromMergeTree (kafka_offsets)" in plan, plan


def test_blocks_of_samples_are_stored_as_the_same_rows_would_be(writer, chdb_client, request):
    """The sink inserts GpuSampleColumns blocks column by column: the table holds exactly what
    inserting their samples one record each would have stored, Kafka positions included."""
    samples = [sample(host=h, gpu_index=g, event_time=BASE_MS + t * 1000, **extra)
               for t in range(3) for h in ("h1", "h2") for g in range(2)
               for extra in ([{"sm_active_pct": 40.0, "xids": [79]}] if h == "h2" else [{}])]
    codec = Codec()
    decoded = [codec.decode(codec.encode("GpuSampleColumns", b))[1] for b in columns_of(samples, per_tick=False)]
    assert len(decoded) == 2 and decoded[0]["sm_active_pct"] is None  # h1 reports fewer fields
    by_rows = ClickHouseWriter(chdb_client, writer.database + "_rows")
    by_rows.ensure_tables()
    request.addfinalizer(lambda: chdb_client.command(f"DROP DATABASE {by_rows.database}"))
    assert by_rows.insert(GPU_SAMPLES_TABLE, [Row(5, 70 + i, s, "t", "id") for i, b in enumerate(decoded)
                                              for s in rows_of(b)]) == []
    assert writer.insert(GPU_SAMPLES_TABLE, [Block(5, 70 + i, b, "t", "id") for i, b in enumerate(decoded)]) == []

    def stored(w):
        return w.client.query(f"SELECT * EXCEPT ingested_at FROM {w.database}.gpu_samples "
                              "ORDER BY host, gpu_index, event_time").result_rows

    assert stored(writer) == stored(by_rows)
    assert len(stored(writer)) == 12
    assert writer.resume_offsets(GPU_SAMPLES_TABLE, ["t"]) == {Position("t", "id", 5): 72}


def test_a_refused_block_is_returned_whole_and_the_others_land(writer):
    blocks = [Block(0, i, b) for i, b in enumerate(columns_of([sample(event_time=BASE_MS + i) for i in range(4)]))]
    blocks[2].columns["memory_used_bytes"] = [-1]  # cannot be a UInt64
    rejected = writer.insert(GPU_SAMPLES_TABLE, blocks)
    assert [r.row.offset for r in rejected] == [2]
    assert count(writer, GPU_SAMPLES_TABLE) == 3


def test_a_window_emitted_twice_is_one_row(writer):
    w = window()
    assert writer.insert(WORKFLOW_WINDOWS_TABLE, [Row(0, 1, w)]) == []
    assert writer.insert(WORKFLOW_WINDOWS_TABLE, [Row(0, 9, {**w, "closed_at": w["closed_at"] + 5})]) == []
    assert count(writer, WORKFLOW_WINDOWS_TABLE, final=True) == 1


def test_bad_rows_are_isolated_and_the_rest_lands(writer):
    rows = [Row(0, i, sample(event_time=BASE_MS + i)) for i in range(9)]
    rows[4] = Row(0, 4, sample(memory_used_bytes=-1))  # cannot be a UInt64
    rejected = writer.insert(GPU_SAMPLES_TABLE, rows)
    assert [r.row.offset for r in rejected] == [4]
    assert rejected[0].reason
    assert count(writer, GPU_SAMPLES_TABLE) == 8


def test_server_errors_are_classified_by_the_code_the_exception_carries(chdb_client):
    from clickhouse_connect.driver.exceptions import DatabaseError

    assert is_transient(DatabaseError("Memory limit exceeded", code=241))
    assert not is_transient(DatabaseError("Cannot parse input", code=27))
    # What a message says is not a code: the exception's own code decides.
    assert not is_transient(DatabaseError("Code: 241. a value that quotes another error", code=27))
    with pytest.raises(DatabaseError) as raised:
        chdb_client.query("SELECT * FROM nope.t")  # the embedded engine's errors carry theirs too
    assert raised.value.code == 81 and not is_transient(raised.value)


def test_table_columns_match_the_schema(writer):
    """Every field of a topic's newest schema is a column; a nested optional record (the trace
    analysis's system context) is flattened into ``field_subfield`` columns."""
    import json

    from schemas.codec import SCHEMA_DIR, load_catalog

    def columns(field: dict) -> list[str]:
        nested = [t for t in (field["type"] if isinstance(field["type"], list) else [field["type"]])
                  if isinstance(t, dict) and t.get("type") == "record"]
        if nested:
            return [f"{field['name']}_{sub['name']}" for sub in nested[0]["fields"]]
        return [field["name"]]

    for table in TABLES:
        version = max((v for v in load_catalog() if v.name == table.topic.schema), key=lambda v: v.version)
        fields = [c for f in json.loads((SCHEMA_DIR / version.file).read_text())["fields"] for c in columns(f)]
        assert list(table.columns) == fields, table.name


def tuple_names(clickhouse_type: str) -> tuple[str, ...]:
    """The element names of ``Array(Tuple(a T, b Nullable(U), ...))``."""
    inner, depth, names, part = clickhouse_type.removeprefix("Array(Tuple(")[:-2], 0, [], ""
    for ch in inner + ",":
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            names.append(part.split()[0])
            part = ""
        else:
            part += ch
    return tuple(names)


def test_a_trace_analysis_nested_lists_are_stored_in_their_schemas_order(writer):
    """The sink stores each nested list as tuples in the schema's field order (``NESTED``, read
    from the .avsc); ClickHouse names the tuple's elements as the DDL types them. The two must
    agree, element by element, or values land under another field's name."""
    from sinks.ddl_traces import NESTED

    types = dict(writer.client.query(
        f"SELECT name, type FROM system.columns WHERE database = '{writer.database}' AND table = 'trace_analyses'"
    ).result_rows)
    assert len(NESTED) == 9
    for name, fields in NESTED.items():
        assert tuple_names(types[name]) == fields, name


def test_topics_map_to_tables():
    assert table_for_topic("x.gpufleet.alerts.v1", prefix="x.") is ALERTS_TABLE
    with pytest.raises(KeyError):
        table_for_topic("gpufleet.nope")


def test_trace_analysis_rows_keep_idle_time_per_stream(writer, tmp_path):
    from gpufleet.analyze import analyze_file
    from tests.support.traces import kernel, runtime, write_trace

    path = write_trace(tmp_path / "t.json", [
        runtime("cudaLaunchKernel", 0, 1, corr=1), kernel("k1", 0, 10, corr=1),
        runtime("cudaLaunchKernel", 12, 1, corr=2), kernel("k2", 15, 5, corr=2),
    ])
    record = analyze_file(path, workflow_id="wf")
    assert writer.insert(TRACE_ANALYSES_TABLE, [Row(0, 0, record)]) == []
    got = writer.client.query(
        f"SELECT trace_id, idle_by_stream, kernel_time_us FROM {writer.database}.trace_analyses").result_rows
    assert got == [
        (record["trace_id"], [{"stream": 7, "host_wait_us": 5.0, "kernel_wait_us": 0.0, "other_us": 0.0}], 20.0)
    ]
    # The kernel breakdown: the array of top kernels can be unfolded in SQL.
    got = writer.client.query(
        f"SELECT k.name, k.launches, k.time_us FROM {writer.database}.trace_analyses "
        f"ARRAY JOIN top_kernels AS k ORDER BY k.time_us DESC").result_rows
    assert got == [("k1", 1, 10.0), ("k2", 1, 5.0)]
    got = writer.client.query(
        f"SELECT kernel_types.kernel_type, kernel_types.time_us FROM {writer.database}.trace_analyses").result_rows
    assert got == [(["COMPUTATION"], [15.0])]
    # A requested profile's analysis also keeps what the host agent saw meanwhile, one column each.
    system = {"ticks": 40, "span_ms": 4000, "interval_ms_mean": 100.0, "gpus": 2, "gpu_utilization_mean_pct": 12.5,
              "gpu_zero_utilization_share": 0.5, "sm_active_mean_pct": None, "power_mean_watts": 95.0,
              "memory_peak_fraction": 0.25, "workflow_cpu_mean_pct": 180.0, "host_cpu_mean_pct": 97.0,
              "host_iowait_mean_pct": 0.5}
    profiled = {**record, "trace_id": "profile/od-1/h1/rank0", "system": system}
    assert writer.insert(TRACE_ANALYSES_TABLE, [Row(0, 1, profiled)]) == []
    got = writer.client.query(
        f"SELECT system_ticks, system_gpu_utilization_mean_pct, system_sm_active_mean_pct, system_host_cpu_mean_pct "
        f"FROM {writer.database}.trace_analyses ORDER BY trace_id").result_rows
    assert sorted(got, key=str) == sorted([(None, None, None, None), (40, 12.5, None, 97.0)], key=str)


def test_trace_analysis_rows_keep_memory_copies_per_kind(writer, tmp_path):
    from gpufleet.analyze import analyze_file
    from tests.support.traces import synthetic_job_trace

    record = analyze_file(synthetic_job_trace(tmp_path / "t.json"), workflow_id="wf")
    assert writer.insert(TRACE_ANALYSES_TABLE, [Row(0, 0, record)]) == []
    got = writer.client.query(
        f"SELECT m.kind, m.copies, m.bytes, m.bw_samples, m.bw_max_gbps FROM {writer.database}.trace_analyses "
        f"ARRAY JOIN memory_copies AS m ORDER BY m.kind").result_rows
    assert got == [(m["kind"], m["copies"], m["bytes"], m["bw_samples"], m["bw_max_gbps"])
                   for m in sorted(record["memory_copies"], key=lambda m: m["kind"])]
    assert {row[0] for row in got} == {"Memcpy DtoH", "Memcpy HtoD", "Memset"}


def test_a_dsn_is_shown_without_its_password():
    from sinks.clickhouse_client import redact_dsn

    assert redact_dsn("https://sink:hunter2@ch.example.com:8443/gpufleet") == "https://sink:***@ch.example.com:8443/gpufleet"
    assert redact_dsn("http://ch:8123") == "http://ch:8123"
    assert redact_dsn("chdb:///data/clickhouse") == "chdb:///data/clickhouse"


def test_the_password_comes_from_the_environment_or_a_file(tmp_path):
    from sinks.clickhouse_client import dsn_password

    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    assert dsn_password({"GPUFLEET_CLICKHOUSE_PASSWORD": "from-env"}) == "from-env"
    assert dsn_password({"GPUFLEET_CLICKHOUSE_PASSWORD_FILE": str(secret), "GPUFLEET_CLICKHOUSE_PASSWORD": "x"}) \
        == "from-file"
    assert dsn_password({}) is None
