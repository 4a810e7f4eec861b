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
from tests.support.fleet_data import build, store

DOCKER = Path(__file__).resolve().parents[2] / "docker"
NO_KAFKA = {"schemas"}  # serves the schemas in the image: reaches no broker, holds no credentials


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def agent_compose():
    return yaml.safe_load((DOCKER / "agent.yaml").read_text())


def gpufleet_services(*composes):
    return {name: s for c in composes for name, s in c["services"].items() if s.get("image") == "gpufleet:latest"}


def test_services_run_commands_the_cli_accepts(compose, agent_compose):
    services = gpufleet_services(compose, agent_compose)
    assert set(services) == {"kafka-secrets", "kafka-grant", "worker", "sink", "notifier", "agent", "schemas",
                             "enforcer"}
    entrypoint = re.search(r'ENTRYPOINT \[(.*)\]', (DOCKER / "Dockerfile").read_text()).group(1)
    prefix = json.loads(f"[{entrypoint}]")
    assert prefix[0] == "gpufleet"
    parser = build_parser()
    for name, service in services.items():
        args = parser.parse_args(prefix[1:] + service["command"])  # exits (SystemExit) on any unknown option
        assert args.func.__name__ == f"cmd_{service['command'][0].replace('-', '_')}", name
        for mounted in service.get("volumes", []):
            source = mounted["source"] if isinstance(mounted, dict) else mounted.split(":")[0]
            if source.startswith("./"):
                assert (DOCKER / source).exists(), f"{name} mounts {source}, which is not in docker/"
    for option in ("--thresholds", "--routing", "--enforcement", "--policy"):
        for service in services.values():
            if option in service["command"]:
                path = service["command"][service["command"].index(option) + 1]
                assert (DOCKER / "config" / Path(path).name).exists(), path


