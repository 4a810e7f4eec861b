"""An ASGI application served by Hypercorn in a thread of its own: what every HTTP endpoint of
gpufleet's command line is served by (the schema registry, the owners' service, the sink's query server).

Hypercorn parses the requests (a ``Content-Length`` that is not a number is a 400, never a
dropped connection with a traceback), closes a connection idle for ``idle_s`` -- before its
first request too -- and one whose next bytes do not come within ``read_s`` (a body shorter
than its ``Content-Length``, headers sent a byte at a time): no client holds a connection for
as long as it likes. It was chosen over uvicorn for exactly that: uvicorn times a connection
out only after a response (an idle one that never asks stays open) and has no read timeout.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading

from hypercorn.asyncio import serve
from hypercorn.config import Config

log = logging.getLogger(__name__)


class AsgiServer:
    """``app`` on ``host:port`` (0: any free port; one in use raises OSError now, not later)."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, name: str = "http",
                 idle_s: float = 5.0, read_s: float = 10.0) -> None:
        self.app, self.name = app, name
        self._sock = socket.create_server((host, port))
        self.config = Config()
        self.config.bind = [f"fd://{os.dup(self._sock.fileno())}"]  # Hypercorn closes the one it is given
        self.config.keep_alive_timeout = idle_s
        self.config.read_timeout = read_s
        self.config.h11_max_incomplete_size = 16 * 1024  # request line and headers
        self.config.accesslog = None
        self.config.errorlog = log
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1]

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._loop.call_soon(self._ready.set)
        try:
            self._loop.run_until_complete(serve(self.app, self.config, shutdown_trigger=self._stop.wait))
        finally:
            self._loop.close()

    def start(self) -> AsgiServer:
        """Serve from now on (the socket already listens: a client may connect at once)."""
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout_s)
        self._sock.close()
