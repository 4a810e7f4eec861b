"""Ports for what gpufleet starts on loopback (Kafka's nodes, the tests' mail and web servers),
chosen where no other socket of this machine can take them before their server binds them.

A port the kernel hands out (``bind`` to port 0, as a socket's local end for ``connect``) comes
from its ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default).
Asked of the kernel and closed again, such a port is free only until the next connection any
process opens takes it: between the asking and a Kafka node binding it seconds later (the JVM's
start), or while a node killed by the fault tests is down, the clients reconnecting to its
cluster open connections by the dozen. So a port here is drawn below that range, where the
kernel gives out none, checked free by binding it, and never handed out twice by one process
(two ports drawn for one node are two).
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

LOWEST = 10000  # (below: the well-known and registered services' ports a machine may run)
RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")

_handed: set[int] = set()
_lock = threading.Lock()


def ephemeral_range(path: Path = RANGE) -> tuple[int, int] | None:
    """The kernel's ephemeral ports (first, last), or None where it does not say."""
    try:
        first, last = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return None
    return first, last


def free_port(path: Path = RANGE, tries: int = 200) -> int:
    """A port of 127.0.0.1 free now and outside the kernel's ephemeral range: drawn at random
    below it, else above it, else (a machine whose range leaves no room, or that does not say)
    asked of the kernel."""
    span = ephemeral_range(path)
    pools = [] if span is None else [range(LOWEST, span[0]), range(span[1] + 1, 65536)]
    with _lock:
        for pool in (p for p in pools if len(p) > 1000):
            for port in random.sample(pool, min(tries, len(pool))):
                if port not in _handed and _bindable(port):
                    _handed.add(port)
                    return port
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in _handed:
                _handed.add(port)
                return port


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
