"""``gpufleet schemas serve`` against clients that do not play by the rules: a Content-Length
that is no number gets a 400 and the server goes on; a body shorter than its Content-Length,
and connections that never ask, are closed after the server's read and idle timeouts."""

from __future__ import annotations

import json
import socket
import urllib.request

import pytest

from gpufleet.schema_server import RegistryServer
from schemas.registry import SchemaRegistry


@pytest.fixture
def server():
    s = RegistryServer(SchemaRegistry(), port=0, idle_s=1.0, read_s=1.0).start()
    yield s
    s.stop()


def address(server) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def exchange(server, raw: bytes, timeout: float = 10.0) -> bytes:
    """What the server sends back to ``raw`` until it closes the connection."""
    with socket.create_connection(address(server), timeout=timeout) as s:
        s.sendall(raw)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def get_ids(server) -> list:
    with urllib.request.urlopen(f"{server.url}/schemas/ids/1", timeout=10) as r:
        return json.loads(r.read())


@pytest.mark.parametrize("length", [b"abc", b"-5", b"0x10"])
def test_a_content_length_that_is_no_number_gets_a_400(server, length):
    reply = exchange(server, b"POST /subjects/x/versions HTTP/1.1\r\nHost: x\r\nContent-Length: " + length
                     + b"\r\nConnection: close\r\n\r\n{}")
    assert reply.startswith(b"HTTP/1.1 400")
    assert "schema" in get_ids(server)  # and the server goes on


def test_a_body_shorter_than_its_length_is_not_waited_for_forever(server):
    # (recv returns when the server closes: bounded by the read timeout, not by this client)
    reply = exchange(server, b"POST /subjects/x/versions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{}")
    assert b"200 OK" not in reply


def test_connections_that_never_ask_are_closed(server):
    idle = [socket.create_connection(address(server), timeout=10) for _ in range(200)]
    try:
        assert all(s.recv(1) == b"" for s in idle)  # each closed by the server, not by its client
        assert "schema" in get_ids(server)
    finally:
        for s in idle:
            s.close()


def test_a_body_over_the_limit_is_refused(server):
    reply = exchange(server, b"POST /subjects/x/versions HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n"
                             b"Connection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 413")
