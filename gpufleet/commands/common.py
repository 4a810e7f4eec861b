"""What the commands share: where Kafka and ClickHouse are, and how to reach them."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

DEFAULT_DATA_DIR = Path(os.environ.get("GPUFLEET_DATA_DIR", "data"))


def kafka_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", default=os.environ.get("GPUFLEET_BOOTSTRAP"),
                   help="Kafka bootstrap servers (env GPUFLEET_BOOTSTRAP; default: the local broker "
                        "started by `gpufleet kafka start`). How to authenticate comes from the "
                        "environment: GPUFLEET_KAFKA_CONFIG (a client properties file) or "
                        "GPUFLEET_KAFKA_SECURITY_PROTOCOL, _SASL_MECHANISM, _USERNAME, _PASSWORD(_FILE), "
                        "_CA, _CERT, _KEY")
    p.add_argument("--topic-prefix", default=os.environ.get("GPUFLEET_TOPIC_PREFIX", ""),
                   help="prefix for every topic name (env GPUFLEET_TOPIC_PREFIX)")
    p.add_argument("--partitions", type=int, default=int(os.environ.get("GPUFLEET_PARTITIONS", "32")),
                   help="partitions of each topic that scales with the fleet, where this command creates it "
                        "(env GPUFLEET_PARTITIONS; default 32: at most that many workers share the load). "
                        "Topics that exist keep theirs")


def metrics_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-port", type=int, default=int(os.environ.get("GPUFLEET_METRICS_PORT", "0")),
                   help="serve Prometheus metrics on this port at /metrics (env GPUFLEET_METRICS_PORT; "
                        "default 0: off, since two components on one host would take the same port)")
    p.add_argument("--metrics-host", default=os.environ.get("GPUFLEET_METRICS_HOST", "0.0.0.0"),
                   help="address the metrics listen on (env GPUFLEET_METRICS_HOST; default all)")


def serve_metrics(args: argparse.Namespace, registry) -> None:
    """The component's metrics on ``--metrics-port``, if given."""
    from kafka_client.metrics import serve

    server = serve(registry, args.metrics_port, args.metrics_host)
    if server is not None:
        print(f"metrics at http://{args.metrics_host}:{server.server_address[1]}/metrics", flush=True)


def clickhouse_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clickhouse-dsn", default=os.environ.get("GPUFLEET_CLICKHOUSE_DSN"),
                   help="chdb:///path (embedded, the default under the data dir) or http(s)://user@host:port "
                        "(env GPUFLEET_CLICKHOUSE_DSN; the password from GPUFLEET_CLICKHOUSE_PASSWORD or _FILE). "
                        "Queries use GPUFLEET_CLICKHOUSE_READER_DSN where set (the read-only user of "
                        "`gpufleet clickhouse-users`)")
    p.add_argument("--database", default=os.environ.get("GPUFLEET_DATABASE", "gpufleet"))
    p.add_argument("--clickhouse-cluster", default=os.environ.get("GPUFLEET_CLICKHOUSE_CLUSTER"),
                   help="a ClickHouse cluster (a server's remote_servers) to create the tables on: replicated "
                        "tables per shard and a Distributed table each, queried under the same names "
                        "(env GPUFLEET_CLICKHOUSE_CLUSTER)")


def kafka_connection(args: argparse.Namespace, principal: str, check: bool = True):
    """How this command reaches Kafka: ``--bootstrap`` (or GPUFLEET_BOOTSTRAP) with the security
    settings of the environment (``kafka_client.config``), checked before anything runs; or
    the local cluster, where a secure one is reached as ``principal`` unless the environment
    says otherwise. ``check=False``: no check (the agent starts, and spools, while Kafka is away)."""
    from kafka_client.config import Connection, KafkaConfigError, Security, check_access

    try:
        security = Security.from_environment()
    except (KafkaConfigError, OSError) as exc:
        sys.exit(f"Kafka client settings: {exc}")
    if args.bootstrap:
        kafka = Connection(args.bootstrap, security)
    else:
        from gpufleet import local_kafka

        info = local_kafka.status(args.data_dir / "kafka")
        if info is None:
            sys.exit("no --bootstrap given and no local broker running: start one with `gpufleet kafka start`")
        use_local = info.secure and security.protocol == "PLAINTEXT"
        kafka = info.connection(principal) if use_local else Connection(info.bootstrap, security)
    try:
        if check:
            check_access(kafka)
    except KafkaConfigError as exc:
        sys.exit(str(exc))
    logging.getLogger("gpufleet").info("Kafka at %s", kafka)
    return kafka


def clickhouse_dsn(args: argparse.Namespace) -> str:
    from sinks.write_clickhouse import default_dsn

    return args.clickhouse_dsn or default_dsn(args.data_dir)


def query_client(args: argparse.Namespace, read_only: bool = True):
    """A client on the configured ClickHouse, with a plain message when the embedded one is busy."""
    from sinks.write_clickhouse import connect, redact_dsn, scrub

    dsn = (read_only and os.environ.get("GPUFLEET_CLICKHOUSE_READER_DSN")) or clickhouse_dsn(args)
    if dsn.startswith("chdb://") and read_only:
        from gpufleet.query_server import find_server

        remote = find_server(Path(dsn[len("chdb://"):]))
        if remote is not None:  # a sink or demo owns the engine: ask it
            return remote
    try:
        return connect(dsn, read_only=read_only)
    except Exception as exc:  # noqa: BLE001 - any failure to connect ends the command with its reason
        if not dsn.startswith("chdb://"):
            sys.exit(f"cannot reach ClickHouse at {redact_dsn(dsn)}: {scrub(str(exc).splitlines()[0], dsn)}")
        sys.exit(f"cannot open the embedded ClickHouse at {redact_dsn(dsn)}: {exc}\n"
                 "The embedded engine allows one process per data directory: if a gpufleet demo or "
                 "sink is running on it, wait for it to finish, or point --clickhouse-dsn at a server.")


def rates_args(p: argparse.ArgumentParser, what: str = "the reports") -> None:
    p.add_argument("--rates", type=Path, default=None,
                   help=f"TOML file of prices per GPU-hour and grid carbon intensities for {what} "
                        "(docs/rates.example.toml)")


def rates(args: argparse.Namespace):
    """The rates file of ``--rates`` (none: GPU-hours and energy only); a bad one ends the command."""
    from sinks.job_report import RatesError, load_rates

    try:
        return load_rates(args.rates)
    except RatesError as exc:
        sys.exit(str(exc))


def fleet_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--hosts", type=int, default=16)
    p.add_argument("--gpus-per-host", type=int, default=8)
    p.add_argument("--workflows", type=int, default=24)

