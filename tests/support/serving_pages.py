"""A serving engine's metrics page served over HTTP on loopback, as the agent's reader and its
discovery meet one: the scrape texts recorded in ``tests/data/serving`` (each with its source)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "serving"


def serve(body: bytes | Callable[[], bytes], path: str = "/metrics") -> ThreadingHTTPServer:
    """``body`` at ``path`` (404 elsewhere), on a port of its own, over kept-open connections as the
    engines' servers; a callable body is asked at each request (a page whose counters move).
    ``shutdown()`` it after."""
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

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd
