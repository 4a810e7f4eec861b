"""Runs Apache Kafka (KRaft) on loopback from the jars in docker/kafka/libs: one node, or a
cluster of several.

Used by ``gpufleet kafka start|stop|status``, by ``gpufleet demo``, by the integration tests'
session fixture and by the fault tests, which kill and restart single nodes. Each node is a
child process started in its own session, and is broker and controller at once (KRaft's
combined mode): a 3-node cluster is 3 JVMs instead of 6 on a small machine, and killing one
node takes away a broker and a controller voter together, the harder case (the 2 left keep
the quorum and lead every partition). Large production clusters run their controllers apart.

State lives under the data directory: ``cluster.json`` (cluster id, and each node's id,
ports and pid: another command can stop it) and one folder per node, ``node-<id>/`` with its
``server.properties``, log directory and ``broker.log``. A node restarted keeps its ports, so
clients and the controller quorum find it where it was.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gpufleet.local.kafka_node_config import (
    KAFKA_DIR,
    KafkaRunnerError,
    Node,
    cluster_id,
    ensure_jars,
    java_executable,
    server_properties,
)
from gpufleet.local.kafka_security import ADMIN, LocalCredentials, create_users, grant
from gpufleet.local.ports import free_port
from kafka_client.config import Connection, client_config


@dataclass(frozen=True)
class ClusterInfo:
    """The local cluster: its nodes, and the bootstrap address of all of them."""

    data_dir: Path
    nodes: tuple[Node, ...]
    secure: bool = False

    @property
    def bootstrap(self) -> str:
        return ",".join(n.address for n in self.nodes)

    @property
    def credentials(self) -> LocalCredentials | None:
        """The secure cluster's CA, certificates and passwords (None for a PLAINTEXT cluster)."""
        return LocalCredentials(self.data_dir / "secure") if self.secure else None

    def connection(self, principal: str = ADMIN) -> Connection:
        """How ``principal`` reaches this cluster (any client, over PLAINTEXT). The administrator
        of a secure cluster uses the internal listeners, with its certificate."""
        credentials = self.credentials
        if credentials is None:
            return Connection(self.bootstrap)
        bootstrap = ",".join(n.internal_address for n in self.nodes) if principal == ADMIN else self.bootstrap
        return Connection(bootstrap, credentials.security(principal))

    @property
    def log_file(self) -> Path:
        """The first node's log (the only one of a single broker)."""
        return self.nodes[0].log_file

    @property
    def pid(self) -> int:
        return self.nodes[0].pid

    def node(self, node_id: int) -> Node:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(f"no node {node_id} in {self.data_dir}")


def client_ports(first: int, brokers: int, option: str = "--port") -> list[int]:
    """The client ports of a new cluster asked for with ``--port first`` (``option``: the name the
    command gives it): one per node, in a row (node 1 on ``first``), each free now, else
    KafkaRunnerError naming the one taken."""
    ports = list(range(first, first + brokers))
    if ports[-1] > 65535:
        raise KafkaRunnerError(f"{option} {first}: {brokers} nodes need ports {first} to {ports[-1]}, past 65535")
    for p in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                more = f" (node i listens on {option} + i - 1)" if brokers > 1 else ""
                raise KafkaRunnerError(f"port {p} is in use: choose another {option}{more}") from None
    return ports


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log written)"


def _state_file(data_dir: Path) -> Path:
    return data_dir / "cluster.json"


