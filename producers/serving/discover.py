"""Serving endpoints found on the host where no setting names them (``gpufleet agent
--serving-discover``): a replica's engine answers on a port its GPU processes (or the process
that started them: vLLM's and SGLang's API servers run the GPU workers as children) listen on.
Every ``every_s``, on a thread of its own, each port that the processes holding a GPU listen on
is asked for ``/metrics``; one that answers with an engine's metrics (``engines.parse``)
becomes an endpoint of the GPUs of those processes, read from then on like a configured one.
A port that answers anything else (a training job's rendezvous, TensorBoard) is asked again
only at the next round. Ports are found with psutil, as the agent's host sampling does.

On Kubernetes, each round also asks where the pods holding GPUs are annotated for scraping
(``prometheus.io/scrape``, ``prometheus.io/port``, ``prometheus.io/path``: what the API server
said of them, ``producers.agent.allocations.kubelet.scrape_targets``), at the pod's IP, the way
the cluster's Prometheus finds them: a pod whose engine's port is not one its GPU processes (or
their parents) listen on in this host's view (another network namespace) is found so. Either
way, what answers must be an engine's metrics to become an endpoint. An engine that serves
several models from one endpoint (Triton) is read for the model its pod's ``gpufleet.io/model``
names; with none named, it is told of (counted and logged, as a reading that failed: reason
``models``), not read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import psutil

from producers.serving.engines import EndpointError, ModelError, parse
from producers.serving.fetch import Fetcher
from producers.serving.scrape import Endpoint, ServingReader

log = logging.getLogger(__name__)

ANCESTORS = 2  # a GPU worker's parent and grandparent: the API server that runs it (never pid 1)
FIRST_ROUND_S = 10.0


def listening_ports(pid: int) -> dict[int, str]:
    """The TCP ports ``pid`` and the processes that started it listen on, on an address this host
    reaches (any or loopback), each with the loopback host to ask it at: ``127.0.0.1`` where it
    listens on IPv4, ``[::1]`` where on IPv6 alone (an engine started with ``--host ::1``, or on
    ``::`` where IPv6 sockets take no IPv4, answers no one at 127.0.0.1)."""
    ports: dict[int, str] = {}
    try:
        process: psutil.Process | None = psutil.Process(pid)
        for _ in range(ANCESTORS + 1):
            if process is None or process.pid <= 1:
                break
            for c in process.net_connections(kind="tcp"):
                if c.status != psutil.CONN_LISTEN or not c.laddr:
                    continue
                if c.laddr.ip in ("0.0.0.0", "127.0.0.1"):
                    ports[c.laddr.port] = "127.0.0.1"
                elif c.laddr.ip in ("::", "::1"):
                    ports.setdefault(c.laddr.port, "[::1]")
            process = process.parent()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        pass  # gone, or not ours to look at: what was found so far
    return ports


def gpu_processes(readings) -> dict[int, set[int]]:
    """GPU index -> the pids of its processes, from a tick's ``GpuReading`` list."""
    return {r.index: {p.pid for p in r.processes} for r in readings}


def candidates(gpu_pids: dict[int, set[int]], ports_of: Callable[[int], dict[int, str]]
               ) -> dict[str, tuple[int, ...]]:
    """Where to ask (``host:port``) -> the GPUs (by index) whose processes listen there."""
    gpus: dict[str, set[int]] = {}
    for index, pids in gpu_pids.items():
        for pid in pids:
            for port, host in ports_of(pid).items():
                gpus.setdefault(f"{host}:{port}", set()).add(index)
    return {at: tuple(sorted(g)) for at, g in sorted(gpus.items())}


def gpu_indices(readings) -> dict[str, int]:
    """GPU (or MIG instance) UUID -> its index, from a tick's ``GpuReading`` list."""
    return {r.uuid: r.index for r in readings}


def _nobody(e: Endpoint, exc: Exception) -> None:
    pass


