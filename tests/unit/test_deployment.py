"""The Docker deployment, checked without a Docker engine: the compose file parses, every
gpufleet service runs a command our CLI accepts, the image installs what the services
import, and every query of the provisioned Grafana dashboard runs on our DDL and data."""

import json
import re
from pathlib import Path

import pytest
import yaml

from gpufleet.cli import build_parser
from sinks.write_clickhouse import ClickHouseWriter
from tests.unit.sinks.fleet_data import build, store

DOCKER = Path(__file__).resolve().parents[2] / "docker"


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def gpufleet_services(compose):
    return {name: s for name, s in compose["services"].items() if s.get("image") == "gpufleet:latest"}


def test_services_run_commands_the_cli_accepts(compose):
    services = gpufleet_services(compose)
    assert set(services) == {"worker", "sink", "notifier", "agent"}
    entrypoint = re.search(r'ENTRYPOINT \[(.*)\]', (DOCKER / "Dockerfile").read_text()).group(1)
    prefix = json.loads(f"[{entrypoint}]")
    assert prefix[0] == "gpufleet"
    parser = build_parser()
    for name, service in services.items():
        args = parser.parse_args(prefix[1:] + service["command"])  # exits (SystemExit) on any unknown option
        assert args.func.__name__ == f"cmd_{service['command'][0]}", name
        for mounted in service.get("volumes", []):
            source = mounted.split(":")[0]
            if source.startswith("./"):
                assert (DOCKER / source).exists(), f"{name} mounts {source}, which is not in docker/"
    for option in ("--thresholds", "--routing"):
        for service in services.values():
            if option in service["command"]:
                path = service["command"][service["command"].index(option) + 1]
                assert (DOCKER / "config" / Path(path).name).exists(), path


def test_services_reach_kafka_and_clickhouse_by_their_service_names(compose):
    env = compose["x-gpufleet"]["environment"]
    brokers = [address.split(":")[0] for address in env["GPUFLEET_BOOTSTRAP"].split(",")]
    assert brokers == ["kafka-1", "kafka-2", "kafka-3"] and set(brokers) <= set(compose["services"])
    assert "@clickhouse:8123" in env["GPUFLEET_CLICKHOUSE_DSN"]
    for n, name in enumerate(brokers, 1):
        kafka = compose["services"][name]["environment"]
        assert kafka["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
        assert kafka["KAFKA_NODE_ID"] == n and f"PLAINTEXT://{name}:9092" in kafka["KAFKA_ADVERTISED_LISTENERS"]
        assert kafka["KAFKA_CONTROLLER_QUORUM_VOTERS"] == ",".join(f"{i}@{b}:9093" for i, b in enumerate(brokers, 1))
        assert (kafka["KAFKA_DEFAULT_REPLICATION_FACTOR"], kafka["KAFKA_MIN_INSYNC_REPLICAS"]) == (3, 2)
        assert kafka["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == 3
    for service in gpufleet_services(compose).values():
        assert set(brokers) <= set(service.get("depends_on", {})) or service.get("profiles") == ["gpu-host"]
    agent = compose["services"]["agent"]
    assert agent["network_mode"] == "host" and agent["pid"] == "host"
    assert agent["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"


def test_the_image_copies_every_package_the_cli_needs():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    pyproject = (DOCKER.parent / "pyproject.toml").read_text()
    packages = json.loads(re.search(r"packages = (\[.*\])", pyproject).group(1))
    for package in packages:
        assert f"COPY {package} {package}" in dockerfile


def test_grafana_provisions_the_clickhouse_datasource_the_dashboard_uses():
    source = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/clickhouse.yaml").read_text())
    (datasource,) = source["datasources"]
    dashboard = json.loads((DOCKER / "grafana/dashboards/gpufleet.json").read_text())
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {datasource["uid"]}
    assert datasource["jsonData"]["host"] == "clickhouse"
    provider = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/gpufleet.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def grafana_to_clickhouse(sql: str, database: str, start: str, end: str) -> str:
    """Expand the ClickHouse plugin's macros the way Grafana would for a [start, end] range."""
    sql = re.sub(r"\$__timeFilter\((\w+)\)",
                 rf"\1 >= toDateTime64('{start}', 3) AND \1 <= toDateTime64('{end}', 3)", sql)
    sql = re.sub(r"\$__timeInterval\((\w+)\)", r"toStartOfInterval(\1, INTERVAL 1 hour)", sql)
    assert "$" not in sql, sql
    return sql.replace("gpufleet.", f"{database}.")


def test_every_dashboard_query_runs_on_our_tables(chdb_client, database):
    data = build()
    store(ClickHouseWriter(chdb_client, database), data)
    dashboard = json.loads((DOCKER / "grafana/dashboards/gpufleet.json").read_text())
    queries = [t["rawSql"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(queries) >= 6
    answered = 0
    for sql in queries:
        rows = chdb_client.query(grafana_to_clickhouse(sql, database, "2000-01-01 00:00:00",
                                                       "2100-01-01 00:00:00")).result_rows
        answered += bool(rows)
    # Only the alert panels have nothing to show: this data set has no alerts.
    assert answered == len(queries) - 2