def _read_raw(data_dir: Path) -> dict | None:
    try:
        return json.loads(_state_file(data_dir).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _write_raw(data_dir: Path, raw: dict) -> None:
    tmp = _state_file(data_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps(raw))
    tmp.replace(_state_file(data_dir))


def read_state(data_dir: Path) -> ClusterInfo | None:
    raw = _read_raw(data_dir)
    if raw is None or not raw.get("nodes"):
        return None
    return ClusterInfo(data_dir, tuple(
        Node(n["node_id"], n.get("pid", 0), n["port"], n["controller_port"], data_dir / f"node-{n['node_id']}",
             n.get("internal_port", 0))
        for n in raw["nodes"]), secure=bool(raw.get("secure")))


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return Path(f"/proc/{pid}").exists() and "Z" not in _proc_state(pid)


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (FileNotFoundError, IndexError):
        return "X"


def answers_metadata(kafka: str | Connection, timeout: float = 2.0, cluster_id: str | None = None,
                     brokers: int = 1) -> bool:
    """True when the cluster at ``bootstrap`` answers a metadata request naming at least
    ``brokers`` live brokers (of cluster ``cluster_id``, when given: another broker already
    on that port must not pass for ours)."""
    return len(live_brokers(kafka, timeout, cluster_id)) >= brokers


def live_brokers(kafka: str | Connection, timeout: float = 2.0, cluster_id: str | None = None) -> set[int]:
    """The ids of the brokers the cluster's metadata lists as live (empty if it does not answer)."""
    from confluent_kafka.admin import AdminClient  # local import: the CLI's `--help` stays fast

    # log_level 0: a broker that is still starting refuses connections; that is expected here.
    admin = AdminClient(client_config(kafka, **{"socket.timeout.ms": int(timeout * 1000), "log_level": 0}))
    try:
        metadata = admin.list_topics(timeout=timeout)
    except Exception:  # noqa: BLE001 - any failure here means "not answering yet"
        return set()
    if cluster_id is not None and metadata.cluster_id != cluster_id:
        return set()
    return set(metadata.brokers)


def status(data_dir: Path) -> ClusterInfo | None:
    """The local cluster recorded in ``data_dir`` with the nodes now running, or None when none is."""
    info = read_state(data_dir.resolve())
    if info is None:
        return None
    running = tuple(n for n in info.nodes if _alive(n.pid))
    return ClusterInfo(info.data_dir, running, info.secure) if running else None


def start(
    data_dir: Path,
    brokers: int = 1,
    port: int | None = None,
    partitions: int = 4,
    heap: str = "512m",
    timeout: float = 90.0,
    secure: bool = False,
    port_option: str = "--port",
) -> ClusterInfo:
    """Start the cluster of ``brokers`` nodes recorded in ``data_dir`` (created there the first
    time), or the nodes of it that are not running, and wait until every node answers.

    ``secure``: a cluster that only speaks SASL_SSL with mutual TLS, where a principal per
    component may do only what ``gpufleet.local.kafka_security.rights`` allow it (on the topics
    without prefix; ``kafka_security.grant`` adds a prefix's). Its CA, certificates, passwords
    and client property files are made the first time, under ``data_dir/secure``."""
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    raw = _read_raw(data_dir)
    if raw is None:
        if brokers < 1:
            raise KafkaRunnerError(f"a cluster needs at least one broker, not {brokers}")
        if port:
            client_ports(port, brokers, port_option)
        raw = {"cluster_id": cluster_id(), "secure": secure, "nodes": [
            {"node_id": i, "port": (port + i - 1 if port else free_port()), "controller_port": free_port(),
             "pid": 0, **({"internal_port": free_port()} if secure else {})}
            for i in range(1, brokers + 1)]}
        if secure:
            LocalCredentials(data_dir / "secure").create({i: ("127.0.0.1", "localhost") for i in range(1, brokers + 1)})
        _write_raw(data_dir, raw)
    elif port and [n["port"] for n in raw["nodes"]] != list(range(port, port + len(raw["nodes"]))):
        raise KafkaRunnerError(f"{data_dir} holds a cluster on port(s) "
                               f"{', '.join(str(n['port']) for n in raw['nodes'])}: a cluster keeps its ports; "
                               "start it without --port, or stop it and use another data directory")
    elif len(raw["nodes"]) != brokers:
        raise KafkaRunnerError(f"{data_dir} holds a cluster of {len(raw['nodes'])} node(s), not {brokers}; "
                               "stop it and use another data directory to change its size")
    elif bool(raw.get("secure")) != secure:
        raise KafkaRunnerError(f"{data_dir} holds a {'secure' if raw.get('secure') else 'PLAINTEXT'} cluster; "
                               "stop it and use another data directory to change that")
    info = read_state(data_dir)
    assert info is not None
    for node in info.nodes:
        if not _alive(node.pid):
            start_node(data_dir, node.node_id, partitions=partitions, heap=heap)
    info = wait_for(data_dir, timeout)
    if info.credentials is not None:
        credentials, admin = info.credentials, info.connection(ADMIN)
        create_users(admin, credentials.passwords())
        grant(admin)
    return info


def start_node(data_dir: Path, node_id: int, partitions: int = 4, heap: str = "512m") -> Node:
    """Start one node of the recorded cluster (formatting its storage the first time);
    returns without waiting for it to answer."""
    data_dir = data_dir.resolve()
    raw = _read_raw(data_dir)
    info = read_state(data_dir)
    if raw is None or info is None:
        raise KafkaRunnerError(f"no cluster recorded in {data_dir}: start it first")
    node = info.node(node_id)
    if _alive(node.pid):
        return node
    libs = ensure_jars()
    java = java_executable()
    node.data_dir.mkdir(parents=True, exist_ok=True)
    voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in info.nodes)
    config = node.data_dir / "server.properties"
    credentials = info.credentials
    config.write_text(server_properties(node, voters, len(info.nodes), partitions, credentials))  # no secret in it
    classpath = f"{libs}/*"
    if not (node.data_dir / "logs" / "meta.properties").exists():
        fmt = subprocess.run(
            [java, "-cp", classpath, "kafka.tools.StorageTool", "format",
             "--cluster-id", raw["cluster_id"], "--config", str(config), "--ignore-formatted"],
            capture_output=True, text=True, check=False,
        )
        if fmt.returncode != 0:
            raise KafkaRunnerError(f"formatting the KRaft storage in {node.data_dir} failed:\n{fmt.stdout}{fmt.stderr}")
    with node.log_file.open("ab") as log:
        proc = subprocess.Popen(
            [java, f"-Xmx{heap}", "-Xms128m", "-XX:+UseG1GC",
             f"-Dlog4j2.configurationFile={KAFKA_DIR / 'log4j2.properties'}",
             "-cp", classpath, "kafka.Kafka", str(config)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    for n in raw["nodes"]:
        if n["node_id"] == node_id:
            n["pid"] = proc.pid
    _write_raw(data_dir, raw)
    return Node(node.node_id, proc.pid, node.port, node.controller_port, node.data_dir, node.internal_port)


def wait_for(data_dir: Path, timeout: float = 90.0) -> ClusterInfo:
    """Wait until every node recorded in ``data_dir`` is live in the cluster's metadata; a node
    that exits meanwhile, or a timeout, raises with the end of its log (the cluster is left
    as it is)."""
    data_dir = data_dir.resolve()
    info = read_state(data_dir)
    raw = _read_raw(data_dir)
    if info is None or raw is None:
        raise KafkaRunnerError(f"no cluster recorded in {data_dir}")
    wanted = {n.node_id for n in info.nodes}
    deadline = time.monotonic() + timeout
    while True:
        for node in info.nodes:
            if not _alive(node.pid):
                raise KafkaRunnerError(
                    f"Kafka node {node.node_id} exited while starting; log {node.log_file}:\n{tail(node.log_file)}")
        if live_brokers(info.connection(ADMIN), cluster_id=raw["cluster_id"]) >= wanted:
            return info
        if time.monotonic() > deadline:
            logs = "\n".join(f"log {n.log_file}:\n{tail(n.log_file, 15)}" for n in info.nodes)
            raise KafkaRunnerError(f"the Kafka cluster did not answer on {info.bootstrap} with all of "
                                   f"{len(wanted)} node(s) within {timeout:.0f}s; {logs}")
        time.sleep(0.3)


def kill_node(data_dir: Path, node_id: int, sig: int = signal.SIGKILL, timeout: float = 30.0) -> bool:
    """Send ``sig`` to one node and wait until it is gone (SIGKILL: as a crash would). True if it ran."""
    info = read_state(data_dir.resolve())
    if info is None:
        return False
    node = info.node(node_id)
    if not _alive(node.pid):
        return False
    os.kill(node.pid, sig)
    deadline = time.monotonic() + timeout
    while _alive(node.pid):
        if time.monotonic() > deadline:
            os.kill(node.pid, signal.SIGKILL)
            deadline = time.monotonic() + timeout
        time.sleep(0.1)
    return True


def stop(data_dir: Path, timeout: float = 30.0) -> bool:
    """Stop every node recorded in ``data_dir`` (SIGTERM, then SIGKILL). True if one was running."""
    data_dir = data_dir.resolve()
    info = read_state(data_dir)
    if info is None:
        return False
    running = [n for n in info.nodes if _alive(n.pid)]
    for node in running:
        os.kill(node.pid, signal.SIGTERM)
    for node in running:
        kill_node(data_dir, node.node_id, signal.SIGTERM, timeout)
    raw = _read_raw(data_dir)
    if raw is not None:
        for n in raw["nodes"]:
            n["pid"] = 0
        _write_raw(data_dir, raw)
    return bool(running)
