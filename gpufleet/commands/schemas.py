"""``gpufleet schemas``: the wire contract for subscribers (a Confluent-compatible registry)."""

from __future__ import annotations

import argparse
import os
import signal
import threading

from gpufleet.commands.common import port


def add(sub) -> None:
    p = sub.add_parser("schemas", help="gpufleet's Avro schemas for other services")
    actions = p.add_subparsers(dest="schemas_command", required=True)
    s = actions.add_parser("serve", help="serve the schemas as a read-only Confluent Schema Registry, for "
                                         "subscribers with a standard Avro deserializer")
    s.add_argument("--host", default=os.environ.get("GPUFLEET_SCHEMAS_HOST", "127.0.0.1"),
                   help="address to listen on (env GPUFLEET_SCHEMAS_HOST; default loopback)")
    s.add_argument("--port", type=port, default=int(os.environ.get("GPUFLEET_SCHEMAS_PORT", "8081")),
                   help="port (env GPUFLEET_SCHEMAS_PORT; default 8081, the registry's usual port)")
    s.add_argument("--topic-prefix", default=os.environ.get("GPUFLEET_TOPIC_PREFIX", ""),
                   help="the deployment's topic prefix, which the subjects <topic>-value carry "
                        "(env GPUFLEET_TOPIC_PREFIX)")
    s.set_defaults(func=cmd_schemas)


def cmd_schemas(args: argparse.Namespace) -> int:
    from gpufleet.schema_server import RegistryServer
    from schemas.registry import SchemaRegistry

    registry = SchemaRegistry(args.topic_prefix)
    server = RegistryServer(registry, args.host, args.port).start()
    print(f"schema registry (read-only) at {server.url}: {len(registry.by_id)} schemas, "
          f"{len(registry.subjects)} subjects", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop()
    return 0
