"""How gpufleet reaches ClickHouse: the DSN (embedded ``chdb://`` or a server), its secrets
kept out of what is printed, and what a server's error means (its code; worth a retry or not).

The write path (``sinks.write_clickhouse``) and the read path (``sinks.read_path``) both open
their sessions here (``connect``).
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path
from typing import Any

import clickhouse_connect
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import OperationalError

# Server error codes worth retrying: timeouts, network, memory pressure, too many parts/queries.
TRANSIENT_CODES = frozenset({159, 160, 202, 203, 209, 210, 236, 241, 242, 252, 285, 319, 425, 999})


def default_dsn(data_dir: Path) -> str:
    return f"chdb://{(data_dir / 'clickhouse').resolve()}"


PASSWORD_ENV = "GPUFLEET_CLICKHOUSE_PASSWORD"


def dsn_password(env: dict | None = None) -> str | None:
    """The ClickHouse password from ``GPUFLEET_CLICKHOUSE_PASSWORD`` or the file that
    ``GPUFLEET_CLICKHOUSE_PASSWORD_FILE`` names (a DSN should not hold it: DSNs get printed)."""
    env = os.environ if env is None else env
    if env.get(PASSWORD_ENV + "_FILE"):
        return Path(env[PASSWORD_ENV + "_FILE"]).read_text().strip()
    return env.get(PASSWORD_ENV) or None


def redact_dsn(dsn: str) -> str:
    """``dsn`` as it may be shown: without its password."""
    parts = urllib.parse.urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def scrub(text: str, dsn: str) -> str:
    """``text`` (an error's, say) with the DSN's password and the environment's replaced by ***."""
    for secret in (urllib.parse.urlsplit(dsn).password, dsn_password()):
        if secret:
            text = text.replace(secret, "***").replace(urllib.parse.quote(secret, safe=""), "***")
    return text


def connect(dsn: str, settings: dict | None = None) -> Client:
    """A clickhouse-connect client for ``chdb:///path`` (embedded) or ``http(s)://…`` (server),
    its session under ``settings`` (the read path's: ``sinks.read_path.connect_reader``).
    A server's password comes from the DSN or from ``dsn_password``.
    """
    scheme = urllib.parse.urlsplit(dsn).scheme
    if scheme not in ("chdb", "http", "https"):
        raise ValueError(f"ClickHouse DSN {redact_dsn(dsn)!r}: expected chdb:///path (the embedded engine) or "
                         "http(s)://user@host:port (a server)")
    if dsn.startswith("chdb://"):
        path = dsn[len("chdb://"):]
        if path.startswith("/"):
            Path(path).mkdir(parents=True, exist_ok=True)
        return clickhouse_connect.get_client(dsn=dsn, settings=settings)
    options: dict[str, Any] = {}
    password = dsn_password()
    if password is not None and urllib.parse.urlsplit(dsn).password is None:
        options["password"] = password
    return clickhouse_connect.get_client(dsn=dsn, settings=settings, **options)


def error_code(exc: BaseException) -> int | None:
    """ClickHouse's error code, as clickhouse-connect's exception carries it (None: not a server
    error, such as a connection refused)."""
    code = getattr(exc, "code", None)
    return code if isinstance(code, int) else None


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, OperationalError):  # connection refused, reset, timed out
        return True
    return error_code(exc) in TRANSIENT_CODES
