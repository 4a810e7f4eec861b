"""Who hears about an alert, from a routing file (TOML): webhooks per team, e-mail per owner.

    [default]
    webhook = "https://hooks.slack.com/services/..."   # optional fallback for every team
    email_owners = true                                  # owners that look like addresses get mail
    job_reports = true                                   # a report to the owner when a job ends
    serving_digest_s = 300                               # a service's idle replicas in one message, held
                                                         # this long from the first (0: one each, at once)

    [teams.nlp]
    webhook = "https://hooks.slack.com/services/..."
    job_reports = false                                  # a team may choose otherwise

    [owners."ana"]
    email = "ana@example.com"

    [smtp]
    host = "smtp.example.com"
    port = 587
    starttls = true
    username = "gpufleet"
    password_env = "GPUFLEET_SMTP_PASSWORD"   # the secret stays in the environment,
    # password_file = "/run/secrets/smtp"     # or in a file
    sender = "gpufleet@example.com"
    # ca_file = "/etc/gpufleet/smtp-ca.pem"   # the server's certificate is always verified:
                                              # against the system's CAs unless this is given
"""

from __future__ import annotations

import os
import tomllib
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import msgspec


@dataclass(frozen=True)
class SmtpSettings:
    host: str = "localhost"
    port: int = 25
    starttls: bool = False
    ssl: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sender: str = "gpufleet@localhost"
    timeout_s: float = 10.0
    ca_file: str | None = None


@dataclass(frozen=True)
class Routing:
    default_webhook: str | None = None
    email_owners: bool = False
    team_webhooks: dict[str, str] = field(default_factory=dict)
    owner_emails: dict[str, str] = field(default_factory=dict)
    smtp: SmtpSettings | None = None
    job_reports: bool = False
    team_job_reports: dict[str, bool] = field(default_factory=dict)
    pages: str | None = None  # the owners' service (`gpufleet serve`) as users reach it: every message links there
    serving_digest_s: float = 300.0  # a service's idle replicas told together (sinks.serving_digest); 0: each at once

    def page_for(self, workflow_id: str) -> str | None:
        """The job's page on the owners' service, if one is configured."""
        return None if self.pages is None else page_url(self.pages, workflow_id)

    def job_report_for(self, summary: dict) -> bool:
        """Whether the owner of an ended workflow gets its job report."""
        return self.team_job_reports.get(summary.get("team") or "", self.job_reports)

    def webhook_for(self, alert: dict) -> str | None:
        return self.team_webhooks.get(alert.get("team") or "", self.default_webhook)

    def email_for(self, alert: dict) -> str | None:
        if self.smtp is None:
            return None
        owner = alert.get("owner") or ""
        if owner in self.owner_emails:
            return self.owner_emails[owner]
        if self.email_owners and "@" in owner:
            return owner
        return None


class RoutingError(ValueError):
    """A routing file that cannot be used; the text says where and why."""


class _Default(msgspec.Struct, forbid_unknown_fields=True):
    webhook: str | None = None
    email_owners: bool = False
    job_reports: bool = False
    pages: str | None = None
    serving_digest_s: float = 300.0


class _Team(msgspec.Struct, forbid_unknown_fields=True):
    webhook: str | None = None
    job_reports: bool | None = None


class _Owner(msgspec.Struct, forbid_unknown_fields=True):
    email: str | None = None


class _Smtp(msgspec.Struct, forbid_unknown_fields=True):
    host: str = "localhost"
    port: int = 25
    starttls: bool = False
    ssl: bool = False
    username: str | None = None
    password: str | None = None
    password_env: str | None = None
    password_file: str | None = None
    sender: str = "gpufleet@localhost"
    ca_file: str | None = None


class _RoutingFile(msgspec.Struct, forbid_unknown_fields=True):
    default: _Default = msgspec.field(default_factory=_Default)
    teams: dict[str, _Team] = {}
    owners: dict[str, _Owner] = {}
    smtp: _Smtp | None = None


def _webhook(path: Path, where: str, url: str | None) -> str | None:
    if url is not None and urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise RoutingError(f"{path}: {where} webhook {url!r} is not a URL (http:// or https://)")
    if url is not None and not urllib.parse.urlsplit(url).hostname:
        raise RoutingError(f"{path}: {where} webhook {url!r} names no host")
    return url


def load_routing(path: Path) -> Routing:
    """Read a routing file, checked: its tables and keys as above, of the right kinds, webhooks
    that are URLs; a key left out means "no such channel". RoutingError says where and why."""
    try:
        raw = msgspec.convert(tomllib.loads(Path(path).read_text()), _RoutingFile)
    except tomllib.TOMLDecodeError as exc:
        raise RoutingError(f"{path}: not valid TOML: {exc}") from None
    except msgspec.ValidationError as exc:
        raise RoutingError(f"{path}: {exc}") from None
    smtp = None
    if raw.smtp is not None:
        s = raw.smtp
        if not 0 < s.port < 65536:
            raise RoutingError(f"{path}: [smtp] port {s.port} is not a port")
        password = s.password
        if s.password_env:
            password = os.environ.get(s.password_env)
        if s.password_file:
            password = Path(s.password_file).read_text().strip()
        smtp = SmtpSettings(host=s.host, port=s.port, starttls=s.starttls, ssl=s.ssl, username=s.username,
                            password=password, sender=s.sender, ca_file=s.ca_file)
    if not 0 <= raw.default.serving_digest_s <= 86400:
        raise RoutingError(f"{path}: [default] serving_digest_s {raw.default.serving_digest_s:g} is not 0 to 86400 "
                           "seconds (how long a service's idle replicas are held to be told together; 0: each at once)")
    for owner, o in raw.owners.items():
        if o.email is not None and "@" not in o.email:
            raise RoutingError(f"{path}: [owners.{owner!r}] email {o.email!r} is not an address")
    return Routing(
        default_webhook=_webhook(path, "[default]", raw.default.webhook),
        email_owners=raw.default.email_owners,
        team_webhooks={team: _webhook(path, f"[teams.{team}]", t.webhook) for team, t in raw.teams.items()
                       if t.webhook is not None},
        owner_emails={owner: o.email for owner, o in raw.owners.items() if o.email is not None},
        smtp=smtp,
        job_reports=raw.default.job_reports,
        team_job_reports={team: t.job_reports for team, t in raw.teams.items() if t.job_reports is not None},
        pages=_pages(path, raw.default.pages),
        serving_digest_s=raw.default.serving_digest_s,
    )


def _pages(path: Path, url: str | None) -> str | None:
    if url is None:
        return None
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise RoutingError(f"{path}: [default] pages {url!r} is not the http(s):// address of `gpufleet serve`")
    return url.rstrip("/")


def page_url(base_url: str, workflow_id: str) -> str:
    """A job's page on the owners' service at ``base_url``: what messages link to."""
    return f"{base_url.rstrip('/')}/jobs/{urllib.parse.quote(workflow_id, safe='')}"


def service_url(base_url: str, service: str) -> str:
    """A serving service's page on the owners' service at ``base_url``."""
    return f"{base_url.rstrip('/')}/services/{urllib.parse.quote(service, safe='')}"
