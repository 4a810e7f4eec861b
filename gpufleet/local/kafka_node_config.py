"""How a local Kafka node is configured and what it runs on: its ``server.properties``
(KRaft's combined broker and controller; PLAINTEXT listeners, or a secure cluster's SASL_SSL,
mutual TLS and authorizer; replication for the cluster's size), a cluster id, the broker jars
fetched by Maven and a Java >= 17, and where a node listens (``Node``). ``gpufleet.local.kafka``
runs the nodes.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from gpufleet.local.kafka_security import ADMIN, MECHANISM, LocalCredentials
from kafka_client.admin import replication_for

REPO_ROOT = Path(__file__).resolve().parents[2]
KAFKA_DIR = REPO_ROOT / "docker" / "kafka"
LIBS_DIR = KAFKA_DIR / "libs"
MIN_JAVA = 17
# The node a killed broker's partitions wait for before moving: the controller declares a
# broker dead after this long without its heartbeats (Kafka's default is 9 s).
SESSION_TIMEOUT_MS = 6000


class KafkaRunnerError(RuntimeError):
    """The local Kafka could not be set up, started or stopped; the message says why."""


@dataclass(frozen=True)
class Node:
    node_id: int
    pid: int
    port: int
    controller_port: int
    data_dir: Path
    internal_port: int = 0  # a secure cluster's: nodes and the administrator, with mutual TLS

    @property
    def internal_address(self) -> str:
        return f"127.0.0.1:{self.internal_port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"


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


def listeners(node: Node, credentials: LocalCredentials | None) -> list[str]:
    """PLAINTEXT listeners; or, for a secure cluster, SASL_SSL for the components (SCRAM-SHA-512,
    and a certificate from the cluster's CA required) and mutual TLS alone between nodes, for
    the controllers and for the administrator, with Kafka's authorizer: what no ACL allows is
    refused. docker/compose.yaml configures its nodes the same way."""
    if credentials is None:
        return [
            f"listeners=PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{node.port}",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name=PLAINTEXT",
        ]
    nodes = ";".join(f"User:node-{i}" for i in credentials.node_ids())
    return [
        (f"listeners=CLIENT://127.0.0.1:{node.port},INTERNAL://127.0.0.1:{node.internal_port},"
         f"CONTROLLER://127.0.0.1:{node.controller_port}"),
        f"advertised.listeners=CLIENT://127.0.0.1:{node.port},INTERNAL://127.0.0.1:{node.internal_port}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=CLIENT:SASL_SSL,INTERNAL:SSL,CONTROLLER:SSL",
        "inter.broker.listener.name=INTERNAL",
        f"sasl.enabled.mechanisms={MECHANISM}",
        (f"listener.name.client.{MECHANISM.lower()}.sasl.jaas.config="
         "org.apache.kafka.common.security.scram.ScramLoginModule required;"),
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={credentials.keystore(node.node_id)}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={credentials.ca_file}",
        "ssl.client.auth=required",
        "listener.name.client.ssl.client.auth=required",  # a SASL_SSL listener's own (KIP-684)
        # A certificate's subject "CN=node-1,O=gpufleet" is the principal User:node-1.
        "ssl.principal.mapping.rules=RULE:^CN=([^,]+),O=gpufleet$/$1/,DEFAULT",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        f"super.users=User:{ADMIN};{nodes}",
        "allow.everyone.if.no.acl.found=false",
    ]


def server_properties(node: Node, voters: str, brokers: int, partitions: int,
                       credentials: LocalCredentials | None = None) -> str:
    replicas, min_isr = replication_for(brokers)
    return "\n".join([
        "process.roles=broker,controller",
        f"node.id={node.node_id}",
        f"controller.quorum.voters={voters}",
        *listeners(node, credentials),
        f"log.dirs={node.data_dir / 'logs'}",
        f"num.partitions={partitions}",
        f"default.replication.factor={replicas}",
        f"min.insync.replicas={min_isr}",
        f"offsets.topic.replication.factor={replicas}",
        "offsets.topic.num.partitions=4",
        f"transaction.state.log.replication.factor={replicas}",
        f"transaction.state.log.min.isr={min_isr}",
        f"share.coordinator.state.topic.replication.factor={replicas}",
        f"share.coordinator.state.topic.min.isr={min_isr}",
        f"broker.session.timeout.ms={SESSION_TIMEOUT_MS}",
        "broker.heartbeat.interval.ms=1000",
        # A local cluster: let consumer groups form at once.
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=false",
        "unclean.leader.election.enable=false",
        "",
    ])


def cluster_id() -> str:
    """A random KRaft cluster id: URL-safe base64 of 16 bytes, never starting with '-'
    (the storage tool would read it as an option; Kafka's own generator avoids it too)."""
    while True:
        value = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not value.startswith("-"):
            return value
