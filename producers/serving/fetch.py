"""An engine's endpoint read over HTTP with libcurl (pycurl): each endpoint's own curl handle,
its connection kept open between readings, used alone (``Fetcher.__call__``) or beside the other
endpoints' in one ``pycurl.CurlMulti`` (the agent's ticks: ``scrape.ServingReader``)."""

from __future__ import annotations

import ssl

import pycurl

from producers.serving.engines import EndpointError

MAX_BYTES = 4 << 20  # an endpoint's answer longer than this is not a metrics page


class Fetcher:
    """GETs with libcurl (pycurl), its connection to each endpoint kept open between readings
    (what the engines' HTTP/1.1 servers offer). Measured on the agent's benchmark, a reading's
    request costs a third of the CPU of the standard library's ``http.client`` (0.065 against
    0.18 ms), whose headers go through the email parser: at 8 replicas that is most of what a
    reading may cost the agent. A connection the server closed is opened again by libcurl; no
    proxy from the environment is used (the endpoints are the host's own or the pods'), no
    redirect followed, and nothing but HTTP(S) asked. With ``netrc`` (a file in netrc's format),
    the user and password of an endpoint's host are sent from it. A curl handle is one thread's
    at a time."""

    def __init__(self, netrc: str | None = None) -> None:
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
        if netrc is not None:  # (an engine behind basic auth: its credentials by its host, as curl --netrc-file)
            c.setopt(pycurl.NETRC, pycurl.NETRC_OPTIONAL)
            c.setopt(pycurl.NETRC_FILE, netrc)
        trusted = ssl.get_default_verify_paths()  # the CAs Python's own HTTPS trusts (SSL_CERT_FILE/_DIR too)
        if trusted.cafile:
            c.setopt(pycurl.CAINFO, trusted.cafile)
        if trusted.capath:
            c.setopt(pycurl.CAPATH, trusted.capath)

    def _write(self, chunk: bytes) -> int | None:
        self.size += len(chunk)
        if self.size > MAX_BYTES:
            return 0  # (libcurl stops: a page without a length that grew too long)
        self.body.append(chunk)
        return None

    def start(self, url: str, timeout_s: float | None) -> None:
        """Make the handle ready to read ``url`` (then ``perform``, or a ``CurlMulti``'s); with
        ``timeout_s`` None, libcurl gives it no time limit (its owner keeps one)."""
        self.body, self.size = [], 0
        self.curl.setopt(pycurl.URL, url)
        self.curl.setopt(pycurl.TIMEOUT_MS, 0 if timeout_s is None else max(1, int(timeout_s * 1000)))

    def result(self, error: pycurl.error | None = None) -> str:
        """The page the handle read, or what went wrong as the reader counts it: ``EndpointError``
        (an HTTP error, a page too long), ``TimeoutError``, ``ConnectionError``."""
        if error is not None:
            code, message = error.args[0], error.args[1] if len(error.args) > 1 else ""
            if code == pycurl.E_FILESIZE_EXCEEDED or (code == pycurl.E_WRITE_ERROR and self.size > MAX_BYTES):
                raise EndpointError(f"the answer is longer than {MAX_BYTES} bytes")
            if code == pycurl.E_OPERATION_TIMEDOUT:
                raise TimeoutError(f"timed out: {message}")
            raise ConnectionError(f"{message} (curl error {code})")
        status = self.curl.getinfo(pycurl.RESPONSE_CODE)
        if status != 200:
            raise EndpointError(f"HTTP {status}")
        return b"".join(self.body).decode("utf-8", errors="replace")

    def __call__(self, url: str, timeout_s: float) -> str:
        """``url``'s page, read here and now."""
        self.start(url, timeout_s)
        error = None
        try:
            self.curl.perform()
        except pycurl.error as exc:
            error = exc
        return self.result(error)

    def close(self) -> None:
        self.curl.close()
