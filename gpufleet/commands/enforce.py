"""``gpufleet enforce``: the actions of the enforcement ladders (``sinks.enforce_jobs``)."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from gpufleet.commands.common import (
    kafka_args,
    kafka_connection,
    metrics_args,
    non_negative_int,
    positive,
    serve_metrics,
    watch,
    watchdog_args,
)


def add(sub) -> None:
    p = sub.add_parser("enforce", help="run the actions the enforcement ladders let fall due (a dry run "
                                       "unless --act and the ladder's act = true)")
    kafka_args(p)
    p.add_argument("--policy", type=Path, required=True,
                   help="the enforcement ladders (TOML), the same file the worker's --enforcement reads")
    p.add_argument("--act", action="store_true",
                   help="run the commands of ladders with act = true; without it every action is a dry run")
    p.add_argument("--group-id", default="gpufleet-enforcer")
    p.add_argument(
        "--retries", type=non_negative_int, default=2, help="a command that fails is tried this many more times"
    )
    p.add_argument("--timeout-s", type=positive, default=60.0, help="a command that runs longer has failed")
    metrics_args(p)
    watchdog_args(p)
    p.set_defaults(func=cmd_enforce)


def cmd_enforce(args: argparse.Namespace) -> int:
    from kafka_client.admin import ensure_topics
    from sinks.enforce_jobs import METRICS, Enforcer
    from streams.enforcement.ladder import load_ladders

    ladders = load_ladders(args.policy)  # (a PolicyError names the file and the ladder)
    serve_metrics(args, METRICS.registry)
    kafka = kafka_connection(args, "enforcer")
    ensure_topics(kafka, prefix=args.topic_prefix, partitions=args.partitions)
    enforcer = Enforcer(kafka, ladders, act=args.act, group_id=args.group_id, topic_prefix=args.topic_prefix,
                        retries=args.retries, timeout_s=args.timeout_s)
    watch(args, enforcer.loop)
    acting = [ladder.name for ladder in ladders if ladder.act] if args.act else []
    print(f"enforcer: {len(ladders)} ladder(s); acting for {', '.join(acting) or 'none (dry run)'}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stats = enforcer.run(stop)
    print(f"enforcer stopped: {stats.acted} acted, {stats.would_act} dry runs, {stats.failed} failed, "
          f"{stats.cancelled} cancelled")
    return 0
