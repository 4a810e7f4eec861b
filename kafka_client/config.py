"""Client settings every gpufleet component shares, so that all of them speak to Kafka alike:
where the cluster is, how to prove who they are, and the producer and consumer defaults.

A component is given a :class:`Connection` (or a bare bootstrap string, which means
PLAINTEXT): the bootstrap servers and the :class:`Security` settings, which go the same way to
confluent-kafka (``client_config``) and to aiokafka inside Faust (``faust_credentials``).

Security settings come from the environment or from a client properties file, never only from
the command line (where any user of the host can read them in the process list):

=============================== ==============================================================
``GPUFLEET_KAFKA_CONFIG``       a properties file with the keys below (librdkafka's names)
``GPUFLEET_KAFKA_SECURITY_PROTOCOL`` ``security.protocol``: PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL
``GPUFLEET_KAFKA_SASL_MECHANISM``   ``sasl.mechanism``: SCRAM-SHA-512 (default), SCRAM-SHA-256, PLAIN
``GPUFLEET_KAFKA_USERNAME``     ``sasl.username``
``GPUFLEET_KAFKA_PASSWORD``     ``sasl.password`` (or ``GPUFLEET_KAFKA_PASSWORD_FILE``: a file holding it)
``GPUFLEET_KAFKA_CA``           ``ssl.ca.location``: the CA that signed the brokers' certificates
``GPUFLEET_KAFKA_CERT``         ``ssl.certificate.location``: this client's certificate (mutual TLS)
``GPUFLEET_KAFKA_KEY``          ``ssl.key.location``: its key
=============================== ==============================================================

The environment overrides the file. The password is held in a :class:`Secret`, which never
shows its value in a ``repr``, a log line or an exception.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

# librdkafka's own log lines go through Python logging, under this logger.
LIBRDKAFKA_LOG = logging.getLogger("librdkafka")

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
ENV_PREFIX = "GPUFLEET_KAFKA_"
# The worker's Faust app id: its consumer group and the prefix of its changelog topics, unless given.
WORKER_APP_ID = "gpufleet-worker"

# Client property (librdkafka's name) -> the Security field it sets.
_PROPERTIES = {
    "security.protocol": "protocol",
    "sasl.mechanism": "mechanism",
    "sasl.mechanisms": "mechanism",
    "sasl.username": "username",
    "sasl.password": "password",
    "ssl.ca.location": "ca_file",
    "ssl.certificate.location": "cert_file",
    "ssl.key.location": "key_file",
}
_ENVIRONMENT = {
    "SECURITY_PROTOCOL": "protocol",
    "SASL_MECHANISM": "mechanism",
    "USERNAME": "username",
    "PASSWORD": "password",
    "CA": "ca_file",
    "CERT": "cert_file",
    "KEY": "key_file",
}


class KafkaConfigError(ValueError):
    """The Kafka client settings are incomplete or contradict each other; the text says how."""


class Secret:
    """A value that is never shown: ``repr`` and ``str`` say ``'***'``; ``reveal()`` gives it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class Security:
    """How a client proves who it is and checks whom it talks to."""

    protocol: str = "PLAINTEXT"
    mechanism: str = "SCRAM-SHA-512"
    username: str | None = None
    password: Secret | None = field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise KafkaConfigError(f"security.protocol {self.protocol!r} is not one of {', '.join(PROTOCOLS)}")
        if self.sasl:
            if self.mechanism not in MECHANISMS:
                raise KafkaConfigError(f"sasl.mechanism {self.mechanism!r} is not one of {', '.join(MECHANISMS)}")
            if not self.username or self.password is None:
                raise KafkaConfigError(f"{self.protocol} needs a user name and a password "
                                       f"({ENV_PREFIX}USERNAME and {ENV_PREFIX}PASSWORD or _PASSWORD_FILE)")
        if bool(self.cert_file) != bool(self.key_file):
            raise KafkaConfigError("a client certificate needs its key, and a key its certificate")
        if (self.cert_file or self.ca_file) and not self.tls:
            raise KafkaConfigError(f"a CA or client certificate is given, but security.protocol is "
                                   f"{self.protocol}, which does not use TLS")
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise KafkaConfigError(f"{name.replace('_', ' ')} {path} does not exist")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def principal(self) -> str:
        """Who the brokers will take this client for (for messages; the brokers decide)."""
        if self.sasl:
            return f"User:{self.username}"
        return "a certificate's subject" if self.cert_file else "User:ANONYMOUS"

    def librdkafka(self) -> dict:
        """These settings in confluent-kafka's (librdkafka's) words."""
        config: dict = {"security.protocol": self.protocol}
        if self.sasl:
            config |= {"sasl.mechanism": self.mechanism, "sasl.username": self.username,
                       "sasl.password": self.password.reveal()}  # type: ignore[union-attr]
        if self.tls:
            if self.ca_file:
                config["ssl.ca.location"] = self.ca_file
            if self.cert_file:
                config |= {"ssl.certificate.location": self.cert_file, "ssl.key.location": self.key_file}
        return config

    def ssl_context(self) -> ssl.SSLContext | None:
        """For Python clients (aiokafka): verifies the brokers' certificates and names, and
        presents this client's certificate when one is given."""
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def faust_credentials(self):
        """These settings as Faust's ``broker_credentials`` (None for PLAINTEXT)."""
        import faust  # the worker's dependency; the agents never load it

        if self.sasl:
            return faust.SASLCredentials(username=self.username, password=self.password.reveal(),  # type: ignore[union-attr]
                                         ssl_context=self.ssl_context(), mechanism=self.mechanism)
        if self.tls:
            return faust.SSLCredentials(self.ssl_context())
        return None

    @classmethod
    def from_properties(cls, path: Path) -> Security:
        """Read a client properties file (``key=value`` lines, librdkafka's key names)."""
        values: dict[str, object] = {}
        for number, line in enumerate(Path(path).read_text().splitlines(), 1):
            line = line.strip()
            if not line or line.startswith(("#", "!")):
                continue
            key, sep, value = line.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or key not in _PROPERTIES:
                raise KafkaConfigError(f"{path}:{number}: {key!r} is not a setting gpufleet reads; "
                                       f"known: {', '.join(sorted(_PROPERTIES))}")
            values[_PROPERTIES[key]] = Secret(value) if key == "sasl.password" else value
        if "password" in values:
            _check_private(Path(path))
        return cls(**values)  # type: ignore[arg-type]

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> Security:
        """The settings in ``env`` (the process's environment by default), over the properties
        file that ``GPUFLEET_KAFKA_CONFIG`` names, if any."""
        env = os.environ if env is None else env
        base = cls.from_properties(Path(env[ENV_PREFIX + "CONFIG"])) if env.get(ENV_PREFIX + "CONFIG") else None
        values: dict[str, object] = {}
        for suffix, name in _ENVIRONMENT.items():
            if env.get(ENV_PREFIX + suffix):
                values[name] = env[ENV_PREFIX + suffix]
        if env.get(ENV_PREFIX + "PASSWORD_FILE"):
            password_file = Path(env[ENV_PREFIX + "PASSWORD_FILE"])
            _check_private(password_file)
            values["password"] = password_file.read_text().strip()
        if "password" in values:
            values["password"] = Secret(str(values["password"]))
        if base is None:
            return cls(**values)  # type: ignore[arg-type]
        return replace(base, **values)  # type: ignore[arg-type]


