"""Messages an alert's owner and team: a Slack-compatible webhook (JSON, retried with backoff)
and e-mail over SMTP. What the message says comes from the alert itself."""

from __future__ import annotations

import json
import logging
import smtplib
import time
import urllib.error
import urllib.request
from email.message import EmailMessage

from sinks.route_alerts import SmtpSettings

log = logging.getLogger(__name__)


class NotifyError(RuntimeError):
    """A channel refused the message for good (after retries where a retry could help)."""


def is_root_cause(alert: dict) -> bool:
    """A FIRING alert sent again with what its automatic profile found."""
    return alert["status"] == "FIRING" and bool(alert.get("root_cause"))


def subject(alert: dict) -> str:
    if alert["status"] == "RESOLVED":
        verb = "resolved"
    elif is_root_cause(alert):
        verb = "root cause"
    else:
        verb = alert["severity"].lower()
    return f"[gpufleet {verb}] {alert['detector'].replace('_', ' ')}: {alert['workflow_id']}"


def text(alert: dict) -> str:
    lines = [subject(alert), "", alert["message"]]
    if alert["status"] != "RESOLVED":
        lines += ["", f"What to try: {alert['advice']}"]
    findings = alert.get("findings") or []
    if findings and alert["status"] != "RESOLVED":
        lines += ["", f"What the automatic profile ({alert.get('profile_request_id')}) found:"]
        for f in findings:
            at_stake = f"{f['gpu_seconds_at_stake']:.2f} GPU-s at stake"
            lines += [f"- {f['title']} [{f['severity']}, {at_stake}]: {f['evidence']}", f"  try: {f['recommendation']}"]
    who = f"owner {alert.get('owner') or '?'}, team {alert.get('team') or '?'}"
    lines += ["", f"Workflow {alert['workflow_id']} ({who}); alert {alert['alert_id']}."]
    return "\n".join(lines)


def send_webhook(url: str, alert: dict, retries: int = 4, backoff_s: float = 0.5, timeout_s: float = 10.0) -> None:
    """POST a Slack-compatible message; retry connection errors and 5xx/429 with backoff."""
    body = json.dumps({"text": text(alert), "gpufleet_alert": alert}).encode()
    for attempt in range(retries + 1):
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                response.read()
                return
        except urllib.error.HTTPError as exc:
            if exc.code < 500 and exc.code != 429:
                raise NotifyError(f"webhook {url} refused the alert: HTTP {exc.code}") from exc
            error: Exception = exc
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            error = exc
        if attempt == retries:
            raise NotifyError(f"webhook {url} failed {retries + 1} times: {error}") from error
        delay = backoff_s * 2**attempt
        log.warning("webhook %s failed (%s); retry %d in %.1fs", url, error, attempt + 1, delay)
        time.sleep(delay)


def send_email(smtp: SmtpSettings, to: str, alert: dict) -> None:
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = smtp.sender, to, subject(alert)
    message.set_content(text(alert))
    client_class = smtplib.SMTP_SSL if smtp.ssl else smtplib.SMTP
    try:
        with client_class(smtp.host, smtp.port, timeout=smtp.timeout_s) as client:
            if smtp.starttls:
                client.starttls()
            if smtp.username:
                client.login(smtp.username, smtp.password or "")
            client.send_message(message)
    except (smtplib.SMTPException, OSError) as exc:
        raise NotifyError(f"e-mail to {to} via {smtp.host}:{smtp.port} failed: {exc}") from exc
