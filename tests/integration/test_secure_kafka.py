"""gpufleet on a secured Kafka: SASL_SSL (SCRAM-SHA-512 and mutual TLS) with the authorizer on,
each component as its own principal with only its rights, on a real broker."""

from __future__ import annotations

import ssl
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from gpufleet.local import kafka as local_kafka
from gpufleet.local.certificates import Authority
from gpufleet.local.kafka_security import ADMIN, grant
from kafka_client.admin import TopicsMissing, ensure_topics
from kafka_client.config import (
    Connection,
    KafkaConfigError,
    Secret,
    Security,
    check_access,
    consumer_config,
    producer_config,
)
from producers.publish_kafka import Publisher
from producers.simulate.fleet import build_fleet
from schemas.topics import ALERTS, GPU_SAMPLES, WORKFLOW_WINDOWS
from tests.support.integration import CODEC, running_sink, wait_until, worker_process
from tests.support.samples import BASE_MS


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_kafka.ClusterInfo]:
    data_dir = tmp_path_factory.mktemp("secure-kafka")
    info = local_kafka.start(data_dir, secure=True)
    yield info
    local_kafka.stop(data_dir)


@pytest.fixture
def topics(secure) -> str:
    """A fresh topic prefix on the secure cluster, created by the administrator, with the
    components' rights on it (the worker's app id is ``<prefix>worker``)."""
    prefix = f"s{uuid.uuid4().hex[:8]}."
    admin = secure.connection(ADMIN)
    ensure_topics(admin, prefix=prefix, partitions=2)
    grant(admin, prefix, worker_app_id=f"{prefix}worker")
    return prefix


REFUSED = "refused"


def refusal(produce_or_consume) -> str:
    """``REFUSED`` when the brokers refused the client for want of a right, '' when it was allowed."""
    try:
        produce_or_consume()
    except KafkaException as exc:
        text = f"{exc.args[0].name()} {exc.args[0].str()}"
        assert "AUTHORIZATION_FAILED" in text.upper().replace(" ", "_"), text
        return REFUSED
    return ""


def produce_one(kafka: Connection, topic: str) -> None:
    """One message; raises the first error (a principal that may write no topic at all is
    refused a producer id: a fatal error of the client, not of the message)."""
    errors = []
    producer = Producer(producer_config(kafka, **{"message.timeout.ms": 10_000}, error_cb=errors.append))
    producer.produce(topic, b"x", partition=0, on_delivery=lambda err, msg: errors.append(err) if err else None)
    try:
        producer.flush(15)
    except SystemError as exc:  # confluent-kafka raises the fatal error, then purges the queue through
        raise exc.__cause__ from None  # the delivery callback with it still set: a SystemError
    if errors:
        raise KafkaException(errors[0])


def consume_from_start(kafka: Connection, topic: str, group: str) -> int:
    """The messages read from partition 0 of ``topic`` (which holds one) within a few seconds."""
    consumer = Consumer(consumer_config(kafka, group))
    read = 0
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        for _ in range(20):
            for m in consumer.consume(10, timeout=0.5):
                if m.error():
                    raise KafkaException(m.error())
                read += 1
            if read:
                return read
    finally:
        consumer.close()
    return read


def visible_to(kafka: Connection, topic: str) -> str:
    """What ``kafka``'s principal is told of ``topic``: 'yes', or the error instead of its metadata."""
    consumer = Consumer(consumer_config(kafka, "unused"))
    try:
        listed = consumer.list_topics(topic, timeout=10).topics[topic]
        return "yes" if listed.error is None else listed.error.name()
    finally:
        consumer.close()


def test_each_principal_may_do_only_what_its_role_needs(secure, topics):
    agent, subscriber = secure.connection("agent"), secure.connection("subscriber")
    samples, alerts = topics + GPU_SAMPLES.name, topics + ALERTS.name
    assert refusal(lambda: produce_one(agent, samples)) == ""
    assert refusal(lambda: produce_one(agent, alerts)) == REFUSED  # no forged alerts
    assert refusal(lambda: consume_from_start(agent, samples, "gpufleet-agent-x")) == REFUSED
    admin = secure.connection(ADMIN)
    produce_one(admin, alerts)
    assert consume_from_start(subscriber, alerts, "gpufleet-subscriber-x") == 1
    for topic in (alerts, samples, topics + WORKFLOW_WINDOWS.name):
        assert refusal(lambda topic=topic: produce_one(subscriber, topic)) == REFUSED
    # The subscriber is not even told that the samples exist, let alone given one.
    assert visible_to(subscriber, samples) == "TOPIC_AUTHORIZATION_FAILED"
    assert visible_to(agent, samples) == "yes"
    assert consume_from_start(subscriber, samples, "gpufleet-subscriber-x") == 0
    assert consume_from_start(admin, samples, "admin-reader") == 1
    # A component may not create topics: it is told which are missing and who creates them.
    with pytest.raises(TopicsMissing, match=r"User:agent may not create them: .*gpufleet-topics-test"):
        from kafka_client.admin import create_topics
        create_topics(agent, [(topics + "gpufleet-topics-test", 1, False)])


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("other-ca")
    Authority.create("not the cluster's CA").issue(directory, "agent")
    return directory


