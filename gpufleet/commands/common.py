"""What the commands share: where Kafka and ClickHouse are, and how to reach them."""

from __future__ import annotations

import argparse
import logging
import math
import os
from pathlib import Path

from gpufleet.errors import Failed, UsageError

DEFAULT_DATA_DIR = Path(os.environ.get("GPUFLEET_DATA_DIR", "data"))


# -- argument types: a value no command can use is refused while the arguments are read ----------

def _number(kind, low: float | None, low_open: bool, high: float | None, says: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'a whole number' if kind is int else 'a number'}") \
                from None
        if math.isnan(value) or (low is not None and (value <= low if low_open else value < low)) or (
                high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text} is not {says}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


port = _number(int, 0, False, 65535, "a port (0 to 65535; 0: any free one)")
positive_int = _number(int, 0, True, None, "a whole number of at least 1")
non_negative_int = _number(int, 0, False, None, "a whole number of 0 or more")
positive = _number(float, 0, True, float("inf"), "a number greater than 0")
non_negative = _number(float, 0, False, float("inf"), "a number of 0 or more")
fraction = _number(float, 0, True, 1, "a fraction greater than 0 and at most 1")
percent = _number(float, 0, False, 100, "a percentage from 0 to 100")


def database_name(text: str) -> str:
    """A ClickHouse database's name as every command's queries can use it (one identifier, none
    that ClickHouse would read as something else: ``ClickHouseWriter.check_database``)."""
    from sinks.write_clickhouse import ClickHouseWriter

    try:
        ClickHouseWriter.check_database(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def kafka_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", default=os.environ.get("GPUFLEET_BOOTSTRAP"),
                   help="Kafka bootstrap servers (env GPUFLEET_BOOTSTRAP; default: the local broker "
                        "started by `gpufleet kafka start`). How to authenticate comes from the "
                        "environment: GPUFLEET_KAFKA_CONFIG (a client properties file) or "
                        "GPUFLEET_KAFKA_SECURITY_PROTOCOL, _SASL_MECHANISM, _USERNAME, _PASSWORD(_FILE), "
                        "_CA, _CERT, _KEY")
    p.add_argument("--topic-prefix", default=os.environ.get("GPUFLEET_TOPIC_PREFIX", ""),
                   help="prefix for every topic name (env GPUFLEET_TOPIC_PREFIX)")
    p.add_argument("--partitions", type=positive_int, default=int(os.environ.get("GPUFLEET_PARTITIONS", "32")),
                   help="partitions of each topic that scales with the fleet, where this command creates it "
                        "(env GPUFLEET_PARTITIONS; default 32: at most that many workers share the load). "
                        "Topics that exist keep theirs")


def metrics_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-port", type=port, default=int(os.environ.get("GPUFLEET_METRICS_PORT", "0")),
                   help="serve Prometheus metrics on this port at /metrics (env GPUFLEET_METRICS_PORT; "
                        "default 0: off, since two components on one host would take the same port)")
    p.add_argument("--metrics-host", default=os.environ.get("GPUFLEET_METRICS_HOST", "127.0.0.1"),
                   help="address the metrics listen on (env GPUFLEET_METRICS_HOST; default 127.0.0.1, this "
                        "host only: give 0.0.0.0 for a Prometheus elsewhere)")


def watchdog_args(p: argparse.ArgumentParser, stalled: str = "its consume loop has not gone round",
                  longer: str = "a ClickHouse insert and its retries may take") -> None:
    p.add_argument("--stall-exit-s", type=non_negative, default=os.environ.get("GPUFLEET_STALL_EXIT_S", "1800"),
                   help=f"end this process (exit status 1, every thread's stack on stderr) when {stalled} for this "
                        "many seconds, for its supervisor to start it again (env GPUFLEET_STALL_EXIT_S; default "
                        f"1800, longer than {longer}; 0: never)")


def watch(args: argparse.Namespace, loop) -> None:
    """``--stall-exit-s`` kept on ``loop`` (the component's ``ConsumeLoop``: ``kafka_client.watchdog``)."""
    if args.stall_exit_s > 0:
        from kafka_client.watchdog import Watchdog

        loop.watchdog = Watchdog(args.stall_exit_s)


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
    p.add_argument("--database", type=database_name, default=os.environ.get("GPUFLEET_DATABASE", "gpufleet"),
                   help="the ClickHouse database (env GPUFLEET_DATABASE)")
    p.add_argument("--clickhouse-cluster", default=os.environ.get("GPUFLEET_CLICKHOUSE_CLUSTER"),
                   help="a ClickHouse cluster (a server's remote_servers) to create the tables on: replicated "
                        "tables per shard and a Distributed table each, queried under the same names "
                        "(env GPUFLEET_CLICKHOUSE_CLUSTER)")


