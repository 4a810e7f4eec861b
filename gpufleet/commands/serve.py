"""``gpufleet serve``: the owners' service (``gpufleet.web``), each user's view of their jobs."""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import threading
from pathlib import Path

from gpufleet.commands.common import (
    clickhouse_args,
    kafka_args,
    kafka_connection,
    port,
    positive,
    query_client,
    rates,
    rates_args,
)
from gpufleet.errors import Failed, UsageError


def add(sub) -> None:
    p = sub.add_parser("serve", help="the owners' service: every user's jobs on the web (behind the site's "
                                     "login proxy) and for `gpufleet job` on login nodes (MUNGE)")
    p.add_argument("--host", default=os.environ.get("GPUFLEET_SERVE_HOST", "127.0.0.1"),
                   help="address to listen on (env GPUFLEET_SERVE_HOST; default loopback)")
    p.add_argument("--port", type=port, default=int(os.environ.get("GPUFLEET_SERVE_PORT", "8470")),
                   help="port (env GPUFLEET_SERVE_PORT; default 8470)")
    p.add_argument("--trusted-proxy", action="append", default=[], metavar="ADDRESS",
                   help="an address or network (CIDR) of the site's authenticating proxy, whose user header "
                        "is believed; repeat for several. Without one the service refuses to start, but "
                        "with --dev on loopback or --munge-only")
    p.add_argument("--user-header", default="X-Forwarded-User",
                   help="the header the proxy names the user in (default X-Forwarded-User; Open OnDemand "
                        "and Apache: X-Remote-User, oauth2-proxy: X-Forwarded-User or X-Auth-Request-User)")
    p.add_argument("--munge-socket", default=os.environ.get("GPUFLEET_MUNGE_SOCKET"),
                   help="munged's socket, to decode `gpufleet job`'s credentials (env GPUFLEET_MUNGE_SOCKET; "
                        "default: munged's own)")
    p.add_argument("--no-munge", action="store_true", help="take no MUNGE credentials (web users only)")
    p.add_argument("--munge-only", action="store_true",
                   help="serve only `gpufleet job` users (MUNGE); the web is refused to anyone")
    p.add_argument("--dev", action="store_true",
                   help="development mode (the demo's): loopback only, and a request that names no user is "
                        "the operator --dev-user")
    p.add_argument("--dev-user", default=os.environ.get("USER", "developer"))
    p.add_argument("--teams", type=Path, default=os.environ.get("GPUFLEET_TEAMS"),
                   help="TOML mapping of teams (members, leads) and operators (env GPUFLEET_TEAMS; "
                        "gpufleet.web.access says how)")
    p.add_argument("--slurm-teams", action="store_true",
                   help="teams from Slurm's accounting too: an account's users its members, its coordinators "
                        "its leads (sacctmgr)")
    p.add_argument("--operator", action="append", default=[], help="a user who sees the whole fleet (repeat)")
    p.add_argument("--operator-group", action="append", default=[],
                   help="a Unix group whose members see the whole fleet (repeat)")
    p.add_argument("--base-url", default=os.environ.get("GPUFLEET_BASE_URL"),
                   help="the address users reach the service at, through the proxy (env GPUFLEET_BASE_URL; "
                        "default: http://HOST:PORT): the links of messages and of `gpufleet job`")
    p.add_argument("--fresh-s", type=positive, default=30.0,
                   help="a page read longer ago is read again, in the background (default 30 s: windows close "
                        "once a minute)")
    p.add_argument("--no-actions", action="store_true",
                   help="take no actions (profile now, acknowledge, snooze, exemptions): no Kafka needed")
    kafka_args(p)
    clickhouse_args(p)
    rates_args(p, "the job pages")
    p.set_defaults(func=cmd_serve)


