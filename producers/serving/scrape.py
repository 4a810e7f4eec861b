"""The host agent's reading of the serving engines on its host: every endpoint read at its rate
in the agent's ticks, asked at one tick and its answer taken at the next, each with a timeout, so
that an endpoint that is down, slow or answers garbage holds up neither another endpoint nor the
GPU sampling: a tick never waits for an answer. What went wrong is counted by
endpoint and reason (``gpufleet_agent_serving_errors_total``, on the agent's metrics endpoint)
and logged once per kind of failure.

An endpoint is given by a setting (``--serving-endpoint``): the GPUs of the replica on this host,
its URL, and where the engine's own labels do not say, the engine and the service; where the
engine serves several models from one endpoint (Triton), the one the replica is read for::

    0,1=http://127.0.0.1:8000/metrics;service=llama-70b;engine=vllm
    2=http://127.0.0.1:8002/metrics;model=detector

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

from producers.serving.engines import ENGINES, EndpointError, ModelError, Reading, parse, restricted, traffic
from producers.serving.fetch import Fetcher
from schemas.topics import GPU_SAMPLES, key_of
from schemas.validate_sample import NOT_WORKFLOWS, service_error

log = logging.getLogger(__name__)

SCHEMA = "ServingSample"
MAX_GAP_S = 3600  # readings further apart than this make no sample (a ServingSample covers an hour at most)


class EndpointSettingError(ValueError):
    """A ``--serving-endpoint`` that cannot be used: what it should look like."""


def shown(url: str) -> str:
    """``url`` as the agent shows it (its log, its metrics endpoint, a replica's service): without
    the user and password an engine behind basic auth is read with (libcurl sends them)."""
    scheme, sep, rest = url.partition("://")
    where, slash, path = rest.partition("/")
    return f"{scheme}{sep}{where.rpartition('@')[2]}{slash}{path}"


@dataclass(frozen=True)
class Endpoint:
    gpus: tuple[int, ...]  # the replica's GPUs on this host, by index
    url: str
    engine: str | None = None  # None: named by its metrics' prefix
    service: str | None = None  # None: the engine's model label, else the URL's host and port
    model: str | None = None  # the model read, of an engine serving several (``engines.parse``)


def endpoint(text: str) -> Endpoint:
    """``GPUS=URL[;service=NAME][;engine=ENGINE][;model=NAME]`` as an ``Endpoint``."""
    gpus_text, sep, rest = text.partition("=")
    url, *options = rest.split(";")
    try:
        gpus = tuple(int(g) for g in gpus_text.split(","))
    except ValueError:
        gpus = ()
    if not sep or not gpus or any(g < 0 for g in gpus) or not url.startswith(("http://", "https://")):
        raise EndpointSettingError(f"--serving-endpoint {text!r}: expected GPUS=URL[;service=NAME][;engine=ENGINE]"
                                   "[;model=NAME], "
                                   "e.g. 0,1=http://127.0.0.1:8000/metrics;service=llama-70b")
    if ":" in url.partition("://")[2].partition("/")[0].rpartition("@")[0]:
        raise EndpointSettingError(f"--serving-endpoint for {shown(url)}: its URL holds a password, which every user "
                                   "of this host can read on the agent's command line; put it in a --serving-netrc "
                                   "file (machine HOST login USER password PASSWORD)")
    named = dict(o.partition("=")[::2] for o in options if o)
    unknown = set(named) - {"service", "engine", "model"}
    if unknown or (named.get("engine") and named["engine"] not in ENGINES):
        raise EndpointSettingError(f"--serving-endpoint {text!r}: options are service=NAME, model=NAME and engine="
                                   f"{'|'.join(ENGINES)}")
    for option in ("service", "model"):  # (a model read is the replica's service where none is named)
        reason = service_error(named.get(option) or None)
        if reason:  # (else every sample of the replica a dead letter at the worker, for the same reason)
            raise EndpointSettingError(f"--serving-endpoint for {shown(url)}: {option}: {reason}")
    return Endpoint(gpus, url, named.get("engine") or None, named.get("service") or None, named.get("model") or None)


@dataclass(slots=True)
class _Asked:
    """A request in flight: to which endpoint, at which URL, when (by the reader's ``clock``: the
    reading's date; by its ``monotonic``), and how many ticks have moved it on since."""

    endpoint: int
    url: str
    at: float
    since: float
    moved: int = 0


class ServingReader:
    """Reads every endpoint every ``interval_s`` in the agent's own ticks (``step``), never waiting:
    the endpoints due are asked at once, each on its own kept-open connection and with its own
    timeout, over one ``pycurl.CurlMulti``, and each answer is taken at the next tick, by then long
    come. An endpoint that is slow or down holds up neither another nor the tick: a request in
    flight moves on at each tick and is given up at its timeout. ``pairs`` hands the agent each
    endpoint's newest two readings once.

    In the ticks rather than on a thread of its own: the agent ticks every second anyway, and a
    reading taken there costs the CPU of its request and its page alone. Waited for as each answer
    came (as the reader's own thread did, which cost more still for its wakes), a reading cost the
    agent 0.11-0.25 ms against 0.09-0.20 ms taken at the next tick (8 endpoints, same runs;
    ``bench_agent.py --serving-only``). A reading is dated when it was asked, which is when the
    engine made its page."""

    def __init__(self, endpoints: list[Endpoint], interval_s: float, timeout_s: float = 2.0,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 netrc: str | None = None) -> None:
        self.endpoints, self.interval_s, self.timeout_s = list(endpoints), interval_s, min(timeout_s, interval_s * 4)
        self._urls: dict[int, str] = {}  # endpoint -> the URL it is read from (its needed samples only)
        self._engines: dict[int, str] = {}  # endpoint -> the engine its page named, where no setting does
        self.netrc = netrc  # a netrc file of the endpoints' credentials (``--serving-netrc``), or None
        self.gets = [Fetcher(netrc) for _ in endpoints]  # each endpoint's own curl handle (its connection)
        self.clock, self.monotonic = clock, monotonic
        self.errors: Counter = Counter()  # (url, reason) -> count; read by the agent's metrics endpoint
        self._latest: dict[int, tuple[float, Reading]] = {}
        self._taken: dict[int, tuple[float, Reading]] = {}
        self._lock = threading.Lock()  # endpoints added by the discovery's thread; errors read by the metrics'
        self.stopping = threading.Event()  # set by stop(): the discovery's end too
        self._multi = pycurl.CurlMulti()
        self._flight: dict[pycurl.Curl, _Asked] = {}  # the requests in flight, by their handle
        self._due: dict[int, float] = {}  # endpoint -> when it is next asked (monotonic)

    def step(self) -> None:
        """The agent's tick: takes the answers that came since the last (never waiting for one),
        then asks the endpoints that are due. A fault of the reader's own (not an endpoint's: those
        are counted by endpoint) is counted and logged; the requests in flight are dropped and the
        endpoints asked again when next due."""
        if self.stopping.is_set():
            return
        try:
            if self._flight:
                self._answers()
            self._ask_due()
        except Exception:
            with self._lock:
                self.errors[("reader", "fault")] += 1  # (on the metrics endpoint: endpoint="reader")
            log.exception("the serving endpoints' reader failed; asked again in %g s", self.interval_s)
            self._close()
            self._multi = pycurl.CurlMulti()

    def read_all(self) -> None:
        """One reading of every endpoint, all asked at once, back when each has answered or timed
        out (a one-off reading, and the benchmark's baseline: the agent's ticks ``step``)."""
        for i in self._idle():
            self._ask(i, self._url(i))
        while self._flight:
            self._answers()
            if self._flight:
                self._wait()

    def _idle(self) -> list[int]:
        """The endpoints with no request in flight (those the discovery's thread added too)."""
        with self._lock:
            count = len(self.endpoints)
        asked = {a.endpoint for a in self._flight.values()}
        return [i for i in range(count) if i not in asked]

    def _ask_due(self) -> None:
        now = self.monotonic()
        for i in self._idle():
            if self._due.setdefault(i, now) <= now:
                # (on the endpoints' common beat, so that one tick asks them all; a beat missed,
                # behind a slow answer, is not made up)
                later = self._due[i] + self.interval_s
                self._due[i] = later if later > now else now + self.interval_s
                self._ask(i, self._url(i))
        if self._flight:
            self._perform()  # (the requests sent: on a kept-open connection, now)
            self._perform()  # (on a new one, the first call connects and this one sends)

    def _url(self, i: int) -> str:
        return self._urls.get(i, self.endpoints[i].url)

    def _took(self, i: int, url: str, answer: str | Exception, asked_at: float) -> bool:
        """Endpoint ``i``'s answer from ``url``: its reading kept, or counted as an error. Once its
        engine is known, only the samples its reading needs are asked for (``engines.restricted``),
        and its pages are read as that engine's (not searched for each engine's names: a whole
        page of TGI's, 94 KB, cost a reading 85 us more so). True where the endpoint refused that
        question (it is to be asked for its whole page again, and from then on), or where its page
        is not the engine's it was (another engine answers there now: asked again, and found)."""
        e = self.endpoints[i]
        try:
            if isinstance(answer, Exception):
                raise answer
            reading = parse(answer, e.engine or self._engines.get(i), e.model)
        except ModelError as exc:  # (its answer read: not a server that refused the narrow question)
            self.failed(e, "models", exc)
            return False
        except EndpointError as exc:
            if url != e.url:
                self._urls[i] = e.url  # (a server that answers the names with an error: its page, whole)
                return True
            if self._engines.pop(i, None) is not None and not isinstance(answer, Exception):
                self._urls.pop(i, None)  # (the samples the new engine's reading needs: asked once it is found)
                return True
            self.failed(e, "garbage", exc)
            return False
        except (OSError, ValueError) as exc:
            self.failed(e, "timeout" if "timed out" in str(exc) else "unreachable", exc)
            return False
        with self._lock:
            self._latest[i] = (asked_at, reading)
        if i not in self._urls:  # (once: the URL of the samples the reading needs)
            self._urls[i] = restricted(e.url, reading.engine)
        if e.engine is None:
            self._engines[i] = reading.engine
        return False

    def _ask(self, i: int, url: str) -> None:
        get = self.gets[i]
        get.start(url, None)  # (the timeout is the reader's: ``_expired``)
        self._multi.add_handle(get.curl)
        self._flight[get.curl] = _Asked(i, url, self.clock(), self.monotonic())

    def _perform(self) -> None:
        while self._multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
            pass

    def _answers(self) -> None:
        """Moves the requests in flight on; takes each answer that came (an endpoint that refused
        its narrow question is asked again at once, for its whole page)."""
        self._perform()
        for asked in self._flight.values():
            asked.moved += 1
        again = False
        while True:
            queued, ok, failed = self._multi.info_read()
            for curl, error in [(c, None) for c in ok] + [(c, pycurl.error(n, m)) for c, n, m in failed]:
                asked = self._flight.pop(curl)
                i, url = asked.endpoint, asked.url
                self._multi.remove_handle(curl)
                try:
                    answer: str | Exception = self.gets[i].result(error)
                except (OSError, ValueError) as exc:
                    answer = exc
                if self._took(i, url, answer, asked.at):
                    self._ask(i, self.endpoints[i].url)
                    again = True
            if not queued:
                break
        self._expired()
        if again:
            self._perform()

    def _expired(self) -> None:
        """Gives up each request in flight for longer than the timeout and moved on by two ticks
        since it was asked (one to send it where its connection was still opening, one to take
        its answer), once what came has been taken. An answer that came in time waits in its
        socket for the tick: libcurl's own timeout would refuse it at a tick that came late, and
        at every tick of an agent that ticks less often than the timeout."""
        now = self.monotonic()
        for curl, asked in list(self._flight.items()):
            if now - asked.since > self.timeout_s and asked.moved >= 2:
                del self._flight[curl]
                self._multi.remove_handle(curl)  # (its connection closed: a new one at the next asking)
                self.failed(self.endpoints[asked.endpoint], "timeout",
                             TimeoutError(f"no answer in {now - asked.since:.3g} s"))

    def _wait(self, most_s: float = 0.1) -> None:
        """Until a socket of a request in flight is ready, or libcurl has a timeout to keep."""
        ms = self._multi.timeout()
        wait = most_s if ms < 0 else min(ms / 1000, most_s)
        if any(self._multi.fdset()):
            self._multi.select(wait)
        else:
            self.stopping.wait(min(wait, 0.01))  # (no socket yet, a name being resolved: a short while)

    def _close(self) -> None:
        for curl in list(self._flight):
            self._multi.remove_handle(curl)
        self._flight.clear()
        self._multi.close()

    def failed(self, e: Endpoint, reason: str, exc: Exception) -> None:
        """Counts a reading of ``e`` that failed, by ``reason``; logs the first of each kind."""
        url = shown(e.url)
        with self._lock:
            self.errors[(url, reason)] += 1
            first = self.errors[(url, reason)] == 1
        (log.warning if first else log.debug)("serving endpoint %s: %s (%s); GPU sampling goes on", url, reason, exc)

    def failures(self) -> dict[tuple[str, str], int]:
        """The readings that failed so far, by (endpoint as shown, reason): a copy (the metrics endpoint's
        thread reads it while the ticks count)."""
        with self._lock:
            return dict(self.errors)

    def add(self, e: Endpoint) -> bool:
        """Read ``e`` too from now on, from the next tick (one found on the host:
        ``producers.serving.discover``); False where an endpoint of its URL is read already."""
        with self._lock:
            if any(x.url == e.url for x in self.endpoints):
                return False
            self.gets.append(Fetcher(self.netrc))
            self.endpoints.append(e)
        return True

    def stop(self) -> None:
        """No more readings: the requests in flight dropped, the connections closed (with the
        agent's last tick; the discovery's thread ends too)."""
        self.stopping.set()
        self._close()
        for get in self.gets:
            get.close()

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
        self.reader.step()
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
            service = e.service or self.declared(first["workflow_id"]) or now.model or shown(e.url).split("/")[2]
            record = {"workflow_id": first["workflow_id"], "host": self.host, "owner": first.get("owner"),
                      "team": first.get("team"), "gpu_uuids": [s["gpu_uuid"] for s in held],
                      "service": service, "engine": now.engine,
                      "event_time": int(t1 * 1000), "interval_ms": max(1, int((t1 - t0) * 1000)),
                      **traffic(before, now)}
            self.put(SCHEMA, key_of(GPU_SAMPLES, record), record)
