"""``gpufleet slurm prolog|epilog|comments``: what gpufleet adds to a Slurm cluster.

``prolog`` and ``epilog`` are what slurmd runs as root when it gives a job resources on a node
and when it takes them back (``Prolog=``/``Epilog=`` in slurm.conf, through the scripts in
``docker/slurm/``): they record the job's allocation for the agent (``--allocations slurm``)
and dcgm-exporter. They never fail a job: a prolog that exits non-zero drains the node.
``comments`` writes each ended job's efficiency line into its accounting record.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

from gpufleet.commands.common import kafka_args, kafka_connection, metrics_args, serve_metrics, watch, watchdog_args

DEFAULT_DIR = Path(os.environ.get("GPUFLEET_SLURM_DIR", "/run/gpufleet/slurm"))


def add(sub) -> None:
    slurm = sub.add_parser("slurm", help="Slurm's prolog and epilog for the agent, and job records in its accounting")
    verbs = slurm.add_subparsers(dest="verb", required=True)
    for verb, what in (("prolog", "record the job's allocation on this node (run by slurmd as Prolog)"),
                       ("epilog", "record the job's end on this node (run by slurmd as Epilog)")):
        p = verbs.add_parser(verb, help=what)
        p.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                       help="where the agent reads allocations (env GPUFLEET_SLURM_DIR; default /run/gpufleet/slurm)")
        p.set_defaults(func=cmd_prolog if verb == "prolog" else cmd_epilog)
    p = verbs.add_parser("comments", help="write each ended Slurm job's efficiency line into its accounting "
                                          "record (AdminComment; needs slurmdbd)")
    kafka_args(p)
    p.add_argument("--cluster", default=os.environ.get("GPUFLEET_CLUSTER"),
                   help="the Slurm cluster whose jobs to write (env GPUFLEET_CLUSTER; default: sacctmgr's own)")
    p.add_argument("--group-id", default="gpufleet-slurm-comments")
    metrics_args(p)
    watchdog_args(p)
    p.set_defaults(func=cmd_comments)


def _record(args: argparse.Namespace, ended: bool) -> int:
    from producers.agent.allocations.slurm import SlurmDirectory, allocation_from_environment

    try:
        allocation = allocation_from_environment(os.environ, ended=ended)
        directory = SlurmDirectory(args.dir)
        now = int(time.time() * 1000)
        if ended:
            directory.ended(allocation, now)
        else:
            directory.started(allocation, now)
        if allocation.unknown:  # (each reason was logged as it was found)
            print(f"gpufleet slurm {'epilog' if ended else 'prolog'}: job {allocation.job_id}: the scheduler did not "
                  f"say its {', '.join(allocation.unknown)}; recorded as unknown", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - a failing prolog or epilog drains the node: say why, never fail
        print(f"gpufleet slurm {'epilog' if ended else 'prolog'}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 0


def cmd_prolog(args: argparse.Namespace) -> int:
    return _record(args, ended=False)


def cmd_epilog(args: argparse.Namespace) -> int:
    return _record(args, ended=True)


def cmd_comments(args: argparse.Namespace) -> int:
    from sinks.slurm_comments import METRICS, SlurmComments

    writer = SlurmComments(kafka_connection(args, "slurm"), group_id=args.group_id, topic_prefix=args.topic_prefix,
                           cluster=args.cluster)
    watch(args, writer.loop)
    serve_metrics(args, METRICS.registry)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    writer.run(stop)
    print(f"slurm comments stopped: {len(writer.written)} jobs' lines written")
    return 0
