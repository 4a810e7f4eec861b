"""Read-only SQL for other processes while the embedded ClickHouse is in use.

The embedded engine (``chdb://``) lets one process open a data directory. The process that
owns it -- the sink, or ``gpufleet demo`` -- serves read-only queries on loopback through
read-only sessions on the same directory, and leaves the port and a secret in
``<data path>/query-server.json`` (mode 0600). ``gpufleet sql``, ``opportunities``,
``report`` and ``workflows`` find that file and send their queries there, so analysts can
query while the pipeline runs.

Each query runs in a session of its own from a small pool (``sessions``), so one analyst's
slow query never holds up another's, and one analyst (``GPUFLEET_ANALYST``, else the Unix user,
as the client names them) holds at most half the sessions at once: their next query waits for
one of their own to end while other analysts' run. Every session is read-only and bounded
(``sinks.read_path.read_settings``: ClickHouse refuses writes, SET and the table
functions that reach files or the network, and stops a query at its time, row, result and
memory limits), and each query is checked first (``sinks.read_path.check_query``: one statement,
no KILL, no system table that shows the server, no function that reaches past gpufleet's
tables). ``stop`` waits for the queries in flight, which their time limit bounds, before the
engine may be closed. The token is compared in constant time.

The HTTP side is an ASGI application (``QueryServer.app``) that the owning process serves with a
well-kept server (``start(serve)``, with ``gpufleet.asgi_server.AsgiServer``: Hypercorn, which
parses the requests and closes a connection that is idle or sends too slowly), so no local
client, with the token or without, holds a connection or a thread for as long as it likes.
"""

from __future__ import annotations

import getpass
import hmac
import json
import logging
import os
import secrets
import threading
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any

from clickhouse_connect.driver.exceptions import ClickHouseError, DatabaseError

from sinks.read_path import refusal

log = logging.getLogger(__name__)

INFO_FILE = "query-server.json"


_PLAIN = (str, int, float, bool, type(None))


def _encode(value: Any) -> Any:
    if type(value) in _PLAIN:
        return value
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, date):
        return {"$date": value.isoformat()}
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if type(value) in _PLAIN:
        return value
    if isinstance(value, dict):
        if "$datetime" in value:
            return datetime.fromisoformat(value["$datetime"])
        if "$date" in value:
            return date.fromisoformat(value["$date"])
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


