"""Who may do what on gpufleet's Kafka topics, and the secure local cluster's credentials.

Each component runs as a principal of its own and is granted only what it needs (``rights``):

============ ==================================================================================
agent        writes GPU and host samples, workflow events, kernel events, profile statuses and dead
             letters (requests it cannot use); reads profile requests (its consumer groups: ``gpufleet-agent-…``)
worker       reads samples, workflow and kernel events, profile results, its schedule and trace
             analyses (each against the rank's previous one); writes every topic it derives; owns the
             topics and group named by its app id (changelogs)
sink         reads every topic it stores in ClickHouse; writes dead letters
notifier     reads alerts and workflow summaries (job reports); writes dead letters
operator     asks for profiles and reads what came of them, and where workflows run (``gpufleet profile``)
owners       the owners' service (``gpufleet serve``): writes owners' actions and their profile requests; reads
             where workflows run
subscriber   reads the output topics only: windows, summaries, alerts, analyses, findings
admin        a super user: creates topics, users and ACLs; never used by a component
============ ==================================================================================

Every component but the subscriber may also describe (not read) every gpufleet topic, so that
it can tell that the topics it needs exist. ``bindings`` turns the table into Kafka ACLs for a
topic prefix; ``grant`` creates them. ``LocalCredentials`` makes and keeps the secure local
cluster's CA, certificates, passwords and client property files.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from kafka_client.config import WORKER_APP_ID, Connection, Secret, Security
from schemas.topics import (
    ALERTS,
    ALL_TOPICS,
    DEAD_LETTERS,
    ENFORCEMENT,
    FINDINGS,
    GPU_SAMPLES,
    HOST_SAMPLES,
    KERNEL_EVENTS,
    OWNER_ACTIONS,
    PROFILE_REQUESTS,
    PROFILE_RESULTS,
    PROFILE_SCHEDULE,
    PROFILE_STATUSES,
    SERVING_WINDOWS,
    TRACE_ANALYSES,
    WORKFLOW_EVENTS,
    WORKFLOW_SUMMARIES,
    WORKFLOW_WINDOWS,
    TopicSpec,
)

ADMIN = "admin"
MECHANISM = "SCRAM-SHA-512"
DEFAULT_WORKER_APP_ID = WORKER_APP_ID


@dataclass(frozen=True)
class Rights:
    """What one principal may do: topics it reads and writes, and the prefixes of the consumer
    groups (and, for the worker, of the topics) it owns."""

    reads: tuple[TopicSpec, ...] = ()
    writes: tuple[TopicSpec, ...] = ()
    groups: tuple[str, ...] = ()
    owns_topics_prefixed: tuple[str, ...] = ()
    describes_all: bool = True


def _sink_topics() -> tuple[TopicSpec, ...]:
    from sinks.clickhouse_ddl import TABLES

    return tuple(dict.fromkeys(t.topic for t in TABLES))


def rights(worker_app_id: str = DEFAULT_WORKER_APP_ID) -> dict[str, Rights]:
    outputs = (WORKFLOW_WINDOWS, WORKFLOW_SUMMARIES, ALERTS, TRACE_ANALYSES, FINDINGS, SERVING_WINDOWS)
    return {
        "agent": Rights(reads=(PROFILE_REQUESTS,),
                        writes=(GPU_SAMPLES, HOST_SAMPLES, WORKFLOW_EVENTS, KERNEL_EVENTS, PROFILE_STATUSES,
                                DEAD_LETTERS),
                        groups=("gpufleet-agent-",)),
        "worker": Rights(reads=(GPU_SAMPLES, WORKFLOW_EVENTS, PROFILE_RESULTS, KERNEL_EVENTS, PROFILE_SCHEDULE,
                                TRACE_ANALYSES),
                         writes=(GPU_SAMPLES, *outputs, DEAD_LETTERS, PROFILE_REQUESTS, PROFILE_STATUSES,
                                 PROFILE_RESULTS, PROFILE_SCHEDULE, ENFORCEMENT),
                         groups=(worker_app_id,), owns_topics_prefixed=(worker_app_id,)),
        "sink": Rights(reads=_sink_topics(), writes=(DEAD_LETTERS,), groups=("gpufleet-clickhouse-sink",)),
        "notifier": Rights(reads=(ALERTS, WORKFLOW_SUMMARIES, ENFORCEMENT, OWNER_ACTIONS), writes=(DEAD_LETTERS,),
                           groups=("gpufleet-notifier",)),
        "enforcer": Rights(reads=(ENFORCEMENT, OWNER_ACTIONS), writes=(ENFORCEMENT, DEAD_LETTERS),
                           groups=("gpufleet-enforcer",)),
        "slurm": Rights(reads=(WORKFLOW_SUMMARIES,), writes=(DEAD_LETTERS,), groups=("gpufleet-slurm-comments",)),
        "operator": Rights(reads=(WORKFLOW_EVENTS, PROFILE_STATUSES, PROFILE_RESULTS, TRACE_ANALYSES, FINDINGS),
                           writes=(PROFILE_REQUESTS,), groups=("gpufleet-profile",)),
        "owners": Rights(reads=(WORKFLOW_EVENTS,), writes=(PROFILE_REQUESTS, OWNER_ACTIONS),
                         groups=("gpufleet-profile",)),
        "subscriber": Rights(reads=outputs, groups=("gpufleet-subscriber",), describes_all=False),
    }


PRINCIPALS = (ADMIN, *rights())


def bindings(topic_prefix: str = "", worker_app_id: str = DEFAULT_WORKER_APP_ID) -> list:
    """The ACLs that give each principal its ``rights`` on the topics under ``topic_prefix``."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    def allow(kind, name, pattern, principal, operation):
        return AclBinding(kind, name, pattern, f"User:{principal}", "*", operation, AclPermissionType.ALLOW)

    topic, group, literal, prefixed = ResourceType.TOPIC, ResourceType.GROUP, ResourcePatternType.LITERAL, \
        ResourcePatternType.PREFIXED
    out = []
    all_topics_prefix = topic_prefix + os.path.commonprefix([s.name for s in ALL_TOPICS])
    for principal, r in rights(worker_app_id).items():
        for spec in r.reads:
            out.append(allow(topic, topic_prefix + spec.name, literal, principal, AclOperation.READ))
        for spec in r.writes:
            out.append(allow(topic, topic_prefix + spec.name, literal, principal, AclOperation.WRITE))
        for name in r.groups:
            out.append(allow(group, name, prefixed, principal, AclOperation.READ))
        for name in r.owns_topics_prefixed:
            out.append(allow(topic, name, prefixed, principal, AclOperation.ALL))
        if r.describes_all:
            out.append(allow(topic, all_topics_prefix, prefixed, principal, AclOperation.DESCRIBE))
    return out


