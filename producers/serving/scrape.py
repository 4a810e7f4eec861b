"""The host agent's reading of the serving engines on its host: every endpoint read at the
agent's rate on a thread beside the GPU sampling, each with a timeout, so that an endpoint that
is down, slow or answers garbage holds up neither another endpoint nor the GPU sampling: the
agent's tick takes whatever readings are ready and never waits. What went wrong is counted by
endpoint and reason (``gpufleet_agent_serving_errors_total``, on the agent's metrics endpoint)
and logged once per kind of failure.

An endpoint is given by a setting (``--serving-endpoint``): the GPUs of the replica on this host,
its URL, and where the engine's own labels do not say, the engine and the service::

    0,1=http://127.0.0.1:8000/metrics;service=llama-70b;engine=vllm

Each tick, two successive readings of an endpoint become one ``ServingSample`` attributed to the
workflow that holds the replica's GPUs in that tick's GPU samples (``ServingObserver``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pycurl

from producers.serving.engines import ENGINES, EndpointError, Reading, parse, restricted, traffic
from producers.serving.fetch import Fetcher
from schemas.topics import GPU_SAMPLES, key_of
from schemas.validate_sample import NOT_WORKFLOWS

log = logging.getLogger(__name__)

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


class ServingReader:
    """Reads every endpoint every ``interval_s`` on one thread: the endpoints due are asked at once,
    each on its own kept-open connection and with its own timeout, over one ``pycurl.CurlMulti``,
    and each answer is read as it comes, so an endpoint that is slow or down holds up no other.
    ``pairs`` hands the agent each endpoint's newest two readings once (never waiting for a read).
    One thread rather than one for each endpoint: a thread woken for each reading cost the agent more
    CPU than the reading itself (0.27 against 0.15 ms a reading, 8 endpoints)."""

    def __init__(self, endpoints: list[Endpoint], interval_s: float, timeout_s: float = 2.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.endpoints, self.interval_s, self.timeout_s = list(endpoints), interval_s, min(timeout_s, interval_s * 4)
        self._urls: dict[int, str] = {}  # endpoint -> the URL it is read from (its needed samples only)
        self.gets = [Fetcher() for _ in endpoints]  # each endpoint's own curl handle (its connection)
        self.clock = clock
        self.errors: Counter = Counter()  # (url, reason) -> count
        self._latest: dict[int, tuple[float, Reading]] = {}
        self._taken: dict[int, tuple[float, Reading]] = {}
        self._lock = threading.Lock()
        self.stopping = self._stop = threading.Event()  # set by stop(): the discovery's too
        self._added = threading.Event()  # an endpoint added: the loop asks it at once
        self._thread: threading.Thread | None = None
        self._inline: pycurl.CurlMulti | None = None  # read_all's

    def read_once(self, i: int) -> None:
        """One reading of endpoint ``i``, here and now, on this thread (a reader whose loop does
        not run: a started reader's loop reads every endpoint)."""
        url = self._url(i)
        if self._took(i, url, self._fetched(i, url)):
            self._took(i, self.endpoints[i].url, self._fetched(i, self.endpoints[i].url))

    def read_all(self) -> None:
        """One reading of every endpoint, all asked at once as the loop asks them, back when each
        has answered or timed out (a reader whose loop does not run)."""
        if self._inline is None:
            self._inline = pycurl.CurlMulti()  # (kept: the connections are the multi handle's)
        multi, flight = self._inline, {}
        try:
            for i in range(len(self.endpoints)):
                self._ask(multi, flight, i, self._url(i))
            while flight:
                self._answers(multi, flight)
                if flight:
                    self._wait(multi)
        finally:
            for curl in list(flight):
                multi.remove_handle(curl)

    def _url(self, i: int) -> str:
        return self._urls.get(i, self.endpoints[i].url)

    def _fetched(self, i: int, url: str) -> str | Exception:
        try:
            return self.gets[i](url, self.timeout_s)
        except (OSError, ValueError) as exc:  # refused, timed out, HTTP errors (EndpointError is a ValueError)
            return exc

    def _took(self, i: int, url: str, answer: str | Exception) -> bool:
        """Endpoint ``i``'s answer from ``url``: its reading kept, or counted as an error. Once its
        engine is known, only the samples its reading needs are asked for (``engines.restricted``).
        True where the endpoint refused that question: it is to be asked for its whole page again,
        and from then on."""
        e = self.endpoints[i]
        try:
            if isinstance(answer, Exception):
                raise answer
            reading = parse(answer, e.engine)
        except EndpointError as exc:
            if url != e.url:
                self._urls[i] = e.url  # (a server that answers the names with an error: its page, whole)
                return True
            self._failed(e, "garbage", exc)
            return False
        except (OSError, ValueError) as exc:
            self._failed(e, "timeout" if "timed out" in str(exc) else "unreachable", exc)
            return False
        with self._lock:
            self._latest[i] = (self.clock(), reading)
        if i not in self._urls:  # (once: the URL of the samples the reading needs)
            self._urls[i] = restricted(e.url, reading.engine)
        return False

    def _ask(self, multi: pycurl.CurlMulti, flight: dict, i: int, url: str) -> None:
        get = self.gets[i]
        get.start(url, self.timeout_s)
        multi.add_handle(get.curl)
        flight[get.curl] = (i, url)

    def _answers(self, multi: pycurl.CurlMulti, flight: dict) -> None:
        """Moves the requests in flight on; takes each answer that came (an endpoint that refused
        its narrow question is asked again at once, for its whole page)."""
        while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
            pass
        while True:
            queued, ok, failed = multi.info_read()
            for curl, error in [(c, None) for c in ok] + [(c, pycurl.error(n, m)) for c, n, m in failed]:
                i, url = flight.pop(curl)
                multi.remove_handle(curl)
                try:
                    answer: str | Exception = self.gets[i].result(error)
                except (OSError, ValueError) as exc:
                    answer = exc
                if self._took(i, url, answer):
                    self._ask(multi, flight, i, self.endpoints[i].url)
            if not queued:
                return

    def _wait(self, multi: pycurl.CurlMulti, most_s: float = 0.1) -> None:
        """Until a socket of a request in flight is ready, or libcurl has a timeout to keep."""
        ms = multi.timeout()
        wait = most_s if ms < 0 else min(ms / 1000, most_s)
        if any(multi.fdset()):
            multi.select(wait)
        else:
            self._stop.wait(min(wait, 0.01))  # (no socket yet, a name being resolved: a short while)

    @staticmethod
    def _close(multi: pycurl.CurlMulti, flight: dict) -> None:
        for curl in list(flight):
            multi.remove_handle(curl)
        flight.clear()
        multi.close()

    def _failed(self, e: Endpoint, reason: str, exc: Exception) -> None:
        with self._lock:
            self.errors[(e.url, reason)] += 1
            first = self.errors[(e.url, reason)] == 1
        (log.warning if first else log.debug)("serving endpoint %s: %s (%s); GPU sampling goes on", e.url, reason, exc)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="serving-reader", daemon=True)
        self._thread.start()

    def add(self, e: Endpoint) -> bool:
        """Read ``e`` too from now on (one found on the host: ``producers.serving.discover``);
        False where an endpoint of its URL is read already."""
        with self._lock:
            if any(x.url == e.url for x in self.endpoints):
                return False
            self.gets.append(Fetcher())
            self.endpoints.append(e)
        self._added.set()
        return True

    def _run(self) -> None:
        """Each endpoint asked every ``interval_s``, all on one beat (one wake asks every endpoint),
        the answers taken as they come; between, the thread sleeps until the next is due or an
        endpoint is added. A fault of the loop's own (not an endpoint's: those are counted) is
        logged and the requests in flight dropped; the endpoints are asked again at the next beat."""
        multi, flight, due = pycurl.CurlMulti(), {}, {}
        try:
            while not self._stop.is_set():
                try:
                    self._beat(multi, flight, due)
                except Exception:
                    with self._lock:
                        self.errors[("reader", "fault")] += 1  # (on the metrics endpoint: endpoint="reader")
                    log.exception("the serving endpoints' reader failed; asked again in %g s", self.interval_s)
                    self._close(multi, flight)
                    multi = pycurl.CurlMulti()
                    self._stop.wait(self.interval_s)
        finally:
            self._close(multi, flight)

    def _beat(self, multi: pycurl.CurlMulti, flight: dict, due: dict[int, float]) -> None:
        """Asks the endpoints that are due, takes the answers that came, then waits for the next."""
        self._added.clear()
        now = time.monotonic()
        asked = {i for i, _ in flight.values()}
        with self._lock:
            count = len(self.endpoints)
        for i in range(count):
            if i not in asked and due.setdefault(i, now) <= now:
                # (on the endpoints' common beat, so that one wake asks them all; a beat missed,
                # behind a slow answer, is not made up)
                later = due[i] + self.interval_s
                due[i] = later if later > now else now + self.interval_s
                self._ask(multi, flight, i, self._url(i))
        self._answers(multi, flight)
        if flight:
            self._wait(multi, max(0.0, min(due.values()) - time.monotonic()))
        else:
            self._added.wait(max(0.0, min(due.values(), default=now + self.interval_s) - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        self._added.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 1)

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
    per endpoint with a new reading, attributed to the workflow holding the replica's GPUs, and
    named by the endpoint's setting, else the service the workflow declares, else the model the
    engine serves, else the endpoint's address."""

    def __init__(self, reader: ServingReader, put: Callable[[str, bytes | None, dict], None], host: str,
                 declared: Callable[[str], str | None] = lambda workflow_id: None) -> None:
        self.reader, self.put, self.host = reader, put, host
        # the service a workflow's labels or environment declare it a replica of (the agent's
        # ``HostAgent.declared_service``): the name its samples carry where no setting gives one
        self.declared = declared
        self.unattributed = 0  # readings of a replica whose GPUs no workflow held

    def __call__(self, samples: list[dict], host_sample: dict) -> None:
        pairs = self.reader.pairs()
        if not pairs:
            return  # (most ticks: the endpoints are read every few)
        by_gpu = {s["gpu_index"]: s for s in samples if s["workflow_id"] not in NOT_WORKFLOWS}
        for e, (t0, before), (t1, now) in pairs:
            held = [by_gpu[g] for g in e.gpus if g in by_gpu]
            if t1 - t0 > MAX_GAP_S:
                continue  # the endpoint was away: what it counted meanwhile stands for no one tick
            if not held:
                self.unattributed += 1
                continue
            first = held[0]
            record = {"workflow_id": first["workflow_id"], "host": self.host, "owner": first.get("owner"),
                      "team": first.get("team"), "gpu_uuids": [s["gpu_uuid"] for s in held],
                      "service": e.service or self.declared(first["workflow_id"]) or now.model or e.url.split("/")[2],
                      "engine": now.engine,
                      "event_time": int(t1 * 1000), "interval_ms": max(1, int((t1 - t0) * 1000)),
                      **traffic(before, now)}
            self.put(SCHEMA, key_of(GPU_SAMPLES, record), record)