def check_id(what: str, value: str) -> str:
    """``value`` as the ``what`` id (a workflow's, a host's) the contract allows, else UsageError."""
    from schemas.validate_ids import id_error

    reason = id_error("workflow_id" if what == "workflow" else what, value)
    if reason:
        raise UsageError(f"{what} id {value!r}: {reason}")
    return value


def parse_duration(text: str) -> float:
    """'10s', '1m', '2h', '7d' in seconds, else UsageError."""
    from gpufleet.reports.opportunities import parse_since

    try:
        seconds = parse_since(text) if text != "all" else None
    except ValueError:
        seconds = None
    if seconds is None or seconds <= 0:
        raise UsageError(f"duration {text!r}: expected a number with s, m, h or d, such as 10s")
    return seconds


def kafka_connection(args: argparse.Namespace, principal: str, check: bool = True):
    """How this command reaches Kafka: ``--bootstrap`` (or GPUFLEET_BOOTSTRAP) with the security
    settings of the environment (``kafka_client.config``), checked before anything runs; or
    the local cluster, where a secure one is reached as ``principal`` unless the environment
    says otherwise. ``check=False``: no check (the agent starts, and spools, while Kafka is away)."""
    from kafka_client.config import Connection, KafkaConfigError, Security, check_access

    try:
        security = Security.from_environment()
    except (KafkaConfigError, OSError) as exc:
        raise UsageError(f"Kafka client settings: {exc}") from None
    if args.bootstrap:
        kafka = Connection(args.bootstrap, security)
    else:
        from gpufleet.local import kafka as local_kafka

        info = local_kafka.status(args.data_dir / "kafka")
        if info is None:
            raise Failed("no --bootstrap given and no local broker running: start one with `gpufleet kafka start`")
        use_local = info.secure and security.protocol == "PLAINTEXT"
        kafka = info.connection(principal) if use_local else Connection(info.bootstrap, security)
    try:
        if check:
            check_access(kafka)
    except KafkaConfigError as exc:
        raise Failed(str(exc)) from None
    logging.getLogger("gpufleet").info("Kafka at %s", kafka)
    return kafka


def clickhouse_dsn(args: argparse.Namespace) -> str:
    from sinks.clickhouse_client import default_dsn

    return args.clickhouse_dsn or default_dsn(args.data_dir)


def reader_dsn(args: argparse.Namespace) -> str:
    """Where the read path reads: ``GPUFLEET_CLICKHOUSE_READER_DSN`` (a read-only account), else
    the DSN given."""
    return os.environ.get("GPUFLEET_CLICKHOUSE_READER_DSN") or clickhouse_dsn(args)


def query_client(args: argparse.Namespace, read_only: bool = True):
    """A client on the configured ClickHouse, with a plain message when the embedded one is busy."""
    from sinks.clickhouse_client import connect, redact_dsn, scrub
    from sinks.read_path import connect_reader

    dsn = reader_dsn(args) if read_only else clickhouse_dsn(args)
    if dsn.startswith("chdb://") and read_only:
        from sinks.query_server import find_server

        remote = find_server(Path(dsn[len("chdb://"):]))
        if remote is not None:  # a sink or demo owns the engine: ask it
            return remote
    try:
        return connect_reader(dsn) if read_only else connect(dsn)
    except Exception as exc:
        if isinstance(exc, ValueError | OSError):
            raise  # a DSN or a password file the user gave: said as such
        if not dsn.startswith("chdb://"):
            raise Failed(f"cannot reach ClickHouse at {redact_dsn(dsn)}: {scrub(str(exc).splitlines()[0], dsn)}") \
                from None
        raise Failed(f"cannot open the embedded ClickHouse at {redact_dsn(dsn)}: {exc}. The embedded engine allows "
                     "one process per data directory: if a gpufleet demo or sink is running on it, wait for it to "
                     "finish, or point --clickhouse-dsn at a server.") from None


def rates_args(p: argparse.ArgumentParser, what: str = "the reports") -> None:
    p.add_argument("--rates", type=Path, default=None,
                   help=f"TOML file of prices per GPU-hour and grid carbon intensities for {what} "
                        "(docs/rates.example.toml)")


def rates(args: argparse.Namespace):
    """The rates file of ``--rates`` (none: GPU-hours and energy only); a bad one ends the command."""
    from sinks.job_report import load_rates

    return load_rates(args.rates)  # (a RatesError is a usage mistake: gpufleet.errors)


def fleet_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--hosts", type=positive_int, default=16)
    p.add_argument("--gpus-per-host", type=positive_int, default=8)
    p.add_argument("--workflows", type=positive_int, default=24)

