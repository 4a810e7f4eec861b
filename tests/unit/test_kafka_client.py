"""Kafka client security settings: where they come from, where they go, what they never show."""

from __future__ import annotations

import ssl

import pytest

from gpufleet.local.certificates import Authority
from kafka_client.config import (
    Connection,
    KafkaConfigError,
    Secret,
    Security,
    client_config,
    producer_config,
)

PASSWORD = "s3cr3t-Value"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    ca = Authority.create()
    issued = ca.issue(directory, "agent")
    return ca.save(directory).cert, issued.cert, issued.key


def test_plaintext_is_the_default_and_a_bare_bootstrap_means_it():
    assert client_config("h:9092")["security.protocol"] == "PLAINTEXT"
    assert client_config("h:9092")["bootstrap.servers"] == "h:9092"


def test_sasl_ssl_from_the_environment_reaches_librdkafka(pki, tmp_path):
    ca, cert, key = pki
    env = {"GPUFLEET_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "GPUFLEET_KAFKA_USERNAME": "agent",
           "GPUFLEET_KAFKA_PASSWORD": PASSWORD, "GPUFLEET_KAFKA_CA": str(ca), "GPUFLEET_KAFKA_CERT": str(cert),
           "GPUFLEET_KAFKA_KEY": str(key)}
    config = producer_config(Connection("h:9093", Security.from_environment(env)))
    assert {k: config[k] for k in ("security.protocol", "sasl.mechanism", "sasl.username", "sasl.password",
                                   "ssl.ca.location", "ssl.certificate.location", "ssl.key.location")} == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "agent",
        "sasl.password": PASSWORD, "ssl.ca.location": str(ca), "ssl.certificate.location": str(cert),
        "ssl.key.location": str(key)}
    assert config["enable.idempotence"] is True  # the producer's own settings stay


def test_plain_mechanism_and_a_password_file(tmp_path):
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o600)
    security = Security.from_environment({"GPUFLEET_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                                          "GPUFLEET_KAFKA_SASL_MECHANISM": "PLAIN", "GPUFLEET_KAFKA_USERNAME": "u",
                                          "GPUFLEET_KAFKA_PASSWORD_FILE": str(secret)})
    assert security.librdkafka()["sasl.mechanism"] == "PLAIN"
    assert security.password == Secret(PASSWORD)


def test_a_password_file_others_can_read_is_refused(tmp_path):
    secret = tmp_path / "password"
    secret.write_text(PASSWORD)
    secret.chmod(0o644)
    with pytest.raises(KafkaConfigError, match="others may read it .*chmod 600"):
        Security.from_environment({"GPUFLEET_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "GPUFLEET_KAFKA_USERNAME": "u",
                                   "GPUFLEET_KAFKA_PASSWORD_FILE": str(secret)})


def test_a_properties_file_under_the_environment(pki, tmp_path):
    ca, _cert, _key = pki
    path = tmp_path / "client.properties"
    path.write_text(f"# the sink\nsecurity.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=sink\n"
                    f"sasl.password={PASSWORD}\nssl.ca.location={ca}\n")
    path.chmod(0o600)
    security = Security.from_environment({"GPUFLEET_KAFKA_CONFIG": str(path), "GPUFLEET_KAFKA_USERNAME": "other"})
    assert security.username == "other" and security.password == Secret(PASSWORD) and security.ca_file == str(ca)
    path.write_text("security.protocol=SSL\nssl.endpoint.identification.algorithm=none\n")
    with pytest.raises(KafkaConfigError, match="'ssl.endpoint.identification.algorithm' is not a setting"):
        Security.from_properties(path)


@pytest.mark.parametrize("values, says", [
    ({"protocol": "SASL_SSL"}, "needs a user name and a password"),
    ({"protocol": "TLS"}, "is not one of PLAINTEXT, SSL"),
    ({"protocol": "SASL_SSL", "mechanism": "GSSAPI", "username": "u", "password": Secret("p")},
     "sasl.mechanism 'GSSAPI' is not one of"),
    ({"protocol": "SSL", "cert_file": "/nonexistent.pem"}, "needs its key"),
    ({"protocol": "PLAINTEXT", "ca_file": "/etc/hostname"}, "does not use TLS"),
    ({"protocol": "SSL", "ca_file": "/nonexistent/ca.pem"}, "ca file /nonexistent/ca.pem does not exist"),
])
def test_settings_that_cannot_work_are_refused_saying_how(values, says):
    with pytest.raises(KafkaConfigError, match=says):
        Security(**values)


def test_the_password_never_shows(pki):
    ca, _cert, _key = pki
    security = Security("SASL_SSL", username="agent", password=Secret(PASSWORD), ca_file=str(ca))
    for text in (repr(security), str(security), repr(Connection("h:1", security)), str(Connection("h:1", security)),
                 repr(security.password), f"{security.password}"):
        assert PASSWORD not in text
    assert security.password.reveal() == PASSWORD


def test_faust_gets_the_same_settings(pki):
    import faust

    ca, cert, key = pki
    sasl = Security("SASL_SSL", username="worker", password=Secret(PASSWORD), ca_file=str(ca), cert_file=str(cert),
                    key_file=str(key)).faust_credentials()
    assert isinstance(sasl, faust.SASLCredentials)
    assert (sasl.protocol.value, sasl.mechanism.value, sasl.username, sasl.password) == (
        "SASL_SSL", "SCRAM-SHA-512", "worker", PASSWORD)
    assert sasl.ssl_context.verify_mode == ssl.CERT_REQUIRED and sasl.ssl_context.check_hostname
    mtls = Security("SSL", ca_file=str(ca), cert_file=str(cert), key_file=str(key)).faust_credentials()
    assert isinstance(mtls, faust.SSLCredentials) and mtls.protocol.value == "SSL"
    assert Security().faust_credentials() is None
