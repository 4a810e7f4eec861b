"""What a mistake looks like on the command line, in one place for every command: one line
naming what was wrong and how to fix it, exit status 2 for a usage mistake (arguments, files,
settings, names the user gave) and 1 for what went wrong while running (a port in use, a broker
or ClickHouse that does not answer, credentials refused); a traceback only with ``--debug``.

Commands raise; ``gpufleet.cli.main`` turns what they raise into that line (``explain``).
"""

from __future__ import annotations

import errno
import json
import tomllib

import msgspec

USAGE, RUNTIME = 2, 1


class UsageError(ValueError):
    """Something the user gave (an argument, a file, a setting) that cannot be used; the text
    says what and how to fix it."""


class Failed(RuntimeError):
    """What a command found wrong while running (no broker, a server that does not answer);
    the text says what and what to do."""


def explain(exc: BaseException) -> tuple[int, str]:
    """(exit status, the one line to print) for an exception a command raised."""
    from clickhouse_connect.driver.exceptions import ClickHouseError
    from confluent_kafka import KafkaException

    if isinstance(exc, tomllib.TOMLDecodeError):
        return USAGE, f"not valid TOML: {exc}"
    if isinstance(exc, json.JSONDecodeError):
        return USAGE, f"not valid JSON: {exc}"
    if isinstance(exc, msgspec.ValidationError):
        return USAGE, f"a setting of the wrong kind: {exc}"
    if isinstance(exc, UnicodeDecodeError):
        return USAGE, f"not text in UTF-8: {exc.reason} at byte {exc.start}"
    if isinstance(exc, Failed):
        return RUNTIME, _one_line(exc)
    if isinstance(exc, ValueError):
        return USAGE, _one_line(exc)
    if isinstance(exc, OSError):
        return _os_error(exc)
    if isinstance(exc, KafkaException):
        error = exc.args[0] if exc.args else None
        return RUNTIME, f"Kafka: {error.str() if hasattr(error, 'str') else exc}"
    if isinstance(exc, ClickHouseError):
        from sinks.read_path import refusal

        said = refusal(exc)
        if "UNKNOWN_DATABASE" in said:
            what = said.split("DB::Exception: ")[-1].split(" (")[0]
            return RUNTIME, f"ClickHouse: {what}: the sink makes it when it starts (gpufleet sink, or make demo)"
        return RUNTIME, f"ClickHouse: {said}"
    return RUNTIME, f"unexpected {type(exc).__name__}: {_one_line(exc)} (run with --debug for the traceback)"


def _os_error(exc: OSError) -> tuple[int, str]:
    """A file the user named that is missing or of the wrong kind (usage), or a port, an address
    or a connection that failed (runtime)."""
    if isinstance(exc, FileNotFoundError):
        return USAGE, f"no such file or directory: {exc.filename}" + (
            f" (and {exc.filename2})" if exc.filename2 else ""
        )
    if isinstance(exc, IsADirectoryError):
        return USAGE, f"a directory where a file is needed: {exc.filename}"
    if isinstance(exc, NotADirectoryError):
        return USAGE, f"a file where a directory is needed: {exc.filename}"
    if isinstance(exc, PermissionError):
        return USAGE, f"permission denied: {exc.filename or exc.strerror}"
    if exc.errno == errno.EADDRINUSE:
        return RUNTIME, "the address is already in use: another process listens on that port; choose another"
    if exc.errno == errno.EADDRNOTAVAIL:
        return RUNTIME, "that address is not one of this machine's: choose another host to listen on"
    if isinstance(exc, ConnectionError | TimeoutError):
        return RUNTIME, f"{exc.strerror or exc}"
    return RUNTIME, f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:1000] or type(exc).__name__
