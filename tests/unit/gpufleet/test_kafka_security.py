"""The rights table as Kafka ACLs: each role gets what the pipeline needs of it, and no more."""

from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

from gpufleet.local.kafka_security import PRINCIPALS, bindings, rights
from schemas.topics import ALERTS, ALL_TOPICS, GPU_SAMPLES, OWNER_ACTIONS, PROFILE_REQUESTS


def granted(prefix="p."):
    out = {}
    for b in bindings(prefix, worker_app_id="p.worker"):
        out.setdefault(b.principal.removeprefix("User:"), set()).add(
            (b.restype, b.name, b.resource_pattern_type, b.operation))
    return out


def test_every_topic_has_a_writer_and_every_topic_read_has_a_writer():
    table = rights()
    written = {s.name for r in table.values() for s in r.writes}
    read = {s.name for r in table.values() for s in r.reads}
    assert written == {s.name for s in ALL_TOPICS}
    assert read <= written


def test_alerts_are_written_by_the_worker_alone_and_profile_requests_by_worker_operator_and_owners_service():
    g = granted()
    writers = {p for p, acls in g.items() if (ResourceType.TOPIC, "p." + ALERTS.name, ResourcePatternType.LITERAL,
                                              AclOperation.WRITE) in acls}
    assert writers == {"worker"}
    writers = {p for p, acls in g.items() if (ResourceType.TOPIC, "p." + PROFILE_REQUESTS.name,
                                              ResourcePatternType.LITERAL, AclOperation.WRITE) in acls}
    assert writers == {"worker", "operator", "owners"}
    writers = {p for p, acls in g.items() if (ResourceType.TOPIC, "p." + OWNER_ACTIONS.name,
                                              ResourcePatternType.LITERAL, AclOperation.WRITE) in acls}
    assert writers == {"owners"}  # what people did is written by the service that was told who they are


def test_the_subscriber_writes_nothing_and_sees_only_outputs():
    acls = granted()["subscriber"]
    assert all(op in (AclOperation.READ,) for _, _, _, op in acls)
    assert (ResourceType.TOPIC, "p." + GPU_SAMPLES.name, ResourcePatternType.LITERAL, AclOperation.READ) not in acls
    assert not any(t == ResourceType.TOPIC and pattern == ResourcePatternType.PREFIXED for t, _, pattern, _ in acls)


def test_only_the_worker_owns_topics_and_only_under_its_app_id():
    owners = {p: {(n, pat) for t, n, pat, op in acls if op == AclOperation.ALL} for p, acls in granted().items()}
    assert owners.pop("worker") == {("p.worker", ResourcePatternType.PREFIXED)}
    assert not any(owners.values())


def test_every_component_has_a_principal_and_admin_needs_no_acl():
    assert set(granted()) == set(PRINCIPALS) - {"admin"}


def test_the_docs_rights_table_is_what_the_brokers_are_given():
    """The table of users in docs/security.md (the operator's reference) says what ``rights``
    grants: every user, every topic read and written, every group prefix; and the subscriber
    example in docs/operating.md uses a group id the secure cluster accepts."""
    import re
    from pathlib import Path

    docs = Path(__file__).parents[3] / "docs"
    security = (docs / "security.md").read_text()
    table = security[security.index("| user | reads | writes |"):]
    table = table[:table.index("\n\n")].splitlines()[2:]

    def names(cell: str) -> set[str]:
        cell = cell.split(";")[0].strip()
        return set() if cell == "nothing" else {n.strip() for n in cell.split(",") if n.strip()}

    def short(specs) -> set[str]:
        return {s.name.removeprefix("gpufleet.").removesuffix(".v1") for s in specs}

    seen = {}
    for line in table:
        user, reads, writes, groups = (c.strip() for c in line.strip("|").split("|"))
        seen[user.split()[0]] = (names(reads), names(writes), set(re.findall(r"`([^`]+)`", groups)))
    granted = rights()
    assert seen.keys() == granted.keys()
    for user, r in granted.items():
        assert seen[user] == (short(r.reads), short(r.writes), set(r.groups)), user
    group = re.search(r'"group\.id": "([^"]+)"', (docs / "operating.md").read_text()).group(1)
    assert group.startswith(granted["subscriber"].groups[0])
