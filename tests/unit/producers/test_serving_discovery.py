"""Serving engines found on the host by the ports their GPU processes listen on
(``producers.serving.discover``): real listening sockets of real processes, found with psutil,
asked over HTTP. An engine's page becomes an endpoint of the GPUs of the processes that listen
(or whose parent listens: an API server running its GPU workers); a port that answers anything
else is not one, and an endpoint found is read like a configured one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from producers.agent.gpus.reading import GpuProcess, GpuReading
from producers.serving.discover import Discovery, candidates, discover, gpu_processes, listening_ports
from producers.serving.fetch import Fetcher
from producers.serving.scrape import Endpoint, ServingReader
from tests.support.integration import wait_until
from tests.support.serving_pages import DATA, serve


@pytest.fixture
def engine_and_other():
    """A vLLM page and a port that is no engine's, both listened on by this process."""
    engine, other = serve((DATA / "vllm-0.6.prom").read_bytes()), serve(b"<html>TensorBoard</html>")
    yield engine.server_address[1], other.server_address[1]
    engine.shutdown()
    other.shutdown()


@pytest.fixture
def worker():
    """A child of this process, as an API server's GPU worker is: it listens on nothing itself."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    yield child.pid
    child.stdin.close()
    child.wait(10)


def test_the_ports_of_a_process_and_of_its_parent_are_found(engine_and_other, worker):
    engine, other = engine_and_other
    assert {engine, other} <= set(listening_ports(os.getpid()))
    assert listening_ports(worker)[engine] == "127.0.0.1"  # through its parent, asked where it listens
    assert listening_ports(2**22 + 7) == {}  # no such process: nothing, no error


def test_an_engine_on_the_gpu_processes_ports_becomes_an_endpoint_of_their_gpus(engine_and_other, worker):
    engine, other = engine_and_other
    readings = [GpuReading(i, f"GPU-{i}", "H100", processes=[GpuProcess(worker)] if i < 2 else []) for i in range(3)]
    assert gpu_processes(readings) == {0: {worker}, 1: {worker}, 2: set()}
    found = discover(gpu_processes(readings), set(), Fetcher())
    mine = Endpoint((0, 1), f"http://127.0.0.1:{engine}/metrics", "vllm")
    # (this process may listen on more ports than these two: other tests' servers)
    assert mine in found and not any(e.url.endswith(f":{other}/metrics") for e in found)
    assert mine not in discover({0: {worker}}, {mine.url}, Fetcher())  # read already: not again
    ports = {1: {8000: "127.0.0.1"}, 2: {9000: "[::1]", 8000: "127.0.0.1"}}
    assert candidates({0: {1}, 3: {1, 2}}, ports.__getitem__) == {"127.0.0.1:8000": (0, 3), "[::1]:9000": (3,)}


def test_an_engine_listening_on_ipv6s_loopback_alone_is_asked_there(worker):
    """An engine started with ``--host ::1`` (or on ``::`` with IPv6 alone) answers no one at
    127.0.0.1: it is asked at [::1]."""
    engine = serve((DATA / "vllm-0.6.prom").read_bytes(), host="::1")
    try:
        port = engine.server_address[1]
        assert listening_ports(worker)[port] == "[::1]"
        found = discover({0: {worker}}, set(), Fetcher())
        assert Endpoint((0,), f"http://[::1]:{port}/metrics", "vllm") in found
    finally:
        engine.shutdown()


def test_a_found_endpoint_is_read_from_then_on(engine_and_other, worker):
    engine, _ = engine_and_other
    reader = ServingReader([], interval_s=0.05, timeout_s=1.0)
    discovery = Discovery(reader, lambda: {4: {worker}})
    try:
        url = f"http://127.0.0.1:{engine}/metrics"
        assert url in [e.url for e in discovery.once()]
        assert url not in [e.url for e in discovery.once()]  # found once
        # the agent's ticks read it at the reader's rate: two readings make the first pair
        pairs = wait_until(lambda: (reader.step(), [p for p in reader.pairs() if p[0].url == url])[1], 30,
                           "two readings of it")
        assert pairs[0][0].gpus == (4,) and pairs[0][2][1].engine == "vllm"
    finally:
        reader.stop()
        discovery.join()
