"""The ClickHouse users of a gpufleet deployment on a server, as SQL an administrator runs once.

- **writer** (the sink): INSERT and SELECT on gpufleet's database, and the DDL of its tables,
  views and migrations there; nothing elsewhere.
- **reader** (``gpufleet sql``, ``workflows``, ``opportunities``, ``report``, dashboards):
  SELECT on gpufleet's database only, under a settings profile that pins ``readonly = 1``
  (no writes, no SET) so that no query can lift it, and the read path's limits
  (``sinks.read_path.query_limits``: time, result rows and bytes, memory) as maxima a
  query may lower, never raise. Without the grants that table functions
  need (``CREATE TEMPORARY TABLE`` and the sources: FILE, URL, REMOTE, S3 …) none of them runs
  even where readonly would allow it.

Passwords are given as SHA-256 hashes: the statements can be shown and kept without the
secret. The embedded engine has one user and no access control: there, the query path's
session is read-only (``sinks.read_path.READ_ONLY_SETTINGS``) and the data directory's
file permissions are the boundary. No ClickHouse server can be run where gpufleet's tests
run: these statements are checked by ClickHouse's parser (``formatQuery``), not applied.
"""

from __future__ import annotations

import hashlib
import re

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def password_sha256(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def _checked(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a plain ClickHouse identifier (letters, digits, _)")
    return name


def access_statements(database: str, reader_sha256: str, writer_sha256: str,
                      reader: str = "gpufleet_reader", writer: str = "gpufleet_writer") -> list[str]:
    """The statements that create (or replace) the reader and the writer of ``database``."""
    db, reader, writer = _checked(database), _checked(reader), _checked(writer)
    for digest in (reader_sha256, writer_sha256):
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ValueError("a password is given as its SHA-256 hash: 64 hexadecimal digits")
    from sinks.read_path import query_limits

    limits = ", ".join(f"{k} = {v} MAX {v}" if isinstance(v, int) else f"{k} = '{v}' CONST"
                       for k, v in query_limits().items())
    return [
        (f"CREATE SETTINGS PROFILE OR REPLACE {reader}_profile SETTINGS readonly = 1 CONST, "
         f"allow_ddl = 0 CONST, allow_introspection_functions = 0 CONST, {limits}"),
        (f"CREATE USER OR REPLACE {reader} IDENTIFIED WITH sha256_hash BY '{reader_sha256}' "
         f"SETTINGS PROFILE '{reader}_profile'"),
        f"GRANT SELECT ON {db}.* TO {reader}",
        f"CREATE USER OR REPLACE {writer} IDENTIFIED WITH sha256_hash BY '{writer_sha256}'",
        (f"GRANT SELECT, INSERT, ALTER, CREATE TABLE, CREATE VIEW, CREATE DATABASE, DROP TABLE, DROP VIEW, "
         f"TRUNCATE, OPTIMIZE ON {db}.* TO {writer}"),
    ]
