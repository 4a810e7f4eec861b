"""The agent's HTTP reading of an engine's endpoint (``scrape.Fetcher``, libcurl): one kept-open
connection for reading after reading, opened again where the server closes it; a page too long,
an HTTP error and a closed port each refused with its reason."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

import pytest

from producers.serving.engines import EndpointError
from producers.serving.fetch import MAX_BYTES, Fetcher
from tests.support.serving_pages import EngineServer


class Page(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    connections: ClassVar[set[tuple]] = set()  # the clients' addresses: one per connection

    def do_GET(self):
        Page.connections.add(self.client_address)  # (a connection is its client port)
        if self.path == "/chunked-huge":  # no length: the reader must stop it itself
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            piece = b"x" * (1 << 20)
            try:
                for _ in range(MAX_BYTES // len(piece) + 2):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
            return
        status, body = {"/error": (500, b"no"), "/huge": (200, b"x" * (MAX_BYTES + 1))}.get(self.path, (200, b"ok"))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        if self.path == "/close":
            self.send_header("Connection", "close")
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def handle(self):
        try:
            super().handle()
        except ConnectionResetError:
            pass  # (the reader cut a page too long short)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def base():
    httpd = EngineServer(("127.0.0.1", 0), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_one_connection_serves_every_reading(base):
    get, Page.connections = Fetcher(), set()
    assert [get(f"{base}/metrics", 2.0) for _ in range(5)] == ["ok"] * 5
    assert len(Page.connections) == 1


def test_a_connection_the_server_closes_is_opened_again(base):
    get, Page.connections = Fetcher(), set()
    assert [get(f"{base}/close", 2.0) for _ in range(3)] == ["ok"] * 3
    assert len(Page.connections) == 3


@pytest.mark.parametrize("path, why", [("/error", "HTTP 500"), ("/huge", "longer than"),
                                       ("/chunked-huge", "longer than")])
def test_what_is_not_a_page_is_refused_with_the_reason(base, path, why):
    get = Fetcher()
    with pytest.raises(EndpointError, match=why):
        get(f"{base}{path}", 5.0)
    assert get(f"{base}/metrics", 2.0) == "ok"  # and the next reading goes on


def test_a_closed_port_is_unreachable():
    with socket.socket() as closed:  # (bound and never listening: refused, and no other socket takes its port)
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        with pytest.raises(ConnectionError):
            Fetcher()(f"http://127.0.0.1:{port}/metrics", 1.0)


def test_an_https_endpoint_is_read_where_its_ca_is_trusted_and_refused_where_not(tmp_path, monkeypatch):
    """An engine behind TLS (a pod's ``prometheus.io/scheme: https``): read where the host trusts
    its CA, as Python's own HTTPS would (here ``SSL_CERT_FILE``), and refused where it does not."""
    import ssl

    from gpufleet.local.certificates import Authority

    ca = Authority.create("engines' CA")
    trusted = ca.save(tmp_path / "ca")
    issued = ca.issue(tmp_path / "engine", "engine", hosts=("127.0.0.1",), server=True)
    httpd = EngineServer(("127.0.0.1", 0), Page)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(issued.cert, issued.key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{httpd.server_address[1]}/metrics"
    try:
        with pytest.raises(ConnectionError, match="certificate"):
            Fetcher()(url, 5.0)  # a CA the host does not trust
        monkeypatch.setenv("SSL_CERT_FILE", str(trusted.cert))
        assert Fetcher()(url, 5.0) == "ok"
    finally:
        httpd.shutdown()
