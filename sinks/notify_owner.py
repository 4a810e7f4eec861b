"""Messages an alert's owner and team: a Slack-compatible webhook (JSON, retried with backoff)
and e-mail over SMTP. What the message says comes from the alert itself (or, for a job
report, from ``sinks.job_report``).

A webhook's URL is its secret (whoever has it can post to the channel): it is never written to
a log or an error, only its scheme and host (``redact_url``). E-mail over TLS verifies the
server's certificate against the system's CAs or the routing file's ``ca_file``.
"""

from __future__ import annotations

import json
import logging
import smtplib
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from email.message import EmailMessage

from schemas.validate_ids import printable
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
    if alert.get("page_url"):
        lines.append(f"The job's page: {alert['page_url']}")
    return "\n".join(lines)


def redact_url(url: str) -> str:
    """What of a webhook's URL may be shown: its scheme and host (the path holds its secret)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparsable webhook URL>"
    return f"{parts.scheme or '?'}://{host}{port}/…"


def send_webhook(url: str, alert: dict, retries: int = 4, backoff_s: float = 0.5, timeout_s: float = 10.0) -> None:
    """POST the alert as a Slack-compatible message, the alert itself beside its text."""
    post_webhook(url, {"text": text(alert), "gpufleet_alert": alert}, "the alert", retries, backoff_s, timeout_s)


def slack_text(text: str) -> str:
    """``text`` as a Slack-compatible receiver shows it as written: ``&``, ``<`` and ``>`` as the
    entities Slack's formatting rules ask for (else ``<!channel>`` in a service's name pings a
    channel, ``<url|words>`` is a link, and ``kernel<float>`` loses its argument); receivers that
    read the text as Markdown decode them alike."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def post_webhook(url: str, payload: dict, what: str, retries: int = 4, backoff_s: float = 0.5,
                 timeout_s: float = 10.0) -> None:
    """POST ``payload`` as JSON, its ``text`` escaped for Slack (``slack_text``; the records beside
    it as they are); retry connection errors and 5xx/429 with backoff."""
    if "text" in payload:
        payload = {**payload, "text": slack_text(payload["text"])}
    body = json.dumps(payload).encode()
    shown = redact_url(url)
    try:
        urllib.request.Request(url)
    except ValueError:
        raise NotifyError(f"webhook {shown} is not a URL this notifier can post to") from None
    for attempt in range(retries + 1):
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                response.read()
                return
        except urllib.error.HTTPError as exc:
            if exc.code < 500 and exc.code != 429:
                raise NotifyError(f"webhook {shown} refused {what}: HTTP {exc.code}") from None
            error = f"HTTP {exc.code}"
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            error = _why(exc)
        if attempt == retries:
            raise NotifyError(f"webhook {shown} failed {retries + 1} times: {error}") from None
        delay = backoff_s * 2**attempt
        log.warning("webhook %s failed (%s); retry %d in %.1fs", shown, error, attempt + 1, delay)
        time.sleep(delay)


def _why(exc: BaseException) -> str:
    """An error's reason without the URL some of them carry."""
    reason = getattr(exc, "reason", None)
    return f"{type(exc).__name__}: {reason if reason is not None else exc}"


def header_safe(value: str) -> str:
    """A header value that cannot start another header: control characters are shown escaped."""
    return printable(value)


def tls_context(smtp: SmtpSettings) -> ssl.SSLContext:
    """Verifies the server's certificate and name: against ``ca_file`` when given, else the system's CAs."""
    return ssl.create_default_context(cafile=smtp.ca_file)


def send_email(smtp: SmtpSettings, to: str, alert: dict) -> None:
    deliver_email(smtp, to, subject(alert), text(alert))


def deliver_email(smtp: SmtpSettings, to: str, title: str, body: str, html: str | None = None) -> None:
    """Send ``body`` (plain text; with ``html`` as its HTML alternative) to ``to``."""
    where = f"e-mail to {header_safe(to)} via {smtp.host}:{smtp.port}"
    try:
        message = EmailMessage()
        message["From"], message["To"] = header_safe(smtp.sender), header_safe(to)
        message["Subject"] = header_safe(title)
        message.set_content(body)
        if html is not None:
            message.add_alternative(html, subtype="html")
    except (ValueError, TypeError) as exc:
        raise NotifyError(f"{where}: the message cannot be built: {exc}") from None
    if smtp.username and not (smtp.ssl or smtp.starttls):
        raise NotifyError(f"{where} refused: the SMTP password would go in clear; set starttls or ssl in [smtp]")
    try:
        if smtp.ssl:
            client = smtplib.SMTP_SSL(smtp.host, smtp.port, timeout=smtp.timeout_s, context=tls_context(smtp))
        else:
            client = smtplib.SMTP(smtp.host, smtp.port, timeout=smtp.timeout_s)
        with client:
            if smtp.starttls:
                client.starttls(context=tls_context(smtp))
            if smtp.username:
                client.login(smtp.username, smtp.password or "")
            client.send_message(message)
    except ssl.SSLCertVerificationError as exc:
        raise NotifyError(f"{where} refused: the server's certificate is not trusted ({exc.verify_message}); "
                          f"give its CA as ca_file in the routing file's [smtp]") from None
    except (smtplib.SMTPException, OSError) as exc:
        raise NotifyError(f"{where} failed: {type(exc).__name__}: {exc}") from None
