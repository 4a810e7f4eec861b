"""Who hears about an alert, from a routing file (TOML): webhooks per team, e-mail per owner.

    [default]
    webhook = "https://hooks.slack.com/services/..."   # optional fallback for every team
    email_owners = true                                  # owners that look like addresses get mail
    job_reports = true                                   # a report to the owner when a job ends

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
from dataclasses import dataclass, field
from pathlib import Path


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


def load_routing(path: Path) -> Routing:
    """Read a routing file; a missing key means "no such channel", never an error."""
    raw = tomllib.loads(Path(path).read_text())
    default = raw.get("default", {})
    smtp_raw = raw.get("smtp")
    smtp = None
    if smtp_raw is not None:
        password = smtp_raw.get("password")
        if smtp_raw.get("password_env"):
            password = os.environ.get(smtp_raw["password_env"])
        if smtp_raw.get("password_file"):
            password = Path(smtp_raw["password_file"]).read_text().strip()
        smtp = SmtpSettings(
            host=smtp_raw.get("host", "localhost"), port=int(smtp_raw.get("port", 25)),
            starttls=bool(smtp_raw.get("starttls", False)), ssl=bool(smtp_raw.get("ssl", False)),
            username=smtp_raw.get("username"), password=password,
            sender=smtp_raw.get("sender", "gpufleet@localhost"), ca_file=smtp_raw.get("ca_file"),
        )
    return Routing(
        default_webhook=default.get("webhook"),
        email_owners=bool(default.get("email_owners", False)),
        team_webhooks={team: t["webhook"] for team, t in raw.get("teams", {}).items() if "webhook" in t},
        owner_emails={owner: o["email"] for owner, o in raw.get("owners", {}).items() if "email" in o},
        smtp=smtp,
        job_reports=bool(default.get("job_reports", False)),
        team_job_reports={team: bool(t["job_reports"]) for team, t in raw.get("teams", {}).items()
                          if "job_reports" in t},
    )
