"""The host agent's reading of the serving engines on its host: each endpoint read on a thread
of its own, at the agent's rate and with a timeout, so that an endpoint that is down, slow or
answers garbage never holds up the GPU sampling: the agent's tick takes whatever readings are
ready and never waits. What went wrong is counted by endpoint and reason
(``gpufleet_agent_serving_errors_total``, on the agent's metrics endpoint) and logged once per
kind of failure.

An endpoint is given by a setting (``--serving-endpoint``): the GPUs of the replica on this host,
its URL, and where the engine's own labels do not say, the engine and the service::

    0,1=http://127.0.0.1:8000/metrics;service=llama-70b;engine=vllm

Each tick, two successive readings of an endpoint become one ``ServingSample`` attributed to the
workflow that holds the replica's GPUs in that tick's GPU samples (``ServingObserver``).
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pycurl

from producers.serving.engines import ENGINES, EndpointError, Reading, parse, restricted, traffic
from schemas.topics import GPU_SAMPLES, key_of
from schemas.validate_sample import NOT_WORKFLOWS

log = logging.getLogger(__name__)

MAX_BYTES = 4 << 20  # an endpoint's answer longer than this is not a metrics page
SCHEMA = "ServingSample"
MAX_GAP_S = 3600  # readings further apart than this make no sample (a ServingSample covers an hour at most)


class EndpointSettingError(ValueError):
    """A ``--serving-endpoint`` that cannot be used: what it should look like."""


@dataclass(frozen=True)
class Endpoint:
    gpus: tuple[int, ...]  # the replica's GPUs on this host, by index
    url: str
    engine: str | None = None  # None: named by its metrics' prefix
    service: str | None = None  # None: the engine's model label, else the URL's host and port


def endpoint(text: str) -> Endpoint:
    """``GPUS=URL[;service=NAME][;engine=ENGINE]`` as an ``Endpoint``."""
    gpus_text, sep, rest = text.partition("=")
    url, *options = rest.split(";")
    try:
        gpus = tuple(int(g) for g in gpus_text.split(","))
    except ValueError:
        gpus = ()
    if not sep or not gpus or any(g < 0 for g in gpus) or not url.startswith(("http://", "https://")):
        raise EndpointSettingError(f"--serving-endpoint {text!r}: expected GPUS=URL[;service=NAME][;engine=ENGINE], "
                                   "e.g. 0,1=http://127.0.0.1:8000/metrics;service=llama-70b")
    named = dict(o.partition("=")[::2] for o in options if o)
    unknown = set(named) - {"service", "engine"}
    if unknown or (named.get("engine") and named["engine"] not in ENGINES):
        raise EndpointSettingError(f"--serving-endpoint {text!r}: options are service=NAME and engine="
                                   f"{'|'.join(ENGINES)}")
    return Endpoint(gpus, url, named.get("engine") or None, named.get("service") or None)


class Fetcher:
    """GETs with libcurl (pycurl), its connection to each endpoint kept open between readings
    (what the engines' HTTP/1.1 servers offer). Measured on the agent's benchmark, a reading's
    request costs a third of the CPU of the standard library's ``http.client`` (0.065 against
    0.18 ms), whose headers go through the email parser: at 8 replicas that is most of what a
    reading may cost the agent. A connection the server closed is opened again by libcurl; no
    proxy from the environment is used (the endpoints are the host's own or the pods'), no
    redirect followed, and nothing but HTTP(S) asked. One ``Fetcher`` per reading thread (a
    curl handle is one thread's)."""

    def __init__(self) -> None:
        self.curl = pycurl.Curl()
        self.body: list[bytes] = []
        self.size = 0
        c = self.curl
        c.setopt(pycurl.NOSIGNAL, 1)  # (timeouts without SIGALRM: the agent's threads)
        c.setopt(pycurl.PROXY, "")
        c.setopt(pycurl.FOLLOWLOCATION, 0)
        c.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        c.setopt(pycurl.HTTPHEADER, ["Accept: text/plain"])
        c.setopt(pycurl.MAXFILESIZE_LARGE, MAX_BYTES)
        c.setopt(pycurl.WRITEFUNCTION, self._write)
        cafile = ssl.get_default_verify_paths().cafile
        if cafile:
            c.setopt(pycurl.CAINFO, cafile)  # (the host's CAs, as Python's own HTTPS would trust)

    def _write(self, chunk: bytes) -> int | None:
        self.size += len(chunk)
        if self.size > MAX_BYTES:
            return 0  # (libcurl stops: a page without a length that grew too long)
        self.body.append(chunk)
        return None

    def __call__(self, url: str, timeout_s: float) -> str:
        c = self.curl
        self.body, self.size = [], 0
        c.setopt(pycurl.URL, url)
        c.setopt(pycurl.TIMEOUT_MS, max(1, int(timeout_s * 1000)))
        try:
            c.perform()
        except pycurl.error as exc:
            code, message = exc.args[0], exc.args[1] if len(exc.args) > 1 else ""
            if code == pycurl.E_FILESIZE_EXCEEDED or (code == pycurl.E_WRITE_ERROR and self.size > MAX_BYTES):
                raise EndpointError(f"the answer is longer than {MAX_BYTES} bytes") from None
            if code == pycurl.E_OPERATION_TIMEDOUT:
                raise TimeoutError(f"timed out: {message}") from None
            raise ConnectionError(f"{message} (curl error {code})") from None
        status = c.getinfo(pycurl.RESPONSE_CODE)
        if status != 200:
            raise EndpointError(f"HTTP {status}")
        return b"".join(self.body).decode("utf-8", errors="replace")

    def close(self) -> None:
        self.curl.close()


class ServingReader:
    """Reads every endpoint on its own thread every ``interval_s``; ``pairs`` hands the agent each
    endpoint's newest two readings once (never waiting for a read)."""

    def __init__(self, endpoints: list[Endpoint], interval_s: float, timeout_s: float = 2.0,
                 get: Callable[[str, float], str] | None = None, clock: Callable[[], float] = time.time) -> None:
        self.endpoints, self.interval_s, self.timeout_s = list(endpoints), interval_s, min(timeout_s, interval_s * 4)
        self._get = get
        self._urls: dict[int, str] = {}  # endpoint -> the URL it is read from (its needed samples only)
        self.gets = [get or Fetcher() for _ in endpoints]  # each endpoint's own (its thread's connection)
        self._started = False
        self.clock = clock
        self.errors: Counter = Counter()  # (url, reason) -> count
        self._latest: dict[int, tuple[float, Reading]] = {}
        self._taken: dict[int, tuple[float, Reading]] = {}
        self._lock = threading.Lock()
        self.stopping = self._stop = threading.Event()  # set by stop(): the discovery's too
        self._threads: list[threading.Thread] = []

    def read_once(self, i: int) -> None:
        """One reading of endpoint ``i``: kept, or counted as an error. Once its engine is known,
        only the samples its reading needs are asked for (``engines.restricted``); an endpoint
        that refuses the question is asked for its whole page again, from then on."""
        e = self.endpoints[i]
        url = self._urls.get(i, e.url)
        try:
            try:
                reading = parse(self.gets[i](url, self.timeout_s), e.engine)
            except EndpointError:
                if url == e.url:
                    raise
                self._urls[i] = e.url  # (a server that answers the names with an error: its page, whole)
                reading = parse(self.gets[i](e.url, self.timeout_s), e.engine)
        except EndpointError as exc:
            self._failed(e, "garbage", exc)
            return
        except (OSError, ValueError) as exc:  # refused, timed out, HTTP errors (URLError is an OSError)
            self._failed(e, "timeout" if "timed out" in str(exc) else "unreachable", exc)
            return
        with self._lock:
            self._latest[i] = (self.clock(), reading)
        if i not in self._urls:  # (once: the URL of the samples the reading needs)
            self._urls[i] = restricted(e.url, reading.engine)

    def _failed(self, e: Endpoint, reason: str, exc: Exception) -> None:
        with self._lock:
            self.errors[(e.url, reason)] += 1
            first = self.errors[(e.url, reason)] == 1
        (log.warning if first else log.debug)("serving endpoint %s: %s (%s); GPU sampling goes on", e.url, reason, exc)

    def start(self) -> None:
        self._started = True
        for i in range(len(self.endpoints)):
            self._start(i)

    def _start(self, i: int) -> None:
        t = threading.Thread(target=self._run, args=(i,), name=f"serving-{i}", daemon=True)
        t.start()
        self._threads.append(t)

    def add(self, e: Endpoint) -> bool:
        """Read ``e`` too from now on (one found on the host: ``producers.serving.discover``);
        False where an endpoint of its URL is read already."""
        with self._lock:
            if any(x.url == e.url for x in self.endpoints):
                return False
            self.endpoints.append(e)
            self.gets.append(self._get or Fetcher())
            i = len(self.endpoints) - 1
        if self._started and not self._stop.is_set():
            self._start(i)
        return True

    def _run(self, i: int) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.read_once(i)
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout_s + 1)

    def pairs(self) -> list[tuple[Endpoint, tuple[float, Reading], tuple[float, Reading]]]:
        """Each endpoint's (previous, newest) readings where a new one came since the last call."""
        out = []
        with self._lock:
            for i, newest in self._latest.items():
                before = self._taken.get(i)
                if before is not None and newest[0] > before[0]:
                    out.append((self.endpoints[i], before, newest))
                if before is None or newest[0] > before[0]:
                    self._taken[i] = newest
        return out


