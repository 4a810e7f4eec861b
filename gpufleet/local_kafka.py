"""Runs a single-node Apache Kafka broker (KRaft) on loopback from the jars in docker/kafka/libs.

Used by ``gpufleet kafka start|stop|status``, by ``gpufleet demo`` and by the integration
tests' session fixture. The broker is a child process started in its own session; its
state (pid, bootstrap address) lives in ``<data dir>/broker.json`` so that another
command can stop it.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
KAFKA_DIR = REPO_ROOT / "docker" / "kafka"
LIBS_DIR = KAFKA_DIR / "libs"
MIN_JAVA = 17


class KafkaRunnerError(RuntimeError):
    """The local broker could not be set up, started or stopped; the message says why."""


@dataclass(frozen=True)
class BrokerInfo:
    pid: int
    bootstrap: str
    data_dir: Path
    log_file: Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_jars(libs_dir: Path = LIBS_DIR) -> Path:
    """Fetch the broker jars with Maven if they are not there yet."""
    if list(libs_dir.glob("kafka_2.13-*.jar")):
        return libs_dir
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaRunnerError(
            f"no Kafka jars in {libs_dir} and no `mvn` on PATH to fetch them; "
            "install Maven and run `make setup`"
        )
    result = subprocess.run(
        [mvn, "-q", "-B", "-f", str(KAFKA_DIR / "pom.xml"), "package"],
        capture_output=True, text=True, check=False,
    )
    if result.returncode != 0 or not list(libs_dir.glob("kafka_2.13-*.jar")):
        raise KafkaRunnerError(f"Maven could not fetch the Kafka jars:\n{result.stdout}{result.stderr}")
    return libs_dir


def java_executable() -> str:
    """The java binary to run the broker with: $JAVA_HOME/bin/java, else java on PATH (>= 17)."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise KafkaRunnerError("no Java found: install a JDK >= 17 or set JAVA_HOME")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    match = re.search(r'version "(\d+)', out)
    if not match or int(match.group(1)) < MIN_JAVA:
        raise KafkaRunnerError(f"Kafka needs Java >= {MIN_JAVA}; {java} says: {out.strip()}")
    return java


def _server_properties(data_dir: Path, port: int, controller_port: int, partitions: int) -> str:
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name=PLAINTEXT",
        f"log.dirs={data_dir / 'logs'}",
        f"num.partitions={partitions}",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=4",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        # A single local broker: let consumer groups form at once.
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=false",
        "",
    ])


def cluster_id() -> str:
    """A random KRaft cluster id: URL-safe base64 of 16 bytes, never starting with '-'
    (the storage tool would read it as an option; Kafka's own generator avoids it too)."""
    while True:
        value = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not value.startswith("-"):
            return value


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log written)"


def _state_file(data_dir: Path) -> Path:
    return data_dir / "broker.json"