def annotated(targets: list[Any], indices: dict[str, int], known: set[str], get: Callable[[str, float], str],
              timeout_s: float = 2.0, refused: Callable[[Endpoint, Exception], None] = _nobody) -> list[Endpoint]:
    """The endpoints of engines answering where pods' scrape annotations point (``ScrapeTarget``:
    the pod's GPUs by device id, the URL, the service and model it names), but those in ``known``;
    an engine's page that no model named can be read for is handed to ``refused``."""
    found = []
    for target in targets:
        gpus = tuple(sorted({indices[d] for d in target.gpus if d in indices}))
        if target.url in known or not gpus:
            continue  # read already, or its GPUs not sampled here (yet)
        try:
            reading = parse(get(target.url, timeout_s), model=target.model)
        except ModelError as exc:
            refused(Endpoint(gpus, target.url, None, target.service, target.model), exc)
            continue
        except (EndpointError, OSError, ValueError):
            continue  # annotated for another exporter's metrics, or not up yet: asked again next round
        log.info("serving endpoint found from its pod's annotations: %s (%s) for GPU(s) %s", target.url,
                 reading.engine, ",".join(map(str, gpus)))
        found.append(Endpoint(gpus, target.url, reading.engine, target.service, target.model))
    return found


def discover(gpu_pids: dict[int, set[int]], known: set[str], get: Callable[[str, float], str],
             timeout_s: float = 2.0, ports_of: Callable[[int], dict[int, str]] = listening_ports,
             refused: Callable[[Endpoint, Exception], None] = _nobody) -> list[Endpoint]:
    """The endpoints of engines answering on the GPU processes' ports, but those in ``known`` (URLs);
    an engine's page of several models (no model is named here) is handed to ``refused``."""
    found = []
    for at, gpus in candidates(gpu_pids, ports_of).items():
        url = f"http://{at}/metrics"
        if url in known:
            continue
        try:
            reading = parse(get(url, timeout_s))
        except ModelError as exc:
            refused(Endpoint(gpus, url), exc)
            continue
        except (EndpointError, OSError, ValueError):
            continue  # not an engine's metrics page
        log.info("serving endpoint found: %s (%s) for GPU(s) %s", url, reading.engine, ",".join(map(str, gpus)))
        found.append(Endpoint(gpus, url, reading.engine))
    return found


class Discovery:
    """Looks for new endpoints every ``every_s`` on a thread of its own and hands them to the
    reader; ``gpu_pids`` gives the processes on each GPU as the agent's last tick saw them; on
    Kubernetes, ``targets`` the pods' scrape annotations and ``indices`` each GPU's index by UUID."""

    def __init__(self, reader: ServingReader, gpu_pids: Callable[[], dict[int, set[int]]], every_s: float = 300.0,
                 ports_of: Callable[[int], dict[int, str]] = listening_ports, targets: Callable[[], list] | None = None,
                 indices: Callable[[], dict[str, int]] = dict) -> None:
        self.reader, self.gpu_pids, self.every_s, self.ports_of = reader, gpu_pids, every_s, ports_of
        self.targets, self.indices = targets, indices
        self.get = Fetcher(reader.netrc)
        self._stop = reader.stopping  # ends with the reader
        self._thread: threading.Thread | None = None

    def once(self) -> list[Endpoint]:
        """One round: the endpoints found and added."""
        known = {e.url for e in self.reader.endpoints}
        found = []
        if self.targets is not None:
            found += annotated(self.targets(), self.indices(), known, self.get, self.reader.timeout_s, self._refused)
            known |= {e.url for e in found}
        found += discover(self.gpu_pids(), known, self.get, self.reader.timeout_s, self.ports_of, self._refused)
        return [e for e in found if self.reader.add(e)]

    def _refused(self, e: Endpoint, exc: Exception) -> None:
        """An engine found that cannot be read as it is named: on the agent's metrics endpoint and
        in its log (once), as a reading that failed."""
        self.reader.failed(e, "models", exc)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="serving-discovery", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        wait = min(self.every_s, FIRST_ROUND_S)  # once the agent's ticks have seen the GPUs' processes
        while not self._stop.wait(wait):
            try:
                self.once()
            except Exception:  # a round that fails must not end the discovery, nor the agent
                log.exception("looking for serving endpoints failed; tried again in %g s", self.every_s)
            wait = self.every_s

    def join(self, timeout_s: float = 5.0) -> None:
        """Once the reader has stopped."""
        if self._thread is not None:
            self._thread.join(timeout_s)
