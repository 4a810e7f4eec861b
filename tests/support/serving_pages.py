"""A serving engine's metrics page served over HTTP on loopback, as the agent's reader and its
discovery meet one: the scrape texts recorded in ``tests/data/serving`` (each with its source)."""

from __future__ import annotations

import math
import socket
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from producers.serving import engines

DATA = Path(__file__).resolve().parents[1] / "data" / "serving"


def recorded(name: str) -> str:
    """The scrape text ``tests/data/serving/NAME.prom``."""
    return (DATA / f"{name}.prom").read_text()


def by_the_library(text: str, engine: str, model: str | None = None) -> dict[str, float]:
    """What a reading of ``text`` (for ``model``) should hold: every sample ``engine`` reads, summed
    over its series (the KV cache's use, a share: their mean), as the client library's parser
    reads the whole page; with ``model``, those no model label names or that ``model`` labels. A
    series is a name and its labels but the engine's ranks (``Engine.copies``): its samples are
    copies of one view, read as their mean."""
    spec = engines.ENGINES[engine]
    wanted, series = set(engines._named(spec)), {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in wanted and (model is None or model_of(s, engine) in (None, model)):
                key = (s.name, frozenset((k, v) for k, v in s.labels.items() if k not in spec.copies))
                series.setdefault(key, []).append(float(s.value))
    sums, counts = {}, {}
    for (name, _), values in series.items():
        total = 0.0
        for value in values:  # (in the page's order, as the reading adds them: the same float)
            total += value
        sums[name] = sums.get(name, 0.0) + total / len(values)
        counts[name] = counts.get(name, 0) + 1
    shares = engines._fractions(spec)
    return {n: v / counts[n] if n in shares else v for n, v in sums.items()}


def model_of(sample, engine: str) -> str | None:
    """The model a sample is labelled with: the first of the engine's model labels it has, not empty."""
    return next((sample.labels[k] for k in engines.ENGINES[engine].model_labels if sample.labels.get(k)), None)


def models(text: str, engine: str) -> set[str]:
    """The models the samples ``engine`` reads are labelled with, as the client library reads the page."""
    wanted = set(engines._named(engines.ENGINES[engine]))
    return {m for f in text_string_to_metric_families(text) for s in f.samples
            if s.name in wanted and (m := model_of(s, engine)) is not None}


def same(a: dict[str, float], b: dict[str, float]) -> bool:
    """The same names with the same values (NaN as NaN)."""
    return a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


class EngineServer(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` that takes a client going away (a request given up at its
    timeout, a connection closed with an answer unread: a reset) as the engines' servers do, in
    silence. The standard library's prints a traceback from the connection's thread, and Python
    3.11 parses source to draw one (``traceback``'s carets): beside the test's own thread
    compiling a module at that moment, its parser's state is not thread-safe (CPython
    gh-106905: "AST constructor recursion depth mismatch", the session failed at its end)."""

    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


class EngineServer6(EngineServer):
    address_family = socket.AF_INET6


def serve(body: bytes | Callable[[], bytes], path: str = "/metrics", host: str = "127.0.0.1") -> EngineServer:
    """``body`` at ``path`` (404 elsewhere), on a port of its own of ``host`` (``::1``: IPv6's
    loopback alone), over kept-open connections as the engines' servers; a callable body is asked
    at each request (a page whose counters move). ``shutdown()`` it after."""
    class Page(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            page = body() if callable(body) else body
            self.send_response(200 if self.path == path else 404)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    httpd = (EngineServer6 if ":" in host else EngineServer)((host, 0), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd
