"""``gpufleet sink`` and ``notify``: ClickHouse, and the people alerts are for."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from gpufleet.commands.common import (
    clickhouse_args,
    clickhouse_dsn,
    kafka_args,
    kafka_connection,
    metrics_args,
    non_negative,
    port,
    rates,
    rates_args,
    reader_dsn,
    serve_metrics,
    watch,
    watchdog_args,
)
from gpufleet.errors import UsageError


def add(sub) -> None:
    p = sub.add_parser("sink", help="write gpufleet's topics into ClickHouse")
    kafka_args(p)
    clickhouse_args(p)
    p.add_argument("--group-id", default="gpufleet-clickhouse-sink")
    p.add_argument("--samples-in-python", action="store_true",
                   default=os.environ.get("GPUFLEET_SINK_SAMPLES_IN_PYTHON", "") not in ("", "0"),
                   help="decode and check the agents' samples in Python instead of handing them to ClickHouse's "
                        "own Avro parser (about 2.5x slower; env GPUFLEET_SINK_SAMPLES_IN_PYTHON=1)")
    p.add_argument("--query-port", type=port, default=int(os.environ.get("GPUFLEET_QUERY_PORT", "0")),
                   help="with the embedded engine: the loopback port `gpufleet sql` & co. reach it on while "
                        "this sink holds it (env GPUFLEET_QUERY_PORT; default: a free one, written to the data dir)")
    p.add_argument("--fence-s", type=non_negative, default=os.environ.get("GPUFLEET_SINK_FENCE_S", "1800"),
                   help="for this long after being given a partition, read what ClickHouse holds of it before each "
                        "insert, so that an insert of its previous reader that was held up and lands late is not "
                        "stored twice (env GPUFLEET_SINK_FENCE_S; default 1800: as long as --stall-exit-s, past "
                        "which a held reader ends; 0: never)")
    metrics_args(p)
    watchdog_args(p)
    p.set_defaults(func=cmd_sink)

    p = sub.add_parser("notify", help="message owners and teams about alerts (webhook, e-mail)")
    kafka_args(p)
    p.add_argument("--routing", type=Path, required=True, help="routing file (TOML): see sinks/route_alerts.py")
    p.add_argument("--group-id", default="gpufleet-notifier")
    p.add_argument("--reports", choices=["month", "week", "day", "off"], default="month",
                   help="each owner's and each team lead's periodic report, by e-mail when a period ends "
                        "(default month; needs [smtp] in the routing file and ClickHouse)")
    p.add_argument("--teams", type=Path, default=os.environ.get("GPUFLEET_TEAMS"),
                   help="teams and their leads for the sponsors' reports (the file `gpufleet serve --teams` reads)")
    p.add_argument("--slurm-teams", action="store_true", help="teams and leads from Slurm's accounting too")
    clickhouse_args(p)
    rates_args(p, "the job reports")
    metrics_args(p)
    watchdog_args(p)
    p.set_defaults(func=cmd_notify)


def cmd_sink(args: argparse.Namespace) -> int:
    from kafka_client.admin import ensure_topics
    from sinks.clickhouse_client import connect
    from sinks.consume_to_clickhouse import METRICS, ClickHouseSink
    from sinks.write_clickhouse import ClickHouseWriter

    # What the user gave and what this machine has, before the broker: the DSN and its password,
    # the database's name, ClickHouse itself, the metrics port.
    dsn = clickhouse_dsn(args)
    ClickHouseWriter.check_database(args.database)
    writer = ClickHouseWriter(connect(dsn), args.database, cluster=args.clickhouse_cluster)
    serve_metrics(args, METRICS.registry)
    kafka = kafka_connection(args, "sink")
    ensure_topics(kafka, prefix=args.topic_prefix, partitions=args.partitions)
    sink = ClickHouseSink(kafka, writer, group_id=args.group_id, topic_prefix=args.topic_prefix,
                          sample_columns_in_sql=not args.samples_in_python, fence_s=fence_s(args))
    watch(args, sink.loop)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    queries = None
    if dsn.startswith("chdb://"):  # let gpufleet sql & co. read while this process owns the engine
        from gpufleet.asgi_server import AsgiServer
        from sinks.query_server import QueryServer

        queries = QueryServer(Path(dsn[len("chdb://"):]), port=args.query_port).start(AsgiServer)
    try:
        stats = sink.run(stop)
    finally:
        if queries is not None:
            queries.stop()
    print(f"sink stopped: {dict(stats.rows)} rows, {stats.dead_letters} dead letters")
    return 0


def fence_s(args: argparse.Namespace) -> float:
    """``--fence-s``, said to be short where a partition's previous reader may be held up for
    longer (``--stall-exit-s`` larger, or 0: never ended)."""
    if args.stall_exit_s == 0 or args.fence_s < args.stall_exit_s:
        logging.getLogger("gpufleet").warning(
            "--fence-s %g is shorter than a sink held up may live (--stall-exit-s %s): an insert of a partition's "
            "previous reader that lands later than that may be stored twice", args.fence_s,
            args.stall_exit_s or "0: never ended")
    return args.fence_s


def clickhouse_reader(args: argparse.Namespace, timeout_s: float = 300.0) -> Callable[[], object | None]:
    """The notifier's read-only ClickHouse, asked for at each use: on the embedded engine, the
    sink's query server (None while none runs: the notifier never holds the engine); on a server, a
    read-only session (``GPUFLEET_CLICKHOUSE_READER_DSN``, else the DSN given) opened at its first
    use, so that the alerts go out while ClickHouse cannot be reached."""
    dsn = reader_dsn(args)
    if dsn.startswith("chdb://"):
        from sinks.query_server import find_server

        path = Path(dsn[len("chdb://"):])
        return lambda: find_server(path, timeout_s)
    from sinks.read_path import connect_reader

    opened = []

    def client_of():
        if not opened:
            opened.append(connect_reader(dsn))
        return opened[0]
    return client_of


def periodic_reports(args: argparse.Namespace, routing, sent):
    """The periodic reports of ``--reports``, reading ClickHouse read-only (``clickhouse_reader``)."""
    from gpufleet.reports.periodic import PeriodicReports
    from gpufleet.web.access import Directory, DirectoryError

    try:
        directory = Directory.load(args.teams, slurm=args.slurm_teams)
    except DirectoryError as exc:
        raise UsageError(str(exc)) from None
    return PeriodicReports(clickhouse_reader(args), args.database, routing, directory.leads_of, sent,
                           period=args.reports)


def replica_counter(args: argparse.Namespace) -> Callable[[list[dict]], int | None]:
    """How many replicas the service of a digest's idle replicas held in their time
    (``sinks.serving_digest.replicas_held``), read with a short time limit: the digest waits on it."""
    from sinks.serving_digest import replicas_held

    reader = clickhouse_reader(args, timeout_s=10.0)

    def count(alerts: list[dict]) -> int | None:
        client = reader()
        return None if client is None else replicas_held(client, args.database, alerts)
    return count


def cmd_notify(args: argparse.Namespace) -> int:
    from kafka_client.admin import ensure_topics
    from sinks.consume_alerts import METRICS, AlertNotifier
    from sinks.route_alerts import load_routing

    prices, routing = rates(args), load_routing(args.routing)  # checked before anything is reached
    serve_metrics(args, METRICS.registry)
    kafka = kafka_connection(args, "notifier")
    ensure_topics(kafka, prefix=args.topic_prefix, partitions=args.partitions)
    notifier = AlertNotifier(kafka, routing, args.data_dir / "notifier-sent.log",
                             group_id=args.group_id, topic_prefix=args.topic_prefix, rates=prices,
                             replicas=replica_counter(args))
    watch(args, notifier.loop)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if args.reports != "off" and routing.smtp is not None:
        reports = periodic_reports(args, routing, notifier.sent)
        threading.Thread(target=reports.run, args=(stop,), name="periodic-reports", daemon=True).start()
    notifier.run(stop)
    print(f"notifier stopped: {notifier.messages} messages sent, {notifier.failures} refused")
    return 0

