"""Subscribers read gpufleet's topics with the standard Confluent tools, through
``gpufleet schemas serve``: confluent-kafka's own ``AvroDeserializer`` with a
``SchemaRegistryClient``, and the ClickHouse engine's ``AvroConfluent`` format. The records are
what a worker process emitted, and each tool reads the same values as gpufleet's codec."""

from __future__ import annotations

import dataclasses
import datetime as dt
import subprocess
import sys

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from gpufleet.schema_server import RegistryServer
from producers.publish_kafka import Publisher
from producers.simulate.fleet import HEALTHY, IDLE, build_fleet
from producers.simulate.run import SimulationPlan, run_simulation
from schemas.registry import SchemaRegistry
from schemas.topics import ALERTS, GPU_SAMPLES, WORKFLOW_WINDOWS
from tests.support.integration import CODEC, read_topic, wait_until, worker_process
from tests.support.samples import BASE_MS

WINDOWS = 3
TICKS = WINDOWS * 60 + 15  # the watermark (newest - 10 s) passes the third window's end


@pytest.fixture(scope="module")
def emitted(kafka, tmp_path_factory):
    """The windows and alerts a worker emitted for a small fleet with one idle job: the raw
    message values of each topic, and the topic prefix."""
    prefix = "registry."
    from kafka_client.admin import ensure_topics

    ensure_topics(kafka.bootstrap, prefix=prefix)
    fleet = build_fleet(seed=5, hosts=2, gpus_per_host=2, workflows=2)
    fleet = dataclasses.replace(fleet, workflows=tuple(
        dataclasses.replace(w, profile=p) for w, p in zip(fleet.workflows, (IDLE, HEALTHY))))
    plan = SimulationPlan(start_ms=BASE_MS, ticks=TICKS, interval_ms=1000, speed=0)
    run_simulation(fleet, plan, Publisher(kafka.bootstrap, CODEC), topic=prefix + GPU_SAMPLES.name)
    data = tmp_path_factory.mktemp("registry-worker")
    topics = {spec: prefix + spec.name for spec in (WORKFLOW_WINDOWS, ALERTS)}
    # A job idle from its start counts as starting for its first minute here (15 in production).
    with worker_process(kafka.bootstrap, prefix, data, f"{prefix}worker", "--detector-min-s", "60",
                        "--startup-max-s", "60"):
        values = {}
        for spec, topic in topics.items():
            want = len(fleet.workflows) * WINDOWS if spec is WORKFLOW_WINDOWS else 1
            def raw(topic=topic, spec=spec, want=want):
                got = [m[-1] for m in read_topic(kafka.bootstrap, topic, spec.partitions, decode=False)]
                return got if len(got) >= want else None

            values[spec] = wait_until(raw, 120, f"{want} records on {topic}")
    return prefix, values


@pytest.fixture(scope="module")
def registry(emitted):
    prefix, _ = emitted
    server = RegistryServer(SchemaRegistry(prefix), port=0).start()
    yield server.url
    server.stop()


def as_millis(record):
    """A Confluent deserializer gives timestamp-millis fields as datetimes; gpufleet's codec
    keeps epoch milliseconds."""
    if isinstance(record, dict):
        return {k: as_millis(v) for k, v in record.items()}
    if isinstance(record, list):
        return [as_millis(v) for v in record]
    if isinstance(record, dt.datetime):
        return round(record.timestamp() * 1000)
    return record


@pytest.mark.parametrize("spec", [WORKFLOW_WINDOWS, ALERTS], ids=lambda s: s.schema)
def test_confluent_kafkas_avro_deserializer_reads_gpufleets_topics(emitted, registry, spec):
    prefix, values = emitted
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": registry}))
    context = SerializationContext(prefix + spec.name, MessageField.VALUE)
    records = [deserialize(v, context) for v in values[spec]]
    assert records and [as_millis(r) for r in records] == [CODEC.decode(v)[1] for v in values[spec]]
    if spec is ALERTS:
        assert any(r["detector"] == "idle_allocated" for r in records)


def test_clickhouse_reads_gpufleets_messages_with_avro_confluent(emitted, registry, chdb_client, tmp_path):
    _, values = emitted
    windows = values[WORKFLOW_WINDOWS]
    batch = tmp_path / "windows.avro"
    batch.write_bytes(b"".join(windows))  # the messages one after another, as ClickHouse's Kafka engine reads them
    rows = chdb_client.query(
        f"SELECT workflow_id, toUnixTimestamp64Milli(window_start), version, gpu_seconds, idle_gpus, "
        f"sm_active_mean_pct FROM file('{batch}', 'AvroConfluent') "
        f"SETTINGS format_avro_schema_registry_url = '{registry}'").result_rows
    want = [CODEC.decode(v)[1] for v in windows]
    assert [tuple(r) for r in rows] == [(w["workflow_id"], w["window_start"], w["version"], w["gpu_seconds"],
                                         w["idle_gpus"], w["sm_active_mean_pct"]) for w in want]


def test_gpufleet_schemas_serve_answers_a_registry_client(tmp_path):
    """The command itself, as an operator starts it."""
    proc = subprocess.Popen([sys.executable, "-m", "gpufleet", "schemas", "serve", "--port", "0",
                             "--topic-prefix", "site."], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = line.split(" at ", 1)[1].split(":", 2)
        client = SchemaRegistryClient({"url": ":".join(url[:2]) + ":" + url[2].split(":")[0]})
        latest = client.get_latest_version("site." + ALERTS.name + "-value")
        assert latest.schema_id == CODEC.schema_id("Alert") and "Alert" in latest.schema.schema_str
        assert "site." + WORKFLOW_WINDOWS.name + "-value" in client.get_subjects()
    finally:
        proc.terminate()
        proc.wait(10)