class ServingObserver:
    """Called with each tick's GPU samples (a ``HostAgent`` observer): spools a ``ServingSample``
    per endpoint with a new reading, attributed to the workflow holding the replica's GPUs."""

    def __init__(self, reader: ServingReader, put: Callable[[str, bytes | None, dict], None], host: str) -> None:
        self.reader, self.put, self.host = reader, put, host
        self.unattributed = 0  # readings of a replica whose GPUs no workflow held

    def __call__(self, samples: list[dict], host_sample: dict) -> None:
        by_gpu = {s["gpu_index"]: s for s in samples if s["workflow_id"] not in NOT_WORKFLOWS}
        for e, (t0, before), (t1, now) in self.reader.pairs():
            held = [by_gpu[g] for g in e.gpus if g in by_gpu]
            if t1 - t0 > MAX_GAP_S:
                continue  # the endpoint was away: what it counted meanwhile stands for no one tick
            if not held:
                self.unattributed += 1
                continue
            first = held[0]
            record = {"workflow_id": first["workflow_id"], "host": self.host, "owner": first.get("owner"),
                      "team": first.get("team"), "gpu_uuids": [s["gpu_uuid"] for s in held],
                      "service": e.service or now.model or e.url.split("/")[2], "engine": now.engine,
                      "event_time": int(t1 * 1000), "interval_ms": max(1, int((t1 - t0) * 1000)),
                      **traffic(before, now)}
            self.put(SCHEMA, key_of(GPU_SAMPLES, record), record)