def _check_private(path: Path) -> None:
    """A file holding a password must not be readable by others."""
    mode = path.stat().st_mode
    if mode & 0o077:
        raise KafkaConfigError(f"{path} holds a password but others may read it (mode {mode & 0o777:o}): "
                               f"chmod 600 {path}")


@dataclass(frozen=True)
class Connection:
    """Where a Kafka cluster is and how to talk to it."""

    bootstrap: str
    security: Security = field(default_factory=Security)

    def __str__(self) -> str:
        return f"{self.bootstrap} ({self.security.protocol}, {self.security.principal})"


def connection(kafka: str | Connection) -> Connection:
    """``kafka`` as a :class:`Connection`: a bare bootstrap string is a PLAINTEXT cluster."""
    return kafka if isinstance(kafka, Connection) else Connection(kafka)


def client_config(kafka: str | Connection, **overrides: object) -> dict:
    """The settings every confluent-kafka client (admin included) needs to reach the cluster."""
    kafka = connection(kafka)
    config = {"bootstrap.servers": kafka.bootstrap, **kafka.security.librdkafka(), "logger": LIBRDKAFKA_LOG}
    config.update(overrides)
    return config


def producer_config(kafka: str | Connection, **overrides: object) -> dict:
    """Idempotent (no duplicates or reordering on retry), batched and compressed; keys are
    partitioned with murmur2 like the Java client and aiokafka, so a workflow's records land
    on the same partition whichever client wrote them."""
    config = client_config(kafka)
    config |= {
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 20,
        "compression.type": "lz4",
        "partitioner": "murmur2_random",
    }
    config.update(overrides)
    return config


def consumer_config(kafka: str | Connection, group_id: str, **overrides: object) -> dict:
    """Manual commits (after the work is done) and reading from the start of new groups."""
    config = client_config(kafka)
    config |= {
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
    }
    config.update(overrides)
    return config


def check_access(kafka: str | Connection, timeout: float = 15.0) -> None:
    """Return once the cluster answers this client; raise :class:`KafkaConfigError` saying why
    it does not (refused credentials or certificate, an unverifiable broker, no answer), at the
    first such error instead of after librdkafka's retries."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    kafka = connection(kafka)
    errors: list = []
    admin = AdminClient(client_config(kafka, error_cb=errors.append, log_level=0))
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin.list_topics(timeout=1.0)
            return
        except KafkaException:
            admin.poll(0)
        reason = _refusal(kafka, errors)
        if reason is not None:
            raise KafkaConfigError(reason)
        if time.monotonic() > deadline:
            last = errors[-1].str() if errors else "no error reported"
            raise KafkaConfigError(
                f"no Kafka broker at {kafka.bootstrap} answered {kafka.security.principal} over "
                f"{kafka.security.protocol} within {timeout:g}s ({last}); check the address, and that "
                f"the listener speaks {kafka.security.protocol}")


def _refusal(kafka: Connection, errors: list) -> str | None:
    """Why the brokers will not talk to this client, in words, if the errors so far tell."""
    for error in errors:
        text = error.str()
        who = f"Kafka at {kafka.bootstrap} refused {kafka.security.principal}"
        if error.name() == "_AUTHENTICATION":
            return f"{who}: its credentials are wrong (the user name or password; {text})"
        if "bad certificate" in text or "certificate required" in text:
            return (f"{who}: it presented no client certificate, or one the brokers' CA did not sign "
                    f"({ENV_PREFIX}CERT and {ENV_PREFIX}KEY; {text})")
        if error.name() == "_SSL" and "verify failed" in text:
            return (f"the brokers at {kafka.bootstrap} presented a certificate this client cannot verify: "
                    f"give the CA that signed it as {ENV_PREFIX}CA ({text})")
    return None
