"""``gpufleet demo``: the whole pipeline on one machine."""

from __future__ import annotations

import argparse

from gpufleet.commands.common import fleet_args, port, positive


def add(sub) -> None:
    p = sub.add_parser("demo", help="run the whole pipeline on a simulated fleet and summarise it")
    fleet_args(p)
    p.add_argument("--sim-minutes", type=positive, default=30.0, help="simulated minutes of fleet activity")
    p.add_argument("--speed", type=positive, default=30.0, help="simulated seconds per wall second")
    p.add_argument("--max-wall-s", type=positive, default=180.0, help="stop after this many wall seconds at most")
    p.add_argument("--keep-kafka", action="store_true", help="leave the broker running afterwards")
    p.add_argument("--secure", action="store_true",
                   help="run it on a secure local cluster (as `gpufleet kafka start --secure`): SASL_SSL, mutual "
                        "TLS and ACLs, the agent, worker and sink each as its own user")
    p.add_argument("--kafka-port", type=port, default=None,
                   help="the local broker's client port, when the demo makes it (default: a free one)")
    p.add_argument("--query-port", type=port, default=0,
                   help="the loopback port `gpufleet sql` & co. reach the running demo's ClickHouse on "
                        "(default: a free one, written to the data dir)")
    p.add_argument("--serve-port", type=port, default=0,
                   help="the loopback port of the owners' service while the demo runs (default: a free one)")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from gpufleet.demo import DemoOptions, run_demo

    return run_demo(DemoOptions(
        data_dir=args.data_dir, seed=args.seed, hosts=args.hosts, gpus_per_host=args.gpus_per_host,
        workflows=args.workflows, sim_minutes=args.sim_minutes, speed=args.speed,
        max_wall_s=args.max_wall_s, keep_kafka=args.keep_kafka, secure=args.secure,
        kafka_port=args.kafka_port, query_port=args.query_port, serve_port=args.serve_port,
    ))