@pytest.mark.parametrize("change, says", [
    (lambda s, other: replace(s, password=Secret("not-the-password")), "its credentials are wrong"),
    (lambda s, other: replace(s, username="nobody"), "its credentials are wrong"),
    (lambda s, other: replace(s, cert_file=None, key_file=None), "it presented no client certificate"),
    (lambda s, other: replace(s, cert_file=str(other / "agent.pem"), key_file=str(other / "agent.key")),
     "or one the brokers' CA did not sign"),
    (lambda s, other: replace(s, ca_file=None), "presented a certificate this client cannot verify"),
    (lambda s, other: Security(), "no Kafka broker at .* answered User:ANONYMOUS over PLAINTEXT"),
], ids=["wrong password", "unknown user", "no certificate", "another CA's certificate", "broker not trusted",
        "plaintext"])
def test_a_client_that_cannot_prove_who_it_is_is_refused_saying_why(secure, other_ca, change, says):
    agent = secure.connection("agent")
    with pytest.raises(KafkaConfigError, match=says):
        check_access(Connection(agent.bootstrap, change(agent.security, other_ca)), timeout=5)


def test_the_command_line_says_why_it_is_refused(secure, tmp_path):
    properties = tmp_path / "agent.properties"
    text = secure.credentials.properties("agent").read_text()
    properties.write_text("\n".join(
        "sasl.password=wrong" if line.startswith("sasl.password=") else line for line in text.splitlines()))
    properties.chmod(0o600)
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet", "--data-dir", str(tmp_path), "topics", "--bootstrap", secure.bootstrap],
        env={"GPUFLEET_KAFKA_CONFIG": str(properties), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
        timeout=60, check=False)
    assert done.returncode != 0
    assert f"Kafka at {secure.bootstrap} refused User:agent: its credentials are wrong" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_pipeline_runs_end_to_end_over_sasl_ssl_with_acls(secure, topics, tmp_path, chdb_client, database):
    """Agents' samples -> worker -> windows and alerts -> sink -> ClickHouse, each as itself."""
    fleet = build_fleet(seed=21, hosts=2, gpus_per_host=2, workflows=3)
    publisher = Publisher(secure.connection("agent"), CODEC)
    samples = [s for t in range(135) for s in fleet.samples_at(t, BASE_MS, 1000)]
    publisher.publish(GPU_SAMPLES, samples, topic=topics + GPU_SAMPLES.name)
    assert publisher.flush() == 0

    worker_env = {"GPUFLEET_KAFKA_CONFIG": str(secure.credentials.properties("worker"))}
    with running_sink(secure.connection("sink"), topics, chdb_client, database,
                      group_id="gpufleet-clickhouse-sink-secure-test") as sink, \
            worker_process(secure.bootstrap, topics, tmp_path, f"{topics}worker", "--detector-min-s", "60",
                           env=worker_env) as worker:
        wanted = len(fleet.workflows) * 2

        def windows() -> int:
            return chdb_client.query(f"SELECT count() FROM {database}.workflow_windows FINAL").result_rows[0][0]

        wait_until(lambda: windows() >= wanted or worker.poll() is not None, 120, f"{wanted} windows in ClickHouse")
        assert worker.poll() is None, worker.log_path.read_text()[-3000:]
        wait_until(lambda: chdb_client.query(f"SELECT count() FROM {database}.gpu_samples")
                   .result_rows[0][0] >= len(samples), 60, "every sample in ClickHouse")
    assert sink.stats.dead_letters == 0
    log = worker.log_path.read_text()
    assert "AUTHORIZATION_FAILED" not in log and "Authorization" not in log, log[-3000:]
    assert not any(p.reveal() in log for p in secure.credentials.passwords().values())  # the worker's log