def read_state(data_dir: Path) -> BrokerInfo | None:
    try:
        raw = json.loads(_state_file(data_dir).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return BrokerInfo(raw["pid"], raw["bootstrap"], data_dir, data_dir / "broker.log")


def _alive(pid: int) -> bool:
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


def answers_metadata(bootstrap: str, timeout: float = 2.0, cluster_id: str | None = None) -> bool:
    """True when a broker at ``bootstrap`` answers a metadata request (from cluster ``cluster_id``,
    when given: another broker already on that port must not pass for ours)."""
    from confluent_kafka.admin import AdminClient  # local import: the CLI's `--help` stays fast

    # log_level 0: a broker that is still starting refuses connections; that is expected here.
    admin = AdminClient({
        "bootstrap.servers": bootstrap,
        "socket.timeout.ms": int(timeout * 1000),
        "log_level": 0,
    })
    try:
        metadata = admin.list_topics(timeout=timeout)
    except Exception:  # noqa: BLE001 - any failure here means "not answering yet"
        return False
    return bool(metadata.brokers) and (cluster_id is None or metadata.cluster_id == cluster_id)


def formatted_cluster_id(data_dir: Path) -> str | None:
    """The cluster id the KRaft storage in ``data_dir`` was formatted with, if it was."""
    try:
        text = (data_dir / "logs" / "meta.properties").read_text()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        if line.startswith("cluster.id="):
            return line.split("=", 1)[1].strip()
    return None


def status(data_dir: Path) -> BrokerInfo | None:
    """The running broker recorded in ``data_dir``, or None."""
    info = read_state(data_dir)
    if info is None or not _alive(info.pid):
        return None
    return info


def start(
    data_dir: Path,
    port: int | None = None,
    partitions: int = 4,
    heap: str = "512m",
    timeout: float = 90.0,
) -> BrokerInfo:
    """Start a broker (or return the one already running for ``data_dir``) and wait until it answers."""
    data_dir = data_dir.resolve()
    running = status(data_dir)
    if running is not None and answers_metadata(running.bootstrap, cluster_id=formatted_cluster_id(data_dir)):
        return running
    libs = ensure_jars()
    java = java_executable()
    data_dir.mkdir(parents=True, exist_ok=True)
    # A restarted broker keeps its ports: clients reconnect to the same address, and the
    # controller quorum keeps its endpoint.
    ports_file = data_dir / "ports.json"
    previous = json.loads(ports_file.read_text()) if ports_file.exists() else {}
    port = port or previous.get("port") or free_port()
    controller_port = previous.get("controller_port") or free_port()
    ports_file.write_text(json.dumps({"port": port, "controller_port": controller_port}))
    config = data_dir / "server.properties"
    config.write_text(_server_properties(data_dir, port, controller_port, partitions))
    log_file = data_dir / "broker.log"
    classpath = f"{libs}/*"
    if not (data_dir / "logs" / "meta.properties").exists():
        fmt = subprocess.run(
            [java, "-cp", classpath, "kafka.tools.StorageTool", "format",
             "--cluster-id", cluster_id(), "--config", str(config), "--ignore-formatted"],
            capture_output=True, text=True, check=False,
        )
        if fmt.returncode != 0:
            raise KafkaRunnerError(f"formatting the KRaft storage in {data_dir} failed:\n{fmt.stdout}{fmt.stderr}")
    with log_file.open("ab") as log:
        proc = subprocess.Popen(
            [java, f"-Xmx{heap}", "-Xms128m", "-XX:+UseG1GC",
             f"-Dlog4j2.configurationFile={KAFKA_DIR / 'log4j2.properties'}",
             "-cp", classpath, "kafka.Kafka", str(config)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    bootstrap = f"127.0.0.1:{port}"
    info = BrokerInfo(proc.pid, bootstrap, data_dir, log_file)
    _state_file(data_dir).write_text(json.dumps({"pid": proc.pid, "bootstrap": bootstrap}))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise KafkaRunnerError(
                f"the Kafka broker exited with code {proc.returncode} while starting; "
                f"log {log_file}:\n{tail(log_file)}"
            )
        if answers_metadata(bootstrap, cluster_id=formatted_cluster_id(data_dir)):
            return info
        time.sleep(0.5)
    stop(data_dir)
    raise KafkaRunnerError(
        f"the Kafka broker did not answer on {bootstrap} within {timeout:.0f}s; log {log_file}:\n{tail(log_file)}"
    )


def stop(data_dir: Path, timeout: float = 30.0) -> bool:
    """Stop the broker recorded in ``data_dir`` (SIGTERM, then SIGKILL). True if one was running."""
    data_dir = data_dir.resolve()
    info = read_state(data_dir)
    if info is None:
        return False
    was_running = _alive(info.pid)
    if was_running:
        os.kill(info.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(info.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(info.pid):
            os.kill(info.pid, signal.SIGKILL)
            while _alive(info.pid):
                time.sleep(0.1)
    _state_file(data_dir).unlink(missing_ok=True)
    return was_running