def grant(admin: Connection, topic_prefix: str = "", worker_app_id: str = DEFAULT_WORKER_APP_ID,
          timeout: float = 30.0) -> int:
    """Create the ACLs of ``bindings`` (existing ones are kept); returns how many were asked for."""
    from confluent_kafka.admin import AdminClient

    from kafka_client.config import client_config

    wanted = bindings(topic_prefix, worker_app_id)
    client = AdminClient(client_config(admin))  # kept until the futures are done: they die with it
    for future in client.create_acls(wanted, request_timeout=timeout).values():
        future.result(timeout)
    return len(wanted)


def create_users(admin: Connection, passwords: dict[str, Secret], timeout: float = 30.0) -> None:
    """Give each principal its SCRAM credential (set again where it exists)."""
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    from kafka_client.config import client_config

    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
    upserts = [UserScramCredentialUpsertion(user, info, password.reveal().encode())
               for user, password in passwords.items()]
    client = AdminClient(client_config(admin))  # kept until the futures are done: they die with it
    for future in client.alter_user_scram_credentials(upserts, request_timeout=timeout).values():
        future.result(timeout)


class LocalCredentials:
    """A secure cluster's secrets in one directory (mode 0700), made once by ``create``:

    - ``ca.pem``, ``ca.key``: the cluster's own CA;
    - ``nodes/node-<id>.keystore.pem``: each node's key and certificate (a PEM key store);
    - ``passwords.json``: each component principal's SCRAM password;
    - ``clients/<principal>/``: ``client.properties`` (the settings ``GPUFLEET_KAFKA_CONFIG``
      reads), the principal's certificate and key and the CA: all a component needs, so a
      container mounts its own folder and nothing else.

    Nodes talk to each other and the administrator talks to them with mutual TLS alone (the
    certificate's name is the principal: ``node-<id>``, ``admin``); the components use
    SCRAM-SHA-512 over TLS with a client certificate as well. No password is needed to start
    a node, and none is on any command line.
    """

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca.pem"

    def exists(self) -> bool:
        return (self.dir / "passwords.json").exists()

    def create(self, node_hosts: dict[int, tuple[str, ...]], mount: str | None = None) -> None:
        """The CA, a certificate per node (valid for its ``node_hosts``) and per principal, the
        passwords and the client folders. ``mount``: where a container sees its client folder
        (the paths in ``client.properties``); by default where it is here."""
        from gpufleet.local.certificates import Authority, write_private

        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        ca = Authority.create("gpufleet Kafka CA")
        ca.save(self.dir)
        for node_id, hosts in node_hosts.items():
            issued = ca.issue(self.dir / "nodes", f"node-{node_id}", hosts=hosts, server=True)
            write_private(self.keystore(node_id), issued.key.read_text() + issued.cert.read_text())
        passwords = {p: secrets.token_urlsafe(24) for p in PRINCIPALS if p != ADMIN}
        write_private(self.dir / "passwords.json", json.dumps(passwords))
        for principal in PRINCIPALS:
            folder = self.dir / "clients" / principal
            ca.issue(folder, principal, stem="client")
            (folder / "ca.pem").write_bytes(self.ca_file.read_bytes())
            seen_as = Path(mount) if mount else folder
            if principal == ADMIN:  # mutual TLS on the nodes' internal listener
                auth = ["security.protocol=SSL"]
            else:
                auth = ["security.protocol=SASL_SSL", f"sasl.mechanism={MECHANISM}", f"sasl.username={principal}",
                        f"sasl.password={passwords[principal]}"]
            write_private(folder / "client.properties", "\n".join([
                *auth, f"ssl.ca.location={seen_as / 'ca.pem'}", f"ssl.certificate.location={seen_as / 'client.pem'}",
                f"ssl.key.location={seen_as / 'client.key'}", ""]))

    def node_ids(self) -> list[int]:
        return sorted(int(p.name[len("node-"):-len(".keystore.pem")])
                      for p in (self.dir / "nodes").glob("node-*.keystore.pem"))

    def keystore(self, node_id: int) -> Path:
        return self.dir / "nodes" / f"node-{node_id}.keystore.pem"

    def properties(self, principal: str) -> Path:
        return self.dir / "clients" / principal / "client.properties"

    def passwords(self) -> dict[str, Secret]:
        """The components' SCRAM passwords (the administrator has none: it uses its certificate)."""
        return {p: Secret(v) for p, v in json.loads((self.dir / "passwords.json").read_text()).items()}

    def security(self, principal: str) -> Security:
        return Security.from_properties(self.properties(principal))
