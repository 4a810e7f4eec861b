"""The ``gpufleet`` command: one entry point for the broker, the pipeline's stages, the demo and SQL.
Each group of commands is a module of ``gpufleet.commands``: its parser and what it runs."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path

from gpufleet.commands import (
    agent,
    demo,
    enforce,
    kafka,
    queries,
    replay,
    schemas,
    serve,
    sink,
    slurm,
    traces,
    worker,
)
from gpufleet.commands.common import DEFAULT_DATA_DIR
from gpufleet.errors import explain

GROUPS = (kafka, worker, sink, agent, replay, slurm, traces, queries, schemas, serve, enforce, demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpufleet", description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                        help="where the local broker, worker state and embedded ClickHouse live "
                             "(env GPUFLEET_DATA_DIR; default ./data)")
    parser.add_argument("--log-level", default="warning", type=str.lower,
                        choices=["debug", "info", "warning", "error", "critical"])
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error, not one line")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command. Its usage mistakes end it with one line and status 2, what goes wrong
    while it runs with one line and status 1 (``gpufleet.errors``); ``--debug`` shows tracebacks."""
    args = build_parser().parse_args(argv)  # (argparse: the usage and one line, status 2)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (``| head``): stop quietly, as cat and grep do
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit's flush
        return 141  # 128 + SIGPIPE
    except SystemExit as exc:  # a command that ends itself with a message: the same one line
        if not isinstance(exc.code, str):
            raise
        message = exc.code.removeprefix(f"gpufleet {args.command}: ")
        print(f"gpufleet {args.command}: {' '.join(message.split())}", file=sys.stderr)
        return 1
    except Exception as exc:
        if args.debug:
            raise
        status, line = explain(exc)
        print(f"gpufleet {args.command}: {line}", file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())
