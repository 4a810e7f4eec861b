"""``gpufleet kafka``, ``kafka-access`` and ``topics``: the local cluster, a deployment's Kafka security, the topics."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufleet.commands.common import kafka_args, kafka_connection, port, positive_int
from gpufleet.errors import Failed, UsageError
from kafka_client.config import WORKER_APP_ID


def add(sub) -> None:
    p = sub.add_parser("kafka", help="start, stop or check the local Kafka broker or cluster")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--brokers", type=positive_int, default=1,
                   help="nodes of the local cluster (KRaft, each broker and controller); 3 replicates "
                        "every topic three times, a write acknowledged by two")
    p.add_argument("--secure", action="store_true",
                   help="a cluster that speaks only SASL_SSL (SCRAM-SHA-512 and a client certificate), "
                        "with a user and ACLs per component; its CA, certificates and passwords are made "
                        "under the data dir the first time")
    p.add_argument(
        "--port",
        type=port,
        default=None,
        help="client port of node 1; node i listens on PORT + i - 1 (default: free ones); "
        "a cluster keeps its ports once made",
    )
    p.set_defaults(func=cmd_kafka)

    p = sub.add_parser("kafka-access", help="a deployment's Kafka security: make its CA, certificates, passwords "
                                            "and client settings once (credentials), then create its users and "
                                            "ACLs as the administrator (grant)")
    p.add_argument("action", choices=["credentials", "grant"])
    p.add_argument("--dir", type=Path, required=True, help="where the secrets live (kept 0700)")
    p.add_argument("--nodes", default="", help="credentials: the nodes' host names, comma-separated, in node id order")
    p.add_argument("--external-host", default=None, help="credentials: another name the nodes answer to")
    p.add_argument("--mount", default=None,
                   help="credentials: where a component's container sees its clients/<principal> folder")
    p.add_argument("--app-id", default=WORKER_APP_ID, help="grant: the worker's app id (its group and changelogs)")
    kafka_args(p)
    p.set_defaults(func=cmd_kafka_access)

    p = sub.add_parser("topics", help="create gpufleet's topics (idempotent)")
    kafka_args(p)
    p.set_defaults(func=cmd_topics)


def cmd_kafka(args: argparse.Namespace) -> int:
    from gpufleet.local import kafka as local_kafka

    kafka_dir = args.data_dir / "kafka"
    if args.action == "start" and args.port and args.port + args.brokers - 1 > 65535:
        raise UsageError(f"--port {args.port}: {args.brokers} nodes need ports up to {args.port + args.brokers - 1}, "
                         "past 65535")
    if args.action == "start":
        try:
            info = local_kafka.start(kafka_dir, brokers=args.brokers, port=args.port, secure=args.secure)
        except local_kafka.KafkaRunnerError as exc:
            raise Failed(str(exc)) from exc
        print(
            f"Kafka is running: bootstrap {info.bootstrap}" + (" (SASL_SSL, mutual TLS, ACLs)" if info.secure else "")
        )
        for node in info.nodes:
            print(f"  node {node.node_id}: {node.address}, pid {node.pid}, log {node.log_file}")
        if info.credentials is not None:
            print(f"  each component's client settings: {info.credentials.properties('<component>')} "
                  "(used by gpufleet's commands here by themselves; elsewhere: GPUFLEET_KAFKA_CONFIG)")
    elif args.action == "stop":
        print("stopped" if local_kafka.stop(kafka_dir) else "no broker was running")
    else:
        recorded = local_kafka.read_state(kafka_dir.resolve())
        info = local_kafka.status(kafka_dir)
        if recorded is None or info is None:
            print("not running")
            return 1
        live = local_kafka.live_brokers(info.connection())
        for node in recorded.nodes:
            running = node.node_id in {n.node_id for n in info.nodes}
            state = ("answering" if node.node_id in live else "NOT answering") if running else "stopped"
            print(f"node {node.node_id}: {node.address}, {state}, log {node.log_file}")
        return 0 if live >= {n.node_id for n in recorded.nodes} else 1
    return 0


def cmd_kafka_access(args: argparse.Namespace) -> int:
    """A deployment's Kafka secrets (made once) and its users and ACLs (granted as admin)."""
    from gpufleet.local.kafka_security import LocalCredentials, create_users, grant

    if args.dir.exists() and not args.dir.is_dir():
        raise UsageError(f"--dir {args.dir} is a file: name a folder for the secrets (made if missing)")
    credentials = LocalCredentials(args.dir)
    if args.action == "credentials":
        if credentials.exists():
            print(f"{args.dir} holds credentials already; nothing made")
            return 0
        nodes = [n for n in args.nodes.split(",") if n]
        if not nodes:
            raise UsageError("name the nodes with --nodes (the host names clients reach them by)")
        extra = tuple(h for h in (args.external_host, "localhost") if h)
        credentials.create({i: (name, *extra) for i, name in enumerate(nodes, 1)}, mount=args.mount)
        print(f"made a CA, {len(nodes)} node certificate(s) and a folder per principal under {args.dir / 'clients'}")
        return 0
    if not credentials.exists():
        raise UsageError(f"no credentials in {args.dir}: make them with `gpufleet kafka-access credentials`")
    admin = kafka_connection(args, "admin")
    create_users(admin, credentials.passwords())
    n = grant(admin, args.topic_prefix, worker_app_id=args.app_id)
    print(f"users of {', '.join(credentials.passwords())} set; {n} ACLs granted")
    return 0


def cmd_topics(args: argparse.Namespace) -> int:
    from kafka_client.admin import align_configs, ensure_topics

    admin = kafka_connection(args, "admin")
    created = ensure_topics(admin, prefix=args.topic_prefix, partitions=args.partitions)
    print("created: " + (", ".join(created) if created else "nothing (all exist)"))
    changed = align_configs(admin, prefix=args.topic_prefix)
    if changed:
        print("settings changed: " + ", ".join(changed))
    return 0