class QueryServer:
    """Serves read-only queries on the embedded engine at ``path`` to other local processes."""

    def __init__(self, path: Path, sessions: int = 4, port: int = 0) -> None:
        from sinks.read_path import connect_reader

        self.path, self.port = Path(path), port
        # Opened now: a bad setting is said at start, not at the first query.
        self._idle = [connect_reader(f"chdb://{self.path}") for _ in range(sessions)]
        self.sessions, self.share = sessions, max(1, sessions // 2)  # the most one analyst holds at once
        self.token = secrets.token_urlsafe(24)
        self._busy = 0
        self._holding: Counter[str] = Counter()  # analyst -> sessions they hold now
        self._done = threading.Condition()
        self._http = None  # what serves ``app`` once started

    def query(self, sql: str, parameters: dict | None = None, wait_s: float = 30.0, analyst: str = ""):
        """One query of ``analyst`` in a session of the pool, waiting up to ``wait_s`` for one to be
        free and for the analyst to hold fewer than their share."""
        from sinks.read_path import check_query

        check_query(sql)
        with self._done:
            if not self._done.wait_for(lambda: self._idle and self._holding[analyst] < self.share, timeout=wait_s):
                if self._holding[analyst] >= self.share:
                    raise DatabaseError(
                        f"{analyst or 'this analyst'} already runs {self._holding[analyst]} queries, the most one "
                        f"analyst may run at once on the {self.sessions} query sessions; the next starts when one "
                        "of them ends")
                raise DatabaseError(f"every query session has been busy for {wait_s:g} s; try again")
            client = self._idle.pop()
            self._holding[analyst] += 1
            self._busy += 1
            self._done.notify_all()  # (``holding`` may be waiting for it)
        try:
            return client.query(sql, parameters=parameters)
        finally:
            with self._done:
                self._idle.append(client)
                self._holding[analyst] -= 1
                self._busy -= 1
                self._done.notify_all()

    def holding(self, analyst: str, at_least: int = 0, wait_s: float = 0.0) -> int:
        """The sessions ``analyst`` holds now; with ``at_least``, once they hold that many (or
        ``wait_s`` has passed)."""
        with self._done:
            self._done.wait_for(lambda: self._holding[analyst] >= at_least, timeout=wait_s)
            return self._holding[analyst]

    def app(self):
        """The read path over HTTP, as an ASGI application: ``POST /query`` with the token, a JSON
        ``{"sql": ..., "parameters": ...}`` of at most ``MAX_REQUEST_BYTES``; the query runs in a
        thread of Starlette's pool, in a session of this pool."""
        from starlette.applications import Starlette
        from starlette.concurrency import run_in_threadpool
        from starlette.requests import Request
        from starlette.responses import Response
        from starlette.routing import Route

        def reply(status: int, body: dict) -> Response:
            return Response(json.dumps(body, default=str), status, media_type="application/json")

        async def query(request: Request) -> Response:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, f"Bearer {self.token}".encode()):  # in constant time
                return reply(403, {"error": "wrong or missing token"})
            body = b""
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_REQUEST_BYTES:
                    return reply(413, {"error": f"a request of more than {MAX_REQUEST_BYTES} bytes"})
            try:
                asked = json.loads(body)
                result = await run_in_threadpool(self.query, asked["sql"], asked.get("parameters"),
                                                 analyst=request.headers.get(ANALYST_HEADER, "")[:100])
            except (ClickHouseError, ValueError, KeyError, TypeError) as exc:  # ClickHouse's own message
                return reply(400, {"error": refusal(exc), "code": getattr(exc, "code", None)})
            return reply(200, {"columns": list(result.column_names),
                               "rows": [_encode(list(r)) for r in result.result_rows]})

        return Starlette(routes=[Route("/query", query, methods=["POST"])])

    def start(self, serve) -> QueryServer:
        """Serve ``app`` on loopback with ``serve`` (``gpufleet.asgi_server.AsgiServer``: request
        parsing and idle and read timeouts are its), and leave the port and the token for clients."""
        self._http = serve(self.app(), host="127.0.0.1", port=self.port, name="query-server").start()
        info = self.path / INFO_FILE
        fd = os.open(info, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"port": self._http.port, "pid": os.getpid(), "token": self.token}, f)
        log.info("read-only queries on 127.0.0.1:%d for %s", self._http.port, self.path)
        return self

    def stop(self, timeout_s: float | None = None) -> None:
        """No new query; then wait for those in flight (bounded by their time limit): the engine
        must not close under a running query."""
        (self.path / INFO_FILE).unlink(missing_ok=True)
        if self._http is not None:
            self._http.stop()
            self._http = None
        from sinks.read_path import query_limits

        limit = timeout_s if timeout_s is not None else query_limits()["max_execution_time"] + 5
        with self._done:
            if not self._done.wait_for(lambda: self._busy == 0, timeout=limit):
                log.warning("%d queries still running after %g s; stopping anyway", self._busy, limit)


MAX_REQUEST_BYTES = 1 << 20
ANALYST_HEADER = "X-Gpufleet-Analyst"  # who asks, as the client names them: for the fair share, not for access


def analyst_name() -> str:
    """Who this process queries as: ``GPUFLEET_ANALYST`` (people who share a Unix account), else the user."""
    return os.environ.get("GPUFLEET_ANALYST") or getpass.getuser()


@dataclass
class RemoteResult:
    column_names: list[str]
    result_rows: list[tuple]


class RemoteClient:
    """Enough of a clickhouse-connect client for gpufleet's read-only commands."""

    def __init__(self, port: int, token: str, timeout_s: float = 300.0) -> None:
        self.url = f"http://127.0.0.1:{port}/query"
        self.token = token
        self.timeout_s = timeout_s

    def query(self, sql: str, parameters: dict | None = None) -> RemoteResult:
        request = urllib.request.Request(
            self.url, data=json.dumps({"sql": sql, "parameters": parameters}).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
                     ANALYST_HEADER: analyst_name()})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            answer = json.loads(exc.read())
            raise DatabaseError(answer.get("error", str(exc)), code=answer.get("code")) from None
        return RemoteResult(body["columns"], [tuple(_decode(r)) for r in body["rows"]])


def find_server(path: Path, timeout_s: float = 300.0) -> RemoteClient | None:
    """The query server of the process that owns ``path``, if one is running (each query given up
    after ``timeout_s``)."""
    info = Path(path) / INFO_FILE
    try:
        data = json.loads(info.read_text())
        os.kill(data["pid"], 0)  # still running?
    except (OSError, ValueError, KeyError):
        return None
    return RemoteClient(data["port"], data["token"], timeout_s)
