"""The ``gpufleet`` command: one entry point for the broker, the pipeline's stages, the demo and SQL."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

DEFAULT_DATA_DIR = Path(os.environ.get("GPUFLEET_DATA_DIR", "data"))


def _bootstrap_arg(p: argparse.ArgumentParser) -> None:
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


def _clickhouse_args(p: argparse.ArgumentParser) -> None:
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


def _kafka(args: argparse.Namespace, principal: str, check: bool = True):
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


def _dsn(args: argparse.Namespace) -> str:
    from sinks.write_clickhouse import default_dsn

    return args.clickhouse_dsn or default_dsn(args.data_dir)


def cmd_kafka(args: argparse.Namespace) -> int:
    from gpufleet import local_kafka

    kafka_dir = args.data_dir / "kafka"
    if args.action == "start":
        try:
            info = local_kafka.start(kafka_dir, brokers=args.brokers, port=args.port, secure=args.secure)
        except local_kafka.KafkaRunnerError as exc:
            sys.exit(str(exc))
        print(f"Kafka is running: bootstrap {info.bootstrap}" + (" (SASL_SSL, mutual TLS, ACLs)" if info.secure else ""))
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
    from gpufleet.kafka_security import LocalCredentials, create_users, grant

    credentials = LocalCredentials(args.dir)
    if args.action == "credentials":
        if credentials.exists():
            print(f"{args.dir} holds credentials already; nothing made")
            return 0
        nodes = [n for n in args.nodes.split(",") if n]
        if not nodes:
            sys.exit("name the nodes with --nodes (the host names clients reach them by)")
        extra = tuple(h for h in (args.external_host, "localhost") if h)
        credentials.create({i: (name, *extra) for i, name in enumerate(nodes, 1)}, mount=args.mount)
        print(f"made a CA, {len(nodes)} node certificate(s) and a folder per principal under {args.dir / 'clients'}")
        return 0
    if not credentials.exists():
        sys.exit(f"no credentials in {args.dir}: make them with `gpufleet kafka-access credentials`")
    admin = _kafka(args, "admin")
    create_users(admin, credentials.passwords())
    n = grant(admin, args.topic_prefix, worker_app_id=args.app_id)
    print(f"users of {', '.join(credentials.passwords())} set; {n} ACLs granted")
    return 0


def cmd_topics(args: argparse.Namespace) -> int:
    from kafka_client.admin import ensure_topics

    created = ensure_topics(_kafka(args, "admin"), prefix=args.topic_prefix, partitions=args.partitions)
    print("created: " + (", ".join(created) if created else "nothing (all exist)"))
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    import faust

    from kafka_client.admin import brokers_in, create_topics, ensure_topics, replication_for
    from streams.app import StreamSettings, changelog_topics, create_app, tune_gc
    from streams.detect_waste import DetectorConfig
    from streams.raise_alerts import AlertConfig, load_detector_config
    from streams.schedule_profiles import ScheduleConfig
    from streams.window_utilization import WindowConfig

    kafka = _kafka(args, "worker")
    ensure_topics(kafka, prefix=args.topic_prefix, partitions=args.partitions)
    partitions, trace_partitions = _stream_partitions(kafka, args.topic_prefix)
    if args.thresholds:
        detectors, team_detectors = load_detector_config(args.thresholds)
    else:
        detectors = DetectorConfig(low_util_warn_pct=args.low_utilization_pct,
                                   low_util_critical_pct=min(args.low_utilization_pct, args.critical_utilization_pct))
        team_detectors = {}
    settings = StreamSettings(
        bootstrap=kafka.bootstrap,
        security=kafka.security,
        app_id=args.app_id,
        topic_prefix=args.topic_prefix,
        data_dir=str(args.data_dir / "worker"),
        window=WindowConfig(size_ms=int(args.window_s * 1000), allowed_lateness_ms=int(args.lateness_s * 1000),
                            max_future_skew_ms=int(args.max_future_skew_s * 1000),
                            update_horizon_ms=int(args.update_horizon_s * 1000),
                            retention_ms=max(3_600_000, int(args.update_horizon_s * 1000))),
        workflow_ended_s=args.workflow_ended_s,
        idle_partition_s=args.idle_partition_s,
        partitions=partitions,
        trace_partitions=trace_partitions,
        replication=replication_for(brokers_in(kafka))[0],
        alerts=AlertConfig(detectors=detectors, team_detectors=team_detectors, min_duration_s=args.detector_min_s),
        schedule=ScheduleConfig(enabled=args.periodic_profiles, interval_s=args.profile_every_s,
                                budget_fraction=args.profile_budget, report_s=args.schedule_report_s,
                                seed=args.schedule_seed),
    )
    create_topics(kafka, changelog_topics(settings))
    app = create_app(settings)
    tune_gc()
    worker = faust.Worker(app, loglevel=args.log_level, quiet=True)
    # Faust's terminal spinner sets the root logger to DEBUG so that every record spins it:
    # then aiokafka and Faust build a debug record per message sent (two per changelog write),
    # whatever --log-level says. Without it the level holds.
    worker.spinner = None
    worker.execute_from_commandline()
    return 0


def _stream_partitions(kafka, prefix: str) -> tuple[int, int]:
    """The partitions the worker's input topics have on the cluster: the co-partitioned
    sample topics' (which must agree: a workflow's samples, life cycle and profile results
    meet in one state) and the kernel events'."""
    from kafka_client.admin import partitions_of
    from schemas.topics import CO_PARTITIONED, KERNEL_EVENTS

    names = [prefix + t.name for t in (*CO_PARTITIONED, KERNEL_EVENTS)]
    counts = partitions_of(kafka, names)
    co = {prefix + t.name: counts.get(prefix + t.name) for t in CO_PARTITIONED}
    if len(set(co.values())) != 1 or None in co.values():
        sys.exit("the worker needs " + ", ".join(co) + " to have the same number of partitions; they have "
                 + ", ".join(f"{n}: {c}" for n, c in co.items()) + ". Recreate them with one --partitions")
    return next(iter(co.values())), counts[prefix + KERNEL_EVENTS.name]


