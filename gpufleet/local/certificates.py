"""A private certificate authority for the secure local cluster and the tests: one CA, a
certificate per broker (server) and per component (client, for mutual TLS).

Keys are ECDSA P-256, written as unencrypted PKCS#8 PEM files readable by their owner only
(mode 0600): Kafka reads them as a PEM key store, librdkafka and Python's ``ssl`` directly.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 825  # the longest validity clients accept for a server certificate


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpufleet"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def write_private(path: Path, data: bytes | str) -> None:
    """``data`` into ``path``, readable by its owner only (0600) from the first byte on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


class Authority:
    """A CA that signs server and client certificates."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        self.key, self.cert = key, cert

    @classmethod
    def create(cls, common_name: str = "gpufleet local CA") -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder()
                .subject_name(_name(common_name)).issuer_name(_name(common_name))
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .sign(key, hashes.SHA256()))
        return cls(key, cert)

    @classmethod
    def load(cls, cert: Path, key: Path) -> Authority:
        return cls(serialization.load_pem_private_key(key.read_bytes(), password=None),  # type: ignore[arg-type]
                   x509.load_pem_x509_certificate(cert.read_bytes()))

    def save(self, directory: Path) -> Issued:
        """``ca.pem`` (what every client and broker trusts) and ``ca.key`` (kept by its owner only)."""
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "ca.pem").write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        write_private(directory / "ca.key", _key_pem(self.key))
        return Issued(directory / "ca.pem", directory / "ca.key")

    def issue(self, directory: Path, name: str, hosts: tuple[str, ...] = (), server: bool = False,
              stem: str | None = None) -> Issued:
        """A certificate for ``name`` (its common name), valid for TLS clients, and for servers
        reached as ``hosts`` (DNS names or IP addresses) when ``server``. Written as
        ``<stem>.pem`` (the certificate, then the CA's) and ``<stem>.key`` (stem: ``name``)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
        builder = (x509.CertificateBuilder()
                   .subject_name(_name(name)).issuer_name(self.cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                                  critical=False))
        if hosts:
            names: list[x509.GeneralName] = []
            for h in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    names.append(x509.DNSName(h))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        directory.mkdir(parents=True, exist_ok=True)
        chain = cert.public_bytes(serialization.Encoding.PEM) + self.cert.public_bytes(serialization.Encoding.PEM)
        stem = stem or name
        (directory / f"{stem}.pem").write_bytes(chain)
        write_private(directory / f"{stem}.key", _key_pem(key))
        return Issued(directory / f"{stem}.pem", directory / f"{stem}.key")
