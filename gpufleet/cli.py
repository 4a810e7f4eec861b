"""The ``gpufleet`` command: one entry point for the broker, the pipeline's stages, the demo and SQL.
Each group of commands is a module of ``gpufleet.commands``: its parser and what it runs."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from gpufleet.commands import (
    agent,
    demo,
    enforce,
    kafka,
    queries,
    schemas,
    sink,
    slurm,
    traces,
    worker,
)
from gpufleet.commands.common import DEFAULT_DATA_DIR

GROUPS = (kafka, worker, sink, agent, slurm, traces, queries, schemas, enforce, demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpufleet", description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                        help="where the local broker, worker state and embedded ClickHouse live "
                             "(env GPUFLEET_DATA_DIR; default ./data)")
    parser.add_argument("--log-level", default="warning")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