def cmd_sink(args: argparse.Namespace) -> int:
    from kafka_client.admin import ensure_topics
    from sinks.consume_to_clickhouse import ClickHouseSink
    from sinks.write_clickhouse import ClickHouseWriter, connect

    kafka = _kafka(args, "sink")
    ensure_topics(kafka, prefix=args.topic_prefix, partitions=args.partitions)
    dsn = _dsn(args)
    writer = ClickHouseWriter(connect(dsn), args.database, cluster=args.clickhouse_cluster)
    sink = ClickHouseSink(kafka, writer, group_id=args.group_id, topic_prefix=args.topic_prefix)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    queries = None
    if dsn.startswith("chdb://"):  # let gpufleet sql & co. read while this process owns the engine
        from gpufleet.query_server import QueryServer

        queries = QueryServer(Path(dsn[len("chdb://"):])).start()
    try:
        stats = sink.run(stop)
    finally:
        if queries is not None:
            queries.stop()
    print(f"sink stopped: {dict(stats.rows)} rows, {stats.dead_letters} dead letters")
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    import time

    from kafka_client.admin import ensure_topics
    from producers.publish_kafka import Publisher
    from producers.run_simulation import SimulationPlan, run_simulation
    from producers.simulate_fleet import build_fleet
    from schemas.codec import Codec
    from schemas.topics import GPU_SAMPLES

    kafka = _kafka(args, "agent")
    ensure_topics(kafka, prefix=args.topic_prefix, partitions=args.partitions)
    fleet = build_fleet(args.seed, args.hosts, args.gpus_per_host, args.workflows)
    start_ms = args.start_ms if args.start_ms is not None else (int(time.time()) // 60 * 60 - int(args.duration_s)) * 1000
    plan = SimulationPlan(start_ms, int(args.duration_s / args.interval_s), int(args.interval_s * 1000), args.speed)
    progress = run_simulation(fleet, plan, Publisher(kafka, Codec()), topic=args.topic_prefix + GPU_SAMPLES.name)
    print(f"published {progress.samples} samples over {progress.ticks_done} ticks from {fleet.gpu_count} GPUs")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from gpufleet.demo import DemoOptions, run_demo

    return run_demo(DemoOptions(
        data_dir=args.data_dir, seed=args.seed, hosts=args.hosts, gpus_per_host=args.gpus_per_host,
        workflows=args.workflows, sim_minutes=args.sim_minutes, speed=args.speed,
        max_wall_s=args.max_wall_s, keep_kafka=args.keep_kafka, secure=args.secure,
    ))


def cmd_sql(args: argparse.Namespace) -> int:
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from gpufleet.sql import FORMATS, run_query
    from sinks.write_clickhouse import refusal

    client = _client(args, read_only=not args.write)

    try:
        columns, rows = run_query(client, args.query)
    except ClickHouseError as exc:
        sys.exit(f"query failed: {refusal(exc)}")
    print(FORMATS[args.format](columns, rows))
    return 0


def cmd_clickhouse_users(args: argparse.Namespace) -> int:
    from sinks.clickhouse_access import access_statements, password_sha256

    hashes = []
    for role in ("READER", "WRITER"):
        name = f"GPUFLEET_CLICKHOUSE_{role}_PASSWORD"
        password = Path(os.environ[name + "_FILE"]).read_text().strip() if os.environ.get(name + "_FILE") \
            else os.environ.get(name)
        if not password:
            sys.exit(f"set {name} (or {name}_FILE) to the {role.lower()}'s password")
        hashes.append(password_sha256(password))
    try:
        print(";\n".join(access_statements(args.database, *hashes)) + ";")
    except ValueError as exc:
        sys.exit(str(exc))
    return 0


def cmd_notify(args: argparse.Namespace) -> int:
    from kafka_client.admin import ensure_topics
    from sinks.consume_alerts import AlertNotifier
    from sinks.route_alerts import load_routing

    kafka = _kafka(args, "notifier")
    ensure_topics(kafka, prefix=args.topic_prefix, partitions=args.partitions)
    notifier = AlertNotifier(kafka, load_routing(args.routing), args.data_dir / "notifier-sent.log",
                             group_id=args.group_id, topic_prefix=args.topic_prefix)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    notifier.run(stop)
    print(f"notifier stopped: {notifier.messages} messages sent, {notifier.failures} refused")
    return 0


def cmd_agent(args: argparse.Namespace) -> int:
    import socket

    from kafka_client.admin import ensure_topics
    from producers.attribute_process import AttributionKeys, ProcessAttributor
    from producers.forward_spool import Forwarder
    from producers.host_agent import AgentSettings, HostAgent, SimulatedGpus, run_agent
    from producers.profile_agent import ProfileCoordinator, ProfileListener
    from producers.profile_handoff import HandoffError, default_dir
    from producers.publish_kafka import Publisher
    from producers.sample_nvml import NvmlSampler, NvmlUnavailable
    from producers.simulate_fleet import build_fleet
    from producers.spool import Spool
    from schemas.codec import Codec

    kafka = _kafka(args, "agent", check=False)
    host = args.host or socket.gethostname()
    settings = AgentSettings(host=host, interval_s=args.interval, heartbeat_s=args.heartbeat_s,
                             topic_prefix=args.topic_prefix, cluster=args.cluster,
                             profile_interval_s=args.profile_interval)
    nvml = simulated = None
    if args.source == "nvml":
        nvml = NvmlSampler()
        try:
            devices = nvml.open()
        except NvmlUnavailable as exc:
            sys.exit(str(exc))
        print(f"sampling {len(devices)} GPU device(s) through NVML every {args.interval:g}s as host {host}")
    else:
        fleet = build_fleet(args.seed, args.hosts, args.gpus_per_host, args.workflows)
        host = args.host or "gpu-host-000"
        settings = AgentSettings(host=host, interval_s=args.interval, heartbeat_s=args.heartbeat_s,
                                 topic_prefix=args.topic_prefix, cluster=args.cluster,
                                 profile_interval_s=args.profile_interval)
        simulated = SimulatedGpus(fleet, host, int(time.time() * 1000))
        print(f"simulating host {host} of a {args.hosts}-host fleet every {args.interval:g}s")
    try:
        ensure_topics(kafka, prefix=args.topic_prefix, partitions=args.partitions)
    except Exception as exc:  # noqa: BLE001 - the agent must start (and spool) while the broker is away
        print(f"could not check the topics ({exc}); spooling until the broker answers")
    keys = AttributionKeys(
        workflow=tuple(args.workflow_keys.split(",")), owner=tuple(args.owner_keys.split(",")),
        team=tuple(args.team_keys.split(",")), model=tuple(args.model_keys.split(",")),
    )
    spool = Spool(args.spool_dir or args.data_dir / "agent-spool", max_bytes=args.spool_max_mb << 20)
    agent = HostAgent(settings, spool, Codec(), nvml=nvml, simulated=simulated, attributor=ProcessAttributor(keys))
    stop = threading.Event()
    # Profile requests for this host's workflows, answered beside the sampling loop.
    try:
        coordinator = ProfileCoordinator(host, Publisher(kafka, Codec()), args.profile_dir or default_dir(),
                                         topic_prefix=args.topic_prefix)
    except HandoffError as exc:
        sys.exit(str(exc))
    for sig in (signal.SIGINT, signal.SIGTERM):  # stop now, not after the wait for the next tick
        signal.signal(sig, lambda *_: (stop.set(), coordinator.started.set()))
    agent.observers.append(coordinator.observe)  # the host's view while a profile is captured
    listener = ProfileListener(kafka, coordinator, topic_prefix=args.topic_prefix)
    profiles = threading.Thread(target=listener.run, args=(stop,), name="profiles", daemon=True)
    profiles.start()
    try:
        run_agent(agent, Forwarder(spool, kafka, send_every_s=args.send_every), stop, profiling=coordinator.capturing,
                  wake=coordinator.started)
    finally:
        stop.set()
        profiles.join(10)
        if nvml is not None:
            nvml.close()
    print(f"agent stopped after {agent.ticks} ticks, {agent.samples} GPU samples; "
          f"{spool.dropped} dropped by a full spool")
    return 0


def cmd_nvml_check(args: argparse.Namespace) -> int:
    from gpufleet.nvml_check import main as check

    return check([f"--seconds={args.seconds}"] + (["--no-load"] if args.no_load else []))


def cmd_ingest_trace(args: argparse.Namespace) -> int:
    from kafka_client.admin import ensure_topics
    from producers.publish_kafka import Publisher
    from producers.publish_trace import publish_trace
    from schemas.codec import Codec

    kafka = _kafka(args, "agent")
    ensure_topics(kafka, prefix=args.topic_prefix, partitions=args.partitions)
    publisher = Publisher(kafka, Codec())
    rc = 0
    for path in args.traces:
        end = publish_trace(path, args.workflow, publisher, topic_prefix=args.topic_prefix)
        state = f"PARTIAL ({end['error']})" if end["partial"] else "complete"
        print(f"{path}: published {end['events']} events as trace {end['trace_id']} (rank {end['rank']}), {state}")
        rc = rc or (1 if end["partial"] else 0)
    if publisher.flush():
        sys.exit("some trace events could not be delivered to Kafka")
    return rc


def cmd_analyze(args: argparse.Namespace) -> int:
    from gpufleet.analyze import run

    text, rc = run(args.traces, args.json, args.workflow)
    print(text)
    return rc


def _client(args: argparse.Namespace, read_only: bool = True):
    """A client on the configured ClickHouse, with a plain message when the embedded one is busy."""
    from sinks.write_clickhouse import connect, redact_dsn, scrub

    dsn = (read_only and os.environ.get("GPUFLEET_CLICKHOUSE_READER_DSN")) or _dsn(args)
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


def cmd_opportunities(args: argparse.Namespace) -> int:
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from gpufleet.opportunities import opportunities
    from gpufleet.sql import FORMATS
    from sinks.write_clickhouse import refusal

    try:
        columns, rows = opportunities(_client(args), args.database, args.by, args.since, args.limit)
    except ValueError as exc:
        sys.exit(str(exc))
    except ClickHouseError as exc:
        sys.exit(f"query failed: {refusal(exc)}")
    if not rows and args.format == "table":
        print(f"no wasted GPU-hours recorded (--since {args.since})")
        return 0
    print(FORMATS[args.format](columns, rows))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from gpufleet.report import gather, render

    try:
        numbers = gather(_client(args), args.database, args.since)
    except ValueError as exc:
        sys.exit(str(exc))
    args.html.write_text(render(numbers))
    print(f"wrote {args.html} ({numbers['gpu_hours']:,.1f} GPU-hours, {numbers['workflows']} workflows)")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from gpufleet.opportunities import parse_since
    from gpufleet.profile import hosts_of, profile
    from kafka_client.admin import ensure_topics

    kafka = _kafka(args, "operator")
    ensure_topics(kafka, prefix=args.topic_prefix, partitions=args.partitions)
    hosts = args.host or hosts_of(kafka, args.workflow_id, args.topic_prefix)
    if not hosts:
        sys.exit(f"workflow {args.workflow_id} is not running on any host (no agent reported it without "
                 "ending it); name hosts with --host to ask anyway")
    duration_ms = None if args.duration is None else int(parse_since(args.duration) * 1000)
    steps = None if duration_ms is not None else args.steps
    what = f"{duration_ms / 1000:g} s" if duration_ms is not None else f"{steps} steps"
    print(f"profiling {args.workflow_id} for {what} on {', '.join(hosts)} (timeout {args.timeout:g} s)", flush=True)

    def show(status: dict) -> None:
        where = status["host"] + ("" if status["rank"] is None else f" rank {status['rank']}")
        detail = status["reason"] or status["trace_id"] or ""
        print(f"  {where}: {status['state'].lower().replace('_', ' ')}{' - ' + detail if detail else ''}", flush=True)

    outcome = profile(kafka, args.workflow_id, hosts, steps=steps, duration_ms=duration_ms,
                      timeout_s=args.timeout, prefix=args.topic_prefix, requester=os.environ.get("USER", "cli"),
                      on_status=show)
    for a in sorted(outcome.analyses, key=lambda a: a["trace_id"]):
        partial = " (partial trace)" if a["partial"] else ""
        if a["idle_pct"] is None:  # e.g. a CPU-only process
            print(f"\n{a['trace_id']}: GPU idle n/a: no GPU activity in {a['events']} events{partial}")
        else:
            print(f"\n{a['trace_id']}: GPU idle {a['idle_pct']:.1f}%, compute {a['compute_pct']:.1f}%, "
                  f"non-compute {a['non_compute_pct']:.1f}% of {a['kernel_time_us'] / 1e6:.3f} s of kernel "
                  f"time{partial}")
        if a.get("system"):
            print(f"  {_system_line(a['system'])}")
    if outcome.findings:
        print("\nFindings:")
        for f in sorted(outcome.findings, key=lambda f: -f["gpu_seconds_at_stake"]):
            print(f"  [{f['severity'].lower()}] {f['title']} ({f['gpu_seconds_at_stake']:.3f} GPU-s at stake)\n"
                  f"      {f['evidence']}\n      try: {f['recommendation']}")
    elif outcome.analyses:
        print("\nNo antipattern found in these traces.")
    if outcome.failed:
        print("\nFailed:")
        for where, reason in sorted(outcome.failed.items()):
            print(f"  {where}: {reason}")
        return 1
    return 0


def _system_line(system: dict) -> str:
    """What the host agent measured during a capture, in one line."""
    said = [(f"{system['ticks']} host samples over {system['span_ms'] / 1000:.1f} s "
             f"(one every {system['interval_ms_mean']:.0f} ms)")]
    for key, text in (("gpu_utilization_mean_pct", "GPU utilisation {:.0f} %"),
                      ("sm_active_mean_pct", "SM activity {:.0f} %"), ("power_mean_watts", "power {:.0f} W"),
                      ("workflow_cpu_mean_pct", "job CPU {:.0f} % of a core"), ("host_cpu_mean_pct", "host CPU {:.0f} %"),
                      ("host_iowait_mean_pct", "I/O wait {:.0f} %")):
        if system.get(key) is not None:
            said.append(text.format(system[key]))
    return "during the capture: " + ", ".join(said)


def cmd_workflows(args: argparse.Namespace) -> int:
    from gpufleet.sql import format_table
    from gpufleet.workflows import list_workflows

    print(format_table(*list_workflows(_client(args), args.database, args.since_minutes)))
    return 0


def cmd_workflow(args: argparse.Namespace) -> int:
    from gpufleet.sql import format_table
    from gpufleet.workflows import workflow_timeline

    columns, rows = workflow_timeline(_client(args), args.database, args.workflow_id)
    if not rows:
        print(f"no windows for workflow {args.workflow_id!r}")
        return 1
    print(format_table(columns, rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpufleet", description=__doc__)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                        help="where the local broker, worker state and embedded ClickHouse live "
                             "(env GPUFLEET_DATA_DIR; default ./data)")
    parser.add_argument("--log-level", default="warning")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("kafka", help="start, stop or check the local Kafka broker or cluster")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--brokers", type=int, default=1,
                   help="nodes of the local cluster (KRaft, each broker and controller); 3 replicates "
                        "every topic three times, a write acknowledged by two")
    p.add_argument("--secure", action="store_true",
                   help="a cluster that speaks only SASL_SSL (SCRAM-SHA-512 and a client certificate), "
                        "with a user and ACLs per component; its CA, certificates and passwords are made "
                        "under the data dir the first time")
    p.add_argument("--port", type=int, default=None, help="first node's listener port (default: a free one)")
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
    p.add_argument("--app-id", default="gpufleet-worker", help="grant: the worker's app id (its group and changelogs)")
    _bootstrap_arg(p)
    p.set_defaults(func=cmd_kafka_access)

    p = sub.add_parser("topics", help="create gpufleet's topics (idempotent)")
    _bootstrap_arg(p)
    p.set_defaults(func=cmd_topics)

    p = sub.add_parser("worker", help="run the stream worker (event-time windows and detectors)")
    _bootstrap_arg(p)
    p.add_argument("--app-id", default="gpufleet-worker", help="Faust app id = consumer group")
    p.add_argument("--window-s", type=float, default=60.0)
    p.add_argument("--lateness-s", type=float, default=10.0, help="allowed lateness of samples")
    p.add_argument("--update-horizon-s", type=float, default=3600.0,
                   help="a sample later than the watermark by up to this much completes its closed window, "
                        "which is emitted again with a higher version; later ones are dead-lettered")
    p.add_argument("--max-future-skew-s", type=float, default=300.0,
                   help="a sample this far ahead of the worker's clock is dead-lettered (a wrong host clock)")
    p.add_argument("--low-utilization-pct", type=float, default=25.0,
                   help="mean utilisation under this, sustained, raises a warning")
    p.add_argument("--critical-utilization-pct", type=float, default=15.0,
                   help="mean utilisation under this, sustained, raises a critical alert")
    p.add_argument("--workflow-ended-s", type=float, default=600.0,
                   help="a workflow with no sample for this long (event time) has ended: summarise it")
    p.add_argument("--idle-partition-s", type=float, default=60.0,
                   help="a partition with no sample for this long (wall time) follows the busiest one's clock")
    p.add_argument("--thresholds", type=Path, default=None,
                   help="TOML file of detector thresholds: [default] and [teams.<name>] (DetectorConfig fields)")
    p.add_argument("--detector-min-s", type=float, default=None,
                   help="how long every violation must last before its alert fires (default: each detector's own, "
                        "e.g. 10 minutes for low utilisation)")
    p.add_argument("--no-periodic-profiles", dest="periodic_profiles", action="store_false",
                   help="do not profile running workflows periodically")
    p.add_argument("--profile-every-s", type=float, default=6 * 3600.0,
                   help="profile each running workflow at most once per this many seconds (default 6 h)")
    p.add_argument("--profile-budget", type=float, default=0.02,
                   help="at most this fraction of the running workflows profiled at once (default 2 %%, at least 1)")
    p.add_argument("--schedule-report-s", type=float, default=30.0,
                   help="how often the window stage tells the scheduler what runs")
    p.add_argument("--schedule-seed", type=int, default=0, help="ties in the schedule are broken by this seed")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("sink", help="write gpufleet's topics into ClickHouse")
    _bootstrap_arg(p)
    _clickhouse_args(p)
    p.add_argument("--group-id", default="gpufleet-clickhouse-sink")
    p.set_defaults(func=cmd_sink)

    p = sub.add_parser("simulate", help="publish samples from a simulated fleet")
    _bootstrap_arg(p)
    _fleet_args(p)
    p.add_argument("--duration-s", type=float, default=600.0, help="simulated seconds")
    p.add_argument("--interval-s", type=float, default=1.0, help="simulated sampling interval")
    p.add_argument("--speed", type=float, default=60.0, help="simulated seconds per wall second (0: no pacing)")
    p.add_argument("--start-ms", type=int, default=None, help="event time of the first tick (default: now - duration)")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("demo", help="run the whole pipeline on a simulated fleet and summarise it")
    _fleet_args(p)
    p.add_argument("--sim-minutes", type=float, default=30.0, help="simulated minutes of fleet activity")
    p.add_argument("--speed", type=float, default=30.0, help="simulated seconds per wall second")
    p.add_argument("--max-wall-s", type=float, default=180.0, help="stop after this many wall seconds at most")
    p.add_argument("--keep-kafka", action="store_true", help="leave the broker running afterwards")
    p.add_argument("--secure", action="store_true",
                   help="run it on a secure local cluster (as `gpufleet kafka start --secure`): SASL_SSL, mutual "
                        "TLS and ACLs, the agent, worker and sink each as its own user")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("analyze", help="analyse PyTorch profiler (Kineto) trace files")
    p.add_argument("traces", nargs="+", help=".json or .json.gz trace files, one per rank")
    p.add_argument("--json", action="store_true", help="print the TraceAnalysis records as JSON")
    p.add_argument("--workflow", default="", help="workflow id to put in the records")
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser("notify", help="message owners and teams about alerts (webhook, e-mail)")
    _bootstrap_arg(p)
    p.add_argument("--routing", type=Path, required=True, help="routing file (TOML): see sinks/route_alerts.py")
    p.add_argument("--group-id", default="gpufleet-notifier")
    p.set_defaults(func=cmd_notify)

    p = sub.add_parser("agent", help="the host agent: sample GPUs (NVML or simulated) and publish to Kafka")
    _bootstrap_arg(p)
    p.add_argument("--source", choices=["nvml", "sim"], default="nvml")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    p.add_argument("--send-every", type=float, default=5.0,
                   help="seconds between sends to Kafka, each workflow's samples since the last send in one "
                        "message (default 5; 0 sends each tick at once). Keep it under the worker's --lateness-s")
    p.add_argument("--profile-interval", type=float, default=0.1,
                   help="seconds between samples while a profile is captured on this host (default 10 Hz)")
    p.add_argument("--host", default=None, help="host name to report (default: this machine's)")
    p.add_argument("--heartbeat-s", type=float, default=60.0, help="seconds between workflow heartbeats")
    p.add_argument("--workflow-keys", default="GPUFLEET_WORKFLOW_ID,SLURM_JOB_ID,TORCHELASTIC_RUN_ID",
                   help="environment variables naming a process's workflow, first found wins")
    p.add_argument("--owner-keys", default="GPUFLEET_OWNER,SLURM_JOB_USER,USER")
    p.add_argument("--team-keys", default="GPUFLEET_TEAM,SLURM_JOB_ACCOUNT")
    p.add_argument("--model-keys", default="GPUFLEET_MODEL", help="environment variables naming the job's model")
    p.add_argument("--cluster", default=os.environ.get("GPUFLEET_CLUSTER"),
                   help="the cluster this host belongs to, on every workflow event (env GPUFLEET_CLUSTER)")
    p.add_argument("--spool-dir", type=Path, default=None, help="default: <data dir>/agent-spool")
    p.add_argument("--spool-max-mb", type=int, default=256)
    p.add_argument("--profile-dir", type=Path, default=None,
                   help="where training processes with gpufleet's profiling hook meet the agent "
                        "(env GPUFLEET_PROFILE_DIR; default /tmp/gpufleet-profile)")
    _fleet_args(p)
    p.set_defaults(func=cmd_agent)

    p = sub.add_parser("nvml-check", help="check the real NVML path on a machine with NVIDIA GPUs")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--no-load", action="store_true", help="do not start the PyTorch load")
    p.set_defaults(func=cmd_nvml_check)

    p = sub.add_parser("ingest-trace", help="publish trace files to Kafka for the worker to analyse")
    _bootstrap_arg(p)
    p.add_argument("traces", nargs="+", help=".json or .json.gz trace files, one per rank")
    p.add_argument("--workflow", required=True, help="the workflow the traces belong to")
    p.set_defaults(func=cmd_ingest_trace)

    p = sub.add_parser("workflows", help="workflows with their utilisation, waste and firing alerts")
    _clickhouse_args(p)
    p.add_argument("--since-minutes", type=float, default=1440, help="how far back from the newest window")
    p.set_defaults(func=cmd_workflows)

    p = sub.add_parser("workflow", help="one workflow's timeline of windows and alerts")
    p.add_argument("workflow_id")
    _clickhouse_args(p)
    p.set_defaults(func=cmd_workflow)

    p = sub.add_parser("opportunities", help="rank where the fleet loses the most GPU-hours, and to what")
    _clickhouse_args(p)
    p.add_argument("--by", default="cause",
                   choices=["cause", "team", "owner", "workflow", "framework", "model", "cluster", "gpu-model",
                            "antipattern"])
    p.add_argument("--since", default="7d", help="how far back: 7d, 12h, 30m, or all")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.set_defaults(func=cmd_opportunities)

    p = sub.add_parser("profile", help="profile a running workflow now (torch.profiler via the agents) "
                                       "and print the findings")
    _bootstrap_arg(p)
    p.add_argument("workflow_id")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--steps", type=int, default=20, help="optimizer steps to capture (default 20)")
    group.add_argument("--duration", default=None, help="or a duration: 10s, 1m")
    p.add_argument("--host", action="append", default=[], help="ask this host (repeatable; default: every host "
                                                                 "the agents report the workflow on)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for every host's result")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("report", help="write the fleet report: one self-contained HTML file with charts")
    _clickhouse_args(p)
    p.add_argument("--html", type=Path, required=True, help="where to write it")
    p.add_argument("--since", default="7d", help="how far back: 7d, 12h, 30m, or all")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("sql", help="run a SQL query on gpufleet's ClickHouse (read-only by default)")
    p.add_argument("query")
    _clickhouse_args(p)
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.add_argument("--write", action="store_true", help="allow statements that change data")
    p.set_defaults(func=cmd_sql)

    p = sub.add_parser("clickhouse-users",
                       help="print the SQL that creates a server's gpufleet users: a writer for the sink and a "
                            "read-only reader for queries (passwords from GPUFLEET_CLICKHOUSE_READER_PASSWORD and "
                            "GPUFLEET_CLICKHOUSE_WRITER_PASSWORD, or their _FILE; only their hashes are printed)")
    p.add_argument("--database", default=os.environ.get("GPUFLEET_DATABASE", "gpufleet"))
    p.set_defaults(func=cmd_clickhouse_users)
    return parser


def _fleet_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--hosts", type=int, default=16)
    p.add_argument("--gpus-per-host", type=int, default=8)
    p.add_argument("--workflows", type=int, default=24)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
