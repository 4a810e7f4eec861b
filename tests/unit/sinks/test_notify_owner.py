"""The channels to owners: what they say of a secret, of a hostile id, and of an untrusted server."""

from __future__ import annotations

import json
import logging
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from aiosmtpd.controller import Controller

from gpufleet.local.certificates import Authority
from gpufleet.local.ports import free_port
from sinks.notify_owner import NotifyError, redact_url, send_email, send_webhook
from sinks.route_alerts import SmtpSettings
from tests.support.alerts import Mailbox, Refusing, alert

SECRET = "T000/B000/XXXXsecretXXXX"




@pytest.fixture
def refusing_server():
    http = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{http.server_address[1]}"
    http.shutdown()


def test_redact_url_keeps_scheme_and_host_only():
    assert redact_url(f"https://hooks.slack.com/services/{SECRET}?token=x") == "https://hooks.slack.com/…"
    assert redact_url("http://127.0.0.1:8080/x/y") == "http://127.0.0.1:8080/…"


@pytest.mark.parametrize("path, says", [("/forbidden/", "HTTP 403"), ("/busy/", "failed 2 times: HTTP 503")])
def test_a_webhook_error_never_shows_its_url(refusing_server, caplog, path, says):
    url = refusing_server + path + SECRET
    with caplog.at_level(logging.DEBUG), pytest.raises(NotifyError) as raised:
        send_webhook(url, alert("a1", "FIRING", True, "t", "o"), retries=1, backoff_s=0.01)
    assert says in str(raised.value) and refusing_server in str(raised.value)
    assert SECRET not in str(raised.value) and SECRET not in caplog.text
    assert raised.value.__cause__ is None and raised.value.__suppress_context__  # no chained error carries it


@pytest.mark.parametrize("url", [f"htp:/{SECRET}", f"{SECRET}", f"ftp://host/{SECRET}"])
def test_a_malformed_webhook_url_is_refused_without_showing_it(url, caplog):
    with caplog.at_level(logging.DEBUG), pytest.raises(NotifyError) as raised:
        send_webhook(url, alert("a1", "FIRING", True, "t", "o"), retries=0)
    assert SECRET not in str(raised.value) and SECRET not in caplog.text


@pytest.fixture(scope="module")
def tls_mail_server(tmp_path_factory):
    """An SMTP server over TLS whose certificate a private CA signed (not one the system trusts)."""
    directory = tmp_path_factory.mktemp("smtp-tls")
    ca = Authority.create("smtp test CA")
    ca_files = ca.save(directory)
    issued = ca.issue(directory, "localhost", hosts=("localhost", "127.0.0.1"), server=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(issued.cert, issued.key)
    mailbox = Mailbox()
    controller = Controller(mailbox, hostname="127.0.0.1", port=free_port(), ssl_context=context)
    controller.start()
    yield controller, mailbox, ca_files.cert
    controller.stop()


def test_smtp_refuses_a_server_it_cannot_verify(tls_mail_server):
    controller, mailbox, _ = tls_mail_server
    smtp = SmtpSettings(host="localhost", port=controller.port, ssl=True)
    with pytest.raises(NotifyError, match="certificate is not trusted .*give its CA as ca_file"):
        send_email(smtp, "ana@example.com", alert("a1", "FIRING", True, "t", "ana@example.com"))
    assert mailbox.messages == []


def test_smtp_delivers_to_a_server_signed_by_the_given_ca(tls_mail_server):
    controller, mailbox, ca = tls_mail_server
    smtp = SmtpSettings(host="localhost", port=controller.port, ssl=True, ca_file=str(ca))
    before = len(mailbox.messages)
    send_email(smtp, "ana@example.com", alert("a2", "FIRING", True, "t", "ana@example.com"))
    assert len(mailbox.messages) == before + 1


def test_a_newline_in_an_id_cannot_add_a_header(tls_mail_server):
    """Ids are refused at ingest; the notifier is safe on its own all the same."""
    controller, mailbox, ca = tls_mail_server
    smtp = SmtpSettings(host="localhost", port=controller.port, ssl=True, ca_file=str(ca))
    hostile = alert("a3", "FIRING", True, "t", "ana@example.com")
    hostile["workflow_id"] = "wf\nBcc: everyone@example.com"
    send_email(smtp, "ana@example.com", hostile)
    _, content = mailbox.messages[-1]
    headers = content.split("\r\n\r\n", 1)[0] if "\r\n\r\n" in content else content.split("\n\n", 1)[0]
    assert "Bcc:" not in [line.split(" ", 1)[0] for line in headers.splitlines()]
    assert "wf\\nBcc: everyone@example.com" in headers


def test_smtp_never_sends_a_password_in_clear():
    smtp = SmtpSettings(host="127.0.0.1", port=free_port(), username="gpufleet", password="secret")
    with pytest.raises(NotifyError, match="the SMTP password would go in clear; set starttls or ssl"):
        send_email(smtp, "ana@example.com", alert("a1", "FIRING", True, "t", "ana@example.com"))


class Capturing(BaseHTTPRequestHandler):
    """A webhook receiver that keeps the messages posted to it."""

    posted: ClassVar[list[dict]] = []

    def do_POST(self):
        Capturing.posted.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_webhook_messages_text_escapes_what_slack_would_read_as_a_mention_or_a_link():
    """Slack reads ``<...>`` in a message's text as a mention (``<!channel>``), a link
    (``<url|words>``) or nothing at all, and ``&`` as the start of an entity, so its documented rule
    is to escape ``&``, ``<`` and ``>``. Before, a service or a kernel's name went out as it came: a
    replica's engine labelled ``<!channel>`` pinged the whole channel, and a template kernel's name
    (``kernel<float>``) lost its argument. The record beside the text stays as it was."""
    http = ThreadingHTTPServer(("127.0.0.1", 0), Capturing)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    Capturing.posted = []
    said = "3 of 8 replicas of <!channel> <http://evil.example|re-run it> served no request; fill_kernel<float> & co"
    try:
        send_webhook(f"http://127.0.0.1:{http.server_address[1]}/", {**alert("a1", "FIRING", True, "t", "o"),
                                                                      "message": said}, retries=0)
    finally:
        http.shutdown()
    (posted,) = Capturing.posted
    assert "<" not in posted["text"] and ">" not in posted["text"]
    assert ("3 of 8 replicas of &lt;!channel&gt; &lt;http://evil.example|re-run it&gt; served no request; "
            "fill_kernel&lt;float&gt; &amp; co") in posted["text"]
    assert posted["gpufleet_alert"]["message"] == said
