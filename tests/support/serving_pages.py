"""A serving engine's metrics page served over HTTP on loopback, as the agent's reader and its
discovery meet one: the scrape texts recorded in ``tests/data/serving`` (each with its source)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "serving"


def serve(body: bytes, path: str = "/metrics") -> ThreadingHTTPServer:
    """``body`` at ``path`` (404 elsewhere), on a port of its own; ``shutdown()`` it after."""
    class Page(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == path else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd
