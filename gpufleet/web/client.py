"""The command line's side of the owners' service: ``gpufleet job``, ``jobs``, ``workflow`` and
``serving`` on a login node ask it as the Unix user who runs them, with a fresh MUNGE credential per request
(made for that request only: ``gpufleet.web.identity``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

from gpufleet.errors import Failed
from gpufleet.web.identity import MUNGE_HEADER, munge_credential, request_payload


class NotFound(Exception):
    """The service knows no such thing, or none the asker may see (it does not say which)."""


class ServiceClient:
    def __init__(self, url: str, munge_socket: str | None = None, timeout_s: float = 60.0) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"--url {url!r}: an http(s):// address of `gpufleet serve`")
        self.url, self.munge_socket, self.timeout_s = url.rstrip("/"), munge_socket, timeout_s

    def get(self, path: str, **query: str) -> dict:
        target = path + ("?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
                         if any(v is not None for v in query.values()) else "")
        credential = munge_credential(request_payload("GET", target), self.munge_socket)
        request = urllib.request.Request(self.url + target, headers={MUNGE_HEADER: credential,
                                                                     "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                said = json.loads(exc.read()).get("error", "")
            except ValueError:
                said = ""
            if exc.code == 404:
                raise NotFound(said or "not found") from None
            raise Failed(f"the gpufleet service refused: {said or exc.reason} (HTTP {exc.code})") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise Failed(f"cannot reach the gpufleet service at {self.url}: {getattr(exc, 'reason', exc)}") from None

    def job(self, workflow_id: str) -> dict:
        return self.get("/api/jobs/" + urllib.parse.quote(workflow_id, safe=""))

    def jobs(self, since: str | None = None, state: str | None = None) -> list[dict]:
        return self.get("/api/jobs", since=since, state=state)["jobs"]

    def services(self, since: str | None = None) -> list[dict]:
        return self.get("/api/services", since=since)["services"]