def test_no_secret_leaks_into_logs_errors_dead_letters_or_clickhouse(secure, topics, tmp_path, chdb_client, database,
                                                                      caplog, monkeypatch):
    """Known secrets everywhere a component uses one: Kafka passwords, a ClickHouse password, an
    SMTP password and a webhook URL, on paths that fail (so that errors are written). None may
    appear in a log line, an error, a dead letter or a ClickHouse row."""
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult

    from gpufleet.local.ports import free_port
    from sinks.consume_alerts import AlertNotifier
    from sinks.route_alerts import load_routing
    from tests.support.alerts import Mailbox, Refusing, alert

    smtp_password, webhook_secret, clickhouse_password = "smtp-S3cret-7f1", "T0K/B0T/hook-S3cret-9a2", "ch-S3cret-4c7"
    secrets = [smtp_password, webhook_secret, clickhouse_password,
               *(p.reveal() for p in secure.credentials.passwords().values())]
    monkeypatch.setenv("GPUFLEET_CLICKHOUSE_PASSWORD", clickhouse_password)
    monkeypatch.setenv("GPUFLEET_SMTP_PASSWORD", smtp_password)
    caplog.set_level("DEBUG")

    from http.server import ThreadingHTTPServer
    http = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    ca = Authority.create("mail CA")
    ca_file = ca.save(tmp_path / "mail").cert
    issued = ca.issue(tmp_path / "mail", "localhost", hosts=("localhost",), server=True)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(issued.cert, issued.key)
    smtp = Controller(Mailbox(), hostname="127.0.0.1", port=free_port(), tls_context=tls, require_starttls=True,
                      auth_required=True, authenticator=lambda *args: AuthResult(success=False, handled=False))
    smtp.start()
    routing = tmp_path / "routing.toml"
    routing.write_text(f'[default]\nwebhook = "http://127.0.0.1:{http.server_address[1]}/forbidden/{webhook_secret}"\n'
                       f'email_owners = true\n[smtp]\nhost = "localhost"\nport = {smtp.port}\nstarttls = true\n'
                       f'ca_file = "{ca_file}"\nusername = "gpufleet"\npassword_env = "GPUFLEET_SMTP_PASSWORD"\n')
    try:
        worker = Publisher(secure.connection("worker"), CODEC)  # alerts come from the worker only
        worker.publish(ALERTS, [alert(f"a{i}", "FIRING", True, "nlp", "ana@example.com") for i in range(3)],
                       topic=topics + ALERTS.name)
        assert worker.flush() == 0
        notifier = AlertNotifier(secure.connection("notifier"), load_routing(routing), tmp_path / "sent.log",
                                 group_id="gpufleet-notifier-leak-test", topic_prefix=topics, webhook_backoff_s=0.01)
        stop = threading.Event()
        thread = threading.Thread(target=notifier.run, args=(stop,), daemon=True)
        thread.start()
        wait_until(lambda: notifier.failures >= 6, 60, "both channels to refuse the three alerts")
        stop.set()
        thread.join(30)
    finally:
        smtp.stop()
        http.shutdown()

    # The dead letters and alerts into ClickHouse, through the sink.
    with running_sink(secure.connection("sink"), topics, chdb_client, database,
                      group_id="gpufleet-clickhouse-sink-leak-test"):
        wait_until(lambda: chdb_client.query(f"SELECT count() FROM {database}.dead_letters").result_rows[0][0] >= 6,
                   60, "the notifier's dead letters in ClickHouse")
    reasons = [r for (r,) in chdb_client.query(f"SELECT reason FROM {database}.dead_letters").result_rows]
    assert any("webhook http://127.0.0.1:" in r and "HTTP 403" in r for r in reasons), reasons
    assert any("SMTPAuthenticationError" in r for r in reasons), reasons

    # A query through a server DSN that holds a password: refused, and the password not shown.
    cli = subprocess.run([sys.executable, "-m", "gpufleet", "--data-dir", str(tmp_path), "sql", "--clickhouse-dsn",
                          f"http://reader:{clickhouse_password}@127.0.0.1:{free_port()}", "SELECT 1"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert cli.returncode != 0 and "cannot reach ClickHouse at http://reader:***@127.0.0.1:" in cli.stderr

    rows = []
    for table in ("dead_letters", "alerts"):
        result = chdb_client.query(f"SELECT * FROM {database}.{table}")
        rows += [str(v) for row in result.result_rows for v in row]
    seen = {"logs": caplog.text, "ClickHouse rows": "\n".join(rows), "the command line": cli.stdout + cli.stderr}
    for where, text in seen.items():
        for secret in secrets:
            assert secret not in text, f"a secret appears in {where}"
    assert len(caplog.records) > 10  # the logs were there to be read
