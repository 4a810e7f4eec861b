"""Who is asking the owners' service, the two ways the sites our users run already tell it.

On the web, the site's authenticating reverse proxy (Open OnDemand, oauth2-proxy, Apache or
nginx with the site's single sign-on) names the user in a header (``X-Forwarded-User`` by
default). The header is believed only from the proxy's own addresses (``trusted``): from any
other address a request is refused, whatever it claims, since anyone can write a header.

On a login node, ``gpufleet job`` and ``gpufleet jobs`` send a MUNGE credential, the one every
Slurm cluster already runs (``munge``/``unmunge``): munged encodes the caller's uid as the
kernel reports it, and only the service's own munged (sharing the cluster's key) can decode it.
The credential's payload names the request it was made for (method and path), so a
credential taken from one request cannot be sent with another; munged refuses one decoded
twice (a replay) and one older than its time-to-live (5 minutes by default).
"""

from __future__ import annotations

import ipaddress
import pwd
import subprocess
from dataclasses import dataclass

from gpufleet.errors import Failed

MUNGE_HEADER = "X-Gpufleet-Munge"
DEFAULT_USER_HEADER = "X-Forwarded-User"
MAX_CREDENTIAL_BYTES = 4096


class IdentityError(Failed):
    """A request whose asker cannot be known; the text says why (shown to them)."""


def request_payload(method: str, path: str) -> str:
    """What a MUNGE credential of the command line carries: the one request it is good for."""
    return f"gpufleet {method.upper()} {path}"


@dataclass(frozen=True)
class ProxyTrust:
    """The addresses whose ``header`` names the user (none: the header is never believed)."""

    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    header: str = DEFAULT_USER_HEADER

    @classmethod
    def parse(cls, addresses: list[str], header: str = DEFAULT_USER_HEADER) -> ProxyTrust:
        try:
            return cls(tuple(ipaddress.ip_network(a, strict=False) for a in addresses), header)
        except ValueError as exc:
            raise ValueError(f"--trusted-proxy: {exc}") from None

    def trusts(self, address: str | None) -> bool:
        if not address:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in n for n in self.networks)


class Munge:
    """Decodes credentials with ``unmunge`` on ``socket`` (munged's default where None)."""

    def __init__(self, socket: str | None = None, unmunge: str = "unmunge", timeout_s: float = 5.0) -> None:
        self.socket, self.unmunge, self.timeout_s = socket, unmunge, timeout_s

    def decode(self, credential: str, payload: str) -> str:
        """The user name of the credential's uid, if it was made for ``payload``; else IdentityError."""
        if not credential or len(credential) > MAX_CREDENTIAL_BYTES or not credential.isascii():
            raise IdentityError("the MUNGE credential is missing or malformed")
        argv = [self.unmunge, *(["--socket", self.socket] if self.socket else [])]
        try:
            done = subprocess.run(argv, input=credential.encode(), capture_output=True, timeout=self.timeout_s,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise IdentityError(f"MUNGE could not be asked ({exc.__class__.__name__}); try again") from None
        head, _, body = done.stdout.decode(errors="replace").partition("\n\n")
        fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in head.splitlines())}
        status = fields.get("STATUS", "")
        if done.returncode != 0 or not status.endswith("(0)"):  # expired, replayed, invalid: munged's own words
            reason = status or done.stderr.decode(errors="replace").strip().removeprefix("unmunge: Error: ")
            raise IdentityError(f"the MUNGE credential was refused: {reason or 'unmunge failed'}")
        if body != payload:
            raise IdentityError("the MUNGE credential was made for another request")
        try:
            uid = int(fields["UID"].rsplit("(", 1)[-1].rstrip(")"))  # "ana (1001)"
        except (KeyError, ValueError, IndexError):
            raise IdentityError("MUNGE gave no uid") from None
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            raise IdentityError(f"the credential's uid {uid} is no user of this host") from None


def munge_credential(payload: str, socket: str | None = None, munge: str = "munge", timeout_s: float = 5.0) -> str:
    """A credential of this process's user for ``payload`` (``munge -s``), else IdentityError."""
    argv = [munge, "--string", payload, *(["--socket", socket] if socket else [])]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise IdentityError(f"cannot make a MUNGE credential ({exc}); is munged running on this host?") from None
    if done.returncode != 0:
        raise IdentityError(f"cannot make a MUNGE credential: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode().strip()