def test_services_reach_kafka_and_clickhouse_by_their_service_names(compose, agent_compose):
    env = compose["x-gpufleet"]["environment"]
    brokers = [address.split(":")[0] for address in env["GPUFLEET_BOOTSTRAP"].split(",")]
    assert brokers == ["kafka-1", "kafka-2", "kafka-3"] and set(brokers) <= set(compose["services"])
    assert "@clickhouse:8123" in env["GPUFLEET_CLICKHOUSE_DSN"]
    for n, name in enumerate(brokers, 1):
        kafka = compose["services"][name]["environment"]
        assert kafka["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
        assert kafka["KAFKA_NODE_ID"] == n and f"CLIENT://{name}:9092" in kafka["KAFKA_ADVERTISED_LISTENERS"]
        assert kafka["KAFKA_SSL_KEYSTORE_LOCATION"] == f"/secrets/nodes/node-{n}.keystore.pem"
        assert kafka["KAFKA_CONTROLLER_QUORUM_VOTERS"] == ",".join(f"{i}@{b}:9093" for i, b in enumerate(brokers, 1))
        assert (kafka["KAFKA_DEFAULT_REPLICATION_FACTOR"], kafka["KAFKA_MIN_INSYNC_REPLICAS"]) == (3, 2)
        assert kafka["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == 3
    for name, service in gpufleet_services(compose).items():
        if name not in ("kafka-secrets", "kafka-grant", *NO_KAFKA):
            assert service.get("depends_on", {}).get("kafka-grant") == {"condition": "service_completed_successfully"}
    agent = agent_compose["services"]["agent"]
    assert agent["network_mode"] == "host" and agent["pid"] == "host"
    assert agent["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"


def as_properties(env: dict) -> dict:
    """The broker properties the apache/kafka image makes of KAFKA_* variables."""
    out = {}
    for key, value in env.items():
        if key.startswith("KAFKA_"):
            name = key[len("KAFKA_"):].lower().replace("___", "-").replace("__", "\0").replace("_", ".")
            out[name.replace("\0", "_")] = str(value).replace("$$", "$")
    return out


def test_the_compose_cluster_is_secured_as_the_tested_local_one(compose):
    """Kafka's security settings in compose.yaml are those of `gpufleet kafka start --secure`,
    which the integration tests run (there is no Docker engine where the tests run)."""
    from gpufleet.local.kafka_node_config import Node, listeners
    from gpufleet.local.kafka_security import LocalCredentials

    local = dict(line.split("=", 1) for line in listeners(
        Node(1, 0, 9092, 9093, Path("/n"), 9094), LocalCredentials(Path("/nonexistent"))))
    deployed = as_properties(compose["services"]["kafka-1"]["environment"])
    for key in ("controller.listener.names", "inter.broker.listener.name", "sasl.enabled.mechanisms",
                "listener.name.client.scram-sha-512.sasl.jaas.config", "ssl.keystore.type", "ssl.truststore.type",
                "ssl.client.auth", "listener.name.client.ssl.client.auth", "ssl.principal.mapping.rules",
                "authorizer.class.name", "allow.everyone.if.no.acl.found"):
        assert deployed[key] == local[key], key
    protocols = dict(p.split(":") for p in deployed["listener.security.protocol.map"].split(","))
    assert protocols == {**dict(p.split(":") for p in local["listener.security.protocol.map"].split(",")),
                         "EXTERNAL": "SASL_SSL"}  # and the agents' listener, secured as the components'
    assert deployed["listener.name.external.ssl.client.auth"] == "required"
    assert deployed["super.users"] == "User:admin;User:node-1;User:node-2;User:node-3"


def test_each_component_mounts_only_its_own_kafka_credentials(compose):
    from gpufleet.local.kafka_security import PRINCIPALS

    for name, service in gpufleet_services(compose).items():
        mounts = [v for v in service.get("volumes", []) if isinstance(v, dict) and v["source"] == "kafka-secrets"]
        if name == "kafka-secrets":
            continue  # makes them
        if name in NO_KAFKA:
            assert not mounts and "GPUFLEET_KAFKA_CONFIG" not in service.get("environment", {}), name
            continue
        folders = {v["volume"]["subpath"] for v in mounts if "volume" in v}
        principal = {"kafka-grant": "admin"}.get(name, name)
        assert folders == {f"clients/{principal}"} and principal in PRINCIPALS, name
        assert all(v["read_only"] for v in mounts), name
        whole = [v for v in mounts if "volume" not in v]
        assert not whole or name == "kafka-grant", f"{name} mounts every component's secrets"


def test_no_password_has_a_default():
    for path in (DOCKER / "compose.yaml", DOCKER / "agent.yaml"):
        text = path.read_text()
        assert not re.search(r"PASSWORD:-", text), path
        assert re.search(r"CLICKHOUSE_PASSWORD:\?", text) or path.name == "agent.yaml"


def test_the_image_copies_every_package_the_cli_needs():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    pyproject = (DOCKER.parent / "pyproject.toml").read_text()
    packages = json.loads(re.search(r"packages = (\[.*?\])", pyproject, re.DOTALL).group(1))
    for package in packages:  # a sub-package comes with its package's folder
        top = package.split(".")[0]
        assert f"COPY {top} {top}" in dockerfile


def dashboard_targets(datasource_type: str) -> list[dict]:
    dashboard = json.loads((DOCKER / "grafana/dashboards/gpufleet.json").read_text())
    return [t for p in dashboard["panels"] if p.get("datasource", {}).get("type") == datasource_type
            for t in p["targets"]]


def test_grafana_provisions_the_datasources_the_dashboard_uses(compose):
    sources = [d for f in sorted((DOCKER / "grafana/provisioning/datasources").glob("*.yaml"))
               for d in yaml.safe_load(f.read_text())["datasources"]]
    by_type = {d["type"]: d for d in sources}
    dashboard = json.loads((DOCKER / "grafana/dashboards/gpufleet.json").read_text())
    used = {(p["datasource"]["type"], p["datasource"]["uid"]) for p in dashboard["panels"] if p["type"] != "row"}
    assert used == {(t, d["uid"]) for t, d in by_type.items()}
    assert by_type["grafana-clickhouse-datasource"]["jsonData"]["host"] == "clickhouse"
    assert by_type["prometheus"]["url"] == "http://prometheus:9090" and "prometheus" in compose["services"]
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
    queries = [t["rawSql"] for t in dashboard_targets("grafana-clickhouse-datasource")]
    assert len(queries) >= 6
    answered = 0
    for sql in queries:
        rows = chdb_client.query(grafana_to_clickhouse(sql, database, "2000-01-01 00:00:00",
                                                       "2100-01-01 00:00:00")).result_rows
        answered += bool(rows)
    # Only the alert panels have nothing to show: this data set has no alerts.
    assert answered == len(queries) - 2


def exposed_metrics() -> dict[str, set[str]]:
    """Every series name gpufleet's components serve, with its label names (and the labels
    Prometheus adds: job, instance, and le on histogram buckets)."""
    from producers.agent.metrics import GPU_READINGS, LABELS, AgentMetrics
    from sinks.consume_alerts import METRICS as NOTIFIER
    from sinks.consume_to_clickhouse import METRICS as SINK
    from streams import topology  # noqa: F401 -- every stage's metrics registered in the worker's registry
    from streams.stages.io import METRICS as WORKER

    added = {"job", "instance", "cluster"}
    out: dict[str, set[str]] = {}
    for registry in (WORKER.registry, SINK.registry, NOTIFIER.registry):
        for name, collector in registry._names_to_collectors.items():
            out.setdefault(name, set()).update(added, getattr(collector, "_labelnames", ()),
                                               {"le"} if name.endswith("_bucket") else ())
    agent = AgentMetrics(spool=None)
    for name, collector in agent.registry._names_to_collectors.items():
        out.setdefault(name, set()).update(added, {"le"} if name.endswith("_bucket") else ())
    for name in ("gpufleet_agent_spool_records", "gpufleet_agent_spool_dropped_total",
                 "gpufleet_agent_records_sent_total", "gpufleet_agent_records_refused_total"):
        out[name] = set(added)
    for name, _, _ in GPU_READINGS:
        out[name] = added | set(LABELS)
    return out


def test_every_prometheus_query_of_the_dashboard_parses_and_names_what_gpufleet_serves():
    """Checked statically, as the ClickHouse queries are run: a metric or label renamed in the
    code breaks this test, not the operators' dashboard."""
    import promql_parser

    exposed = exposed_metrics()
    exprs = [t["expr"] for t in dashboard_targets("prometheus")]
    assert len(exprs) >= 8
    for expr in exprs:
        promql_parser.parse(expr)  # raises on a syntax error
        names = re.findall(r"\b(gpufleet_[a-z_]+)\b", expr)
        assert names and all(n in exposed for n in names), (expr, [n for n in names if n not in exposed])
        labels = {label.strip() for group in re.findall(r"\bby \(([^)]*)\)", expr) for label in group.split(",")}
        allowed = set().union(*(exposed[n] for n in names))
        assert labels <= allowed, (expr, labels - allowed)


def test_the_shipped_enforcement_policy_loads_and_acts_on_nothing():
    """Acting needs an explicit setting: the example ladders are dry runs."""
    from streams.enforcement.ladder import load_ladders

    ladders = load_ladders(DOCKER / "config/enforcement.toml")
    assert ladders and not any(ladder.act for ladder in ladders)


def test_the_sink_can_be_told_to_decode_samples_in_python(monkeypatch):
    """A switch back to the Python path for the agents' samples, where ClickHouse's own parser
    is not wanted (its server path could not be run here)."""
    assert build_parser().parse_args(["sink"]).samples_in_python is False
    assert build_parser().parse_args(["sink", "--samples-in-python"]).samples_in_python is True
    monkeypatch.setenv("GPUFLEET_SINK_SAMPLES_IN_PYTHON", "1")
    assert build_parser().parse_args(["sink"]).samples_in_python is True



def test_the_sinks_fence_covers_a_held_reader_unless_told_otherwise(monkeypatch, caplog):
    """A sink reads what ClickHouse holds before each insert for as long as a partition's previous
    reader may still be held up (its watchdog's 1800 s), and says so where it is told less."""
    from gpufleet.commands.sink import fence_s

    with caplog.at_level("WARNING", logger="gpufleet"):
        assert fence_s(build_parser().parse_args(["sink"])) == 1800
        assert not caplog.records
        assert fence_s(build_parser().parse_args(["sink", "--fence-s", "3600"])) == 3600
        assert not caplog.records
        assert fence_s(build_parser().parse_args(["sink", "--fence-s", "600"])) == 600
        assert "--fence-s 600 is shorter" in caplog.text and "--stall-exit-s 1800" in caplog.text
        caplog.clear()
        monkeypatch.setenv("GPUFLEET_SINK_FENCE_S", "7200")
        assert fence_s(build_parser().parse_args(["sink", "--stall-exit-s", "0"])) == 7200
        assert "never ended" in caplog.text

# -- the agent on a scheduler's nodes: Kubernetes, systemd, Slurm ---------------------------

def test_the_kubernetes_daemonset_is_valid_and_reads_the_kubelets_pod_resources():
    """Every object checked against the Kubernetes API's own schema (kubernetes-validate,
    strict: an unknown field fails), and the agent's arguments against our CLI."""
    import kubernetes_validate

    docs = list(yaml.safe_load_all((DOCKER / "kubernetes" / "agent.yaml").read_text()))
    for doc in docs:
        kubernetes_validate.validate(doc, "1.30", strict=True)  # raises ValidationError naming the field
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"}
    pod = kinds["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == kinds["ServiceAccount"]["metadata"]["name"]
    assert kinds["ClusterRoleBinding"]["subjects"][0]["name"] == pod["serviceAccountName"]
    assert {"pods"} == set(kinds["ClusterRole"]["rules"][0]["resources"]) and kinds["ClusterRole"]["rules"][0][
        "verbs"] == ["get"]
    assert pod["hostPID"] is True  # it reads the GPU processes' /proc entries
    container, = pod["containers"]
    args = build_parser().parse_args(["--data-dir", "/var/lib/gpufleet", *container["args"]])
    assert args.func.__name__ == "cmd_agent" and args.allocations == "kubernetes"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert Path(args.kubelet_socket).parent == Path(mounts["pod-resources"])
    host_paths = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    assert host_paths["pod-resources"] == "/var/lib/kubelet/pod-resources"
    assert container["securityContext"]["runAsUser"] == 0 and container["securityContext"]["readOnlyRootFilesystem"]


def test_the_systemd_unit_runs_an_agent_that_reads_the_slurm_prologs_records():
    import configparser
    import shlex

    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read_string((DOCKER / "systemd" / "gpufleet-agent.service").read_text())
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"].split("#")[0])
    assert argv[0] == "/opt/gpufleet/bin/gpufleet"
    args = build_parser().parse_args(argv[1:])
    assert args.func.__name__ == "cmd_agent" and args.source == "nvml"
    env = dict(line.split("=", 1) for line in service["Environment"].split())
    assert env["GPUFLEET_ALLOCATIONS"] == "slurm"
    slurm_env = dict(line.split("=", 1) for line in (DOCKER / "slurm" / "gpufleet-slurm.env").read_text().splitlines()
                     if line and not line.startswith("#"))
    assert str(args.allocations_dir) == slurm_env["GPUFLEET_SLURM_DIR"]  # where the prolog writes
    assert Path(slurm_env["GPUFLEET"]) == Path(argv[0])
    assert int(service["TimeoutStopSec"]) > 30 and service["Restart"] == "always"  # 30 s: the agent's drain
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_the_slurm_scripts_are_valid_shell_and_record_a_job(tmp_path):
    """The shipped prolog and epilog, as slurmd runs them: no arguments, the job in the
    environment, the env file beside them; and the slurm.conf lines run *.sh only."""
    import os
    import subprocess
    import sys

    conf = (DOCKER / "slurm" / "slurm.conf.gpufleet").read_text()
    assert "Prolog=/etc/slurm/prolog.d/*.sh" in conf and "Epilog=/etc/slurm/epilog.d/*.sh" in conf
    assert "PrologFlags=Alloc" in conf
    gpufleet = Path(sys.executable).with_name("gpufleet")
    for kind in ("prolog", "epilog"):
        script = DOCKER / "slurm" / f"gpufleet-{kind}.sh"
        assert os.access(script, os.X_OK)
        assert subprocess.run(["sh", "-n", str(script)], check=False).returncode == 0
        (tmp_path / kind).mkdir()
        (tmp_path / kind / "gpufleet.sh").write_bytes(script.read_bytes())
        (tmp_path / kind / "gpufleet.sh").chmod(0o755)
        (tmp_path / kind / "gpufleet-slurm.env").write_text(
            f"GPUFLEET={gpufleet}\nGPUFLEET_SLURM_DIR={tmp_path}/alloc\n"
        )
    job = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "31", "SLURM_JOB_USER": "ana", "SLURM_JOB_ACCOUNT": "vision",
           "SLURM_JOB_GPUS": "0,1", "SLURM_CONF": str(tmp_path / "no-slurm.conf")}  # squeue fails: env alone
    for kind, written in (("prolog", ".jobs"), ("epilog", ".ended")):
        done = subprocess.run([str(tmp_path / kind / "gpufleet.sh")], env=job, capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        record = json.loads((tmp_path / "alloc" / written / "31.json").read_text())
        assert (record["workflow_id"], record["owner"], record["gpus"]) == ("slurm-31", "ana", ["0", "1"])
    bad = subprocess.run([str(tmp_path / "prolog" / "gpufleet.sh")], env={**job, "SLURM_JOB_ID": "x; y"},
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 0 and "not a Slurm job id" in bad.stderr  # never fails the job: says why