def check(args: argparse.Namespace) -> None:
    """Refuse what would let anyone be anyone: a header believed from everywhere."""
    loopback = args.host in ("localhost",) or _is_loopback(args.host)
    if args.dev and not loopback:
        raise UsageError(f"--dev serves loopback only, not --host {args.host}: it believes whoever asks")
    if not (args.trusted_proxy or args.dev or args.munge_only):
        raise UsageError("no --trusted-proxy: give the address of the site's authenticating proxy, whose "
                         f"{args.user_header} header names the user (docs/operating.md); --dev for a development "
                         "service on loopback; --munge-only for `gpufleet job` users alone")
    if args.munge_only and args.no_munge:
        raise UsageError("--munge-only and --no-munge leave no one to serve")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cmd_serve(args: argparse.Namespace) -> int:
    from gpufleet.asgi_server import AsgiServer
    from gpufleet.web.app import create_app

    check(args)
    service = build_service(args, None)  # every setting checked before the engine is opened
    if not args.no_actions:
        try:
            service.actions = actions_on(kafka_connection(args, "owners"), args.topic_prefix, args.partitions)
        except Failed as exc:
            if not args.dev:
                raise Failed(f"{exc} (the owners' actions go through Kafka; --no-actions serves the pages alone)") \
                    from None
            print(f"gpufleet serve: no actions ({exc}): the pages alone", flush=True)
    owned, service.client = embedded_queries(args)
    server = AsgiServer(create_app(service), args.host, args.port, name="owners")
    if not service.base_url:
        service.base_url = server.url
    server.start()
    print(f"gpufleet serve: the owners' service at {server.url}"
          + (" (development mode: loopback only)" if args.dev else ""), flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop()
    if owned is not None:
        owned.stop()
    return 0


def actions_on(kafka, prefix: str = "", partitions: int | None = None):
    """The owners' actions through ``kafka`` (``gpufleet.web.actions``), its topics made where missing."""
    from gpufleet.profile import hosts_of
    from gpufleet.web.actions import Actions
    from kafka_client.admin import ensure_topics
    from producers.publish_kafka import Publisher
    from schemas.codec import Codec

    ensure_topics(kafka, prefix=prefix, **({"partitions": partitions} if partitions else {}))
    return Actions(Publisher(kafka, Codec()), lambda workflow_id: hosts_of(kafka, workflow_id, prefix), prefix)


def embedded_queries(args: argparse.Namespace):
    """(the query server this command started, or None; the client to read with). On the embedded
    engine that no sink or demo holds, the service holds it and serves its read-only queries to
    the other commands (`gpufleet workflow`, `sql`) as the sink does; elsewhere it is a client."""
    from gpufleet.asgi_server import AsgiServer
    from gpufleet.commands.common import clickhouse_dsn
    from sinks.query_server import QueryServer, find_server

    dsn = os.environ.get("GPUFLEET_CLICKHOUSE_READER_DSN") or clickhouse_dsn(args)
    if not dsn.startswith("chdb://"):
        return None, query_client(args)
    path = Path(dsn[len("chdb://"):])
    if (running := find_server(path)) is not None:
        return None, running
    from clickhouse_connect.driver.exceptions import ClickHouseError

    try:
        owned = QueryServer(path).start(AsgiServer)
    except ClickHouseError as exc:  # the engine would not open: said as every command says it
        raise Failed(f"cannot open the embedded ClickHouse at {dsn}: {str(exc).splitlines()[0]}. It allows one "
                     "process per data directory: if a sink is running on it, start it first and this service "
                     "reads through it") from None
    return owned, find_server(path)


def build_service(args: argparse.Namespace, client):
    """The service of these arguments on ``client``; a bad mapping file is a usage mistake."""
    from gpufleet.web.access import Directory, DirectoryError
    from gpufleet.web.app import Service
    from gpufleet.web.identity import Munge, ProxyTrust

    try:
        directory = Directory.load(args.teams, tuple(args.operator), tuple(args.operator_group), args.slurm_teams)
        trust = ProxyTrust.parse([] if args.munge_only else args.trusted_proxy, args.user_header)
    except (DirectoryError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    return Service(client, args.database, directory, trust,
                   munge=None if args.no_munge else Munge(args.munge_socket),
                   dev_user=args.dev_user if args.dev else None, base_url=args.base_url or "", rates=rates(args),
                   fresh_s=args.fresh_s)
