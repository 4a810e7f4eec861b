"""``gpufleet demo``: the whole pipeline on one machine, on a simulated fleet, with live progress.

local Kafka (started here) <- simulator thread; worker subprocess (Faust); sink thread ->
embedded ClickHouse under the data directory; an enforcer thread runs the demo's enforcement
ladder as a dry run. Bounded in wall time; ends with a per-workflow summary read back from
ClickHouse, the goodput waterfall and the GPU-hours the ladder would have freed, each against
what the simulator planted.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, TopicPartition

from gpufleet.asgi_server import AsgiServer
from gpufleet.demo_serving import DEMO_THRESHOLDS, serving_against_planted
from gpufleet.local import kafka as local_kafka
from gpufleet.reports.goodput import fleet_goodput
from gpufleet.reports.opportunities import opportunities
from gpufleet.sql import format_table, run_query
from gpufleet.web.app import job_url
from kafka_client.admin import ensure_topics
from kafka_client.config import WORKER_APP_ID, consumer_config
from producers.publish_kafka import Publisher
from producers.simulate.fleet import IDLE, UNTOUCHED, build_fleet
from producers.simulate.run import SimulationPlan, SimulationProgress, run_simulation
from producers.simulate.serving import ServingPlan, serving_samples_at, with_serving
from schemas.codec import Codec
from schemas.topics import ALERTS, DEAD_LETTERS, ENFORCEMENT, GPU_SAMPLES, WORKFLOW_WINDOWS
from schemas.validate_sample import NOT_WORKFLOWS
from schemas.vocabulary import ALLOCATED, JOBS, WASTED
from sinks.clickhouse_client import connect, default_dsn
from sinks.clickhouse_ddl import TABLES
from sinks.consume_to_clickhouse import ClickHouseSink
from sinks.enforce_jobs import Enforcer
from sinks.job_report import BUCKETS, LABELS, Rates, render_waterfall
from sinks.query_server import QueryServer, find_server
from sinks.write_clickhouse import ClickHouseWriter
from streams.enforcement.ladder import Ladder, load_ladders

log = logging.getLogger(__name__)

WORKER_GROUP = WORKER_APP_ID
SINK_GROUP = "gpufleet-clickhouse-sink"
ENFORCER_GROUP = "gpufleet-enforcer"
DATABASE = "gpufleet"
# Start-up in the demo: a workflow whose GPUs did no work is starting up for its first 3 simulated
# minutes, then idle (15 minutes by default: a demo of half an hour would show no idle job's alert).
DEMO_STARTUP_S = 180.0
# The demo's ladder: warn after 5 and 10 simulated minutes of GPUs held at 0 % (after start-up:
# no alert judges start-up), act at 15; a dry run, so what it would run is recorded, nothing is.
DEMO_POLICY = """
[[ladder]]
name = "idle-gpus"
detector = "idle_allocated"
first_warning_min = 5
second_warning_min = 10
action_min = 15
command = ["release-gpus", "{workflow_id}"]
act = false
"""


@dataclass(frozen=True)
class DemoOptions:
    data_dir: Path
    seed: int = 7
    hosts: int = 16
    gpus_per_host: int = 8
    workflows: int = 24
    sim_minutes: float = 30.0
    speed: float = 30.0
    max_wall_s: float = 180.0
    keep_kafka: bool = False
    secure: bool = False  # a SASL_SSL cluster with ACLs, each component as its own user
    kafka_port: int | None = None  # the broker's client port (None: a free one)
    query_port: int = 0  # the query server's (0: a free one)
    serve_port: int = 0  # the owners' service's, on loopback (0: a free one)


class OffsetWatch:
    """Reads end offsets and a group's committed offsets, to show progress and lag."""

    def __init__(self, bootstrap) -> None:
        self._consumers: dict[str, Consumer] = {}
        self._bootstrap = bootstrap

    def _consumer(self, group: str) -> Consumer:
        if group not in self._consumers:
            self._consumers[group] = Consumer(consumer_config(self._bootstrap, group))
        return self._consumers[group]

    def end_offsets(self, spec) -> list[int]:
        c = self._consumer("gpufleet-demo-watch")
        return [c.get_watermark_offsets(TopicPartition(spec.name, p), timeout=5)[1] for p in range(spec.partitions)]

    def total(self, spec) -> int:
        return sum(self.end_offsets(spec))

    def lag(self, group: str, specs) -> int:
        c = self._consumer(group)
        lag = 0
        for spec in specs:
            ends = self.end_offsets(spec)
            committed = c.committed([TopicPartition(spec.name, p) for p in range(spec.partitions)], timeout=5)
            lag += sum(end - max(tp.offset, 0) for end, tp in zip(ends, committed))
        return lag

    def close(self) -> None:
        for c in self._consumers.values():
            c.close()


def _line(text: str) -> None:
    if sys.stdout.isatty():
        sys.stdout.write("\r\x1b[2K" + text)
    else:
        sys.stdout.write(text + "\n")
    sys.stdout.flush()


SUMMARY_SQL = f"""
SELECT w.workflow_id AS workflow, any(w.owner) AS owner, any(w.team) AS team,
       max(w.gpu_count) AS gpus, count() AS windows,
       round(sum(w.utilization_mean_pct * (w.gpu_seconds - w.unobserved_gpu_seconds))
             / sum(w.gpu_seconds - w.unobserved_gpu_seconds), 1) AS util_pct,
       round({ALLOCATED.sql} / 3600, 2) AS gpu_hours,
       round({WASTED.sql} / 3600, 2) AS wasted_gpu_hours,
       anyIf(a.alerts, a.alerts > 0) AS alerts
FROM {DATABASE}.workflow_windows AS w FINAL
LEFT JOIN (SELECT workflow_id, count() AS alerts FROM {DATABASE}.alerts FINAL GROUP BY workflow_id) AS a
       ON a.workflow_id = w.workflow_id
WHERE w.{JOBS}
GROUP BY w.workflow_id
ORDER BY wasted_gpu_hours DESC, workflow
"""

EXAMPLE_SQL = ("SELECT workflow_id, owner, detector, severity, status, round(wasted_gpu_hours_so_far, 2) AS wasted_h "
               "FROM gpufleet.alerts FINAL ORDER BY wasted_h DESC")


RATES_EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "rates.example.toml"  # (named whole: from any directory)


def _self_command(data_dir: Path) -> str:
    """How the user can call gpufleet again: the way they called it, with the same data dir."""
    exe = sys.argv[0]
    cmd = (
        shlex.quote(os.path.abspath(exe)) if exe.endswith("gpufleet") else f"{shlex.quote(sys.executable)} -m gpufleet"
    )
    return cmd + f" --data-dir {shlex.quote(str(data_dir.resolve()))}"  # from any directory


def goodput_against_planted(client, fleet, start_ms: int) -> str:
    """The fleet's goodput waterfall as the pipeline measured it, and beside it what the
    simulator planted in the same ticks (those of the windows that closed)."""
    closed_to = client.query(f"SELECT toUnixTimestamp64Milli(max(window_end)) FROM {DATABASE}.workflow_windows"
                             ).result_rows[0][0]
    ticks = max(0, (closed_to - start_ms) // 1000)
    measured, _ = fleet_goodput(client, DATABASE, "fleet", "all")
    truth = fleet.planted(ticks, start_ms, 1000, DEMO_STARTUP_S)
    planted = {b: sum(w.get(b, (0.0, 0.0))[0] for w in truth.values()) for b in BUCKETS}
    allocated = sum(planted.values()) or 1.0
    lines = [render_waterfall(measured, Rates(), "Measured:"), "",
             f"Against what the simulator planted in the same {ticks / 60:g} minutes:",
             f"{'bucket':<32}  {'measured GPU-h':>14}  {'planted GPU-h':>13}  {'difference':>10}"]
    worst = 0.0
    for b in BUCKETS:
        got = measured.buckets[b].gpu_seconds
        diff = abs(got - planted[b]) / allocated * 100
        worst = max(worst, diff)
        lines.append(f"{LABELS[b]:<32}  {got / 3600:>14.3f}  {planted[b] / 3600:>13.3f}  {diff:>9.2f}%")
    lines.append(f"largest difference: {worst:.2f}% of the allocated GPU-hours (goal: within 0.5%)")
    free = fleet.unallocated(ticks, 1000)
    lines.append(f"{'unallocated (no job held them)':<32}  {measured.unallocated.gpu_seconds / 3600:>14.3f}  "
                 f"{free / 3600:>13.3f}  {abs(measured.unallocated.gpu_seconds - free) / allocated * 100:>9.2f}%")
    return "\n".join(lines)


def untouched_against_planted(client, fleet, ticks: int) -> str:
    """The GPU-hours jobs held on GPUs no process of theirs opened, as the agents' samples say
    (stored in ClickHouse), beside what the simulator planted; and the alerts of those jobs."""
    pseudo = ", ".join(f"'{name}'" for name in sorted(NOT_WORKFLOWS))
    (measured,), = client.query(f"SELECT sum(interval_ms / 1000 * ifNull(share, 1)) FROM {DATABASE}.gpu_samples "
                                f"WHERE process_count = 0 AND workflow_id NOT IN ({pseudo})").result_rows
    planted = fleet.untouched(ticks, 1000)
    holders = [w.workflow_id for w in fleet.workflows if w.profile is UNTOUCHED or w.untouched_gpus]
    lines = [(f"GPU-hours held on GPUs no process opened: measured {(measured or 0.0) / 3600:.3f}, "
              f"planted {planted / 3600:.3f} (in the {ticks / 60:g} simulated minutes published)")]
    alerts = client.query(f"""
        SELECT workflow_id, detector, argMin(message, window_end) FROM {DATABASE}.alerts FINAL
        WHERE status = 'FIRING' AND has({{holders:Array(String)}}, workflow_id)
          AND detector IN ('idle_allocated', 'partial_use')
        GROUP BY workflow_id, detector ORDER BY workflow_id, detector""", parameters={"holders": holders}).result_rows
    lines += [f"{wf} ({detector}): {message}" for wf, detector, message in alerts]
    return "\n".join(lines)


def enforcement_against_planted(client, fleet, start_ms: int, ladder: Ladder) -> str:
    """What the ladder did, the GPU-hours its actions would have freed (what the workflows it
    acted on held in the closed windows from the action on), and beside them the time the
    simulator planted idle after the action point (each idle job, at 0 % from its first tick, is
    idle from the end of start-up on, when the ladder's clock starts)."""
    closed_to = client.query(f"SELECT toUnixTimestamp64Milli(max(window_end)) FROM {DATABASE}.workflow_windows"
                             ).result_rows[0][0]
    steps = client.query(f"SELECT step, count() FROM {DATABASE}.enforcement FINAL GROUP BY step ORDER BY step"
                         ).result_rows
    acted = client.query(f"""
        SELECT e.workflow_id, e.gpus, toUnixTimestamp64Milli(e.due_at),
               (SELECT sum(gpu_seconds) FROM {DATABASE}.workflow_windows FINAL
                WHERE workflow_id = e.workflow_id AND window_start >= e.due_at) AS freed
        FROM {DATABASE}.enforcement AS e FINAL WHERE e.step IN ('ACTED', 'WOULD_ACT') ORDER BY e.workflow_id
        """).result_rows
    action_ms = round((DEMO_STARTUP_S + ladder.action_min * 60) * 1000)  # the ladder's clock starts after start-up
    planted = sum(len(w.gpus) * max(0, closed_to - (start_ms + action_ms)) / 1000
                  for w in fleet.workflows if w.profile in (IDLE, UNTOUCHED) and not w.service)
    freed = sum(seconds or 0.0 for *_, seconds in acted)
    lines = [(f"ladder {ladder.name!r}: warnings after {ladder.first_warning_min:g} and {ladder.second_warning_min:g} "
             f"simulated minutes of {ladder.detector.replace('_', ' ')}, the action at {ladder.action_min:g}"),
             "steps: " + (", ".join(f"{step} {n}" for step, n in steps) or "none")]
    lines += [f"would have released {wf} ({gpus} GPUs) {(due - start_ms) / 60_000:g} min into the run"
              for wf, gpus, due, _ in acted]
    lines.append(f"GPU-hours it would have freed: {freed / 3600:.3f} (in the closed windows); "
                 f"planted idle after the action point: {planted / 3600:.3f}")
    return "\n".join(lines)


def run_demo(opts: DemoOptions) -> int:
    data_dir = opts.data_dir.resolve()
    for sub in ("kafka", "worker", "clickhouse"):
        shutil.rmtree(data_dir / sub, ignore_errors=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    print(f"gpufleet demo: data under {data_dir} (cleared at the start of each demo)")
    print("starting Kafka ...", flush=True)
    broker = local_kafka.start(data_dir / "kafka", port=opts.kafka_port, secure=opts.secure,
                               port_option="--kafka-port")
    print(f"  broker on {broker.bootstrap} (log {broker.log_file})"
          + (": SASL_SSL with mutual TLS and ACLs, each component as its own user" if broker.secure else ""))
    worker = None
    sink_thread = enforcer_thread = None
    queries = owners = None
    stop = threading.Event()
    try:
        ensure_topics(broker.connection("admin"))
        worker_log = data_dir / "worker.log"
        policy = data_dir / "enforcement.toml"
        policy.write_text(DEMO_POLICY)
        (data_dir / "thresholds.toml").write_text(DEMO_THRESHOLDS)
        ladders = load_ladders(policy)
        # Without --bootstrap the worker finds the local cluster, as its own user where it is secure.
        worker = subprocess.Popen(
            [sys.executable, "-m", "gpufleet", "--data-dir", str(data_dir), "--log-level", "info",
             "worker", "--app-id", WORKER_GROUP, "--enforcement", str(policy), "--startup-max-s", str(DEMO_STARTUP_S),
             "--thresholds", str(data_dir / "thresholds.toml")],
            stdout=worker_log.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        print(f"  worker pid {worker.pid} (log {worker_log})")
        dsn = default_dsn(data_dir)
        writer = ClickHouseWriter(connect(dsn), DATABASE)
        sink = ClickHouseSink(broker.connection("sink"), writer, group_id=SINK_GROUP)
        sink_thread = threading.Thread(target=sink.run, args=(stop,), name="sink", daemon=True)
        sink_thread.start()
        enforcer = Enforcer(broker.connection("enforcer"), ladders, act=False, group_id=ENFORCER_GROUP)
        enforcer_thread = threading.Thread(target=enforcer.run, args=(stop,), name="enforcer", daemon=True)
        enforcer_thread.start()
        queries = QueryServer(Path(dsn[len("chdb://"):]), port=opts.query_port).start(AsgiServer)
        print(f"  sink writing to {dsn} (while it runs, `gpufleet sql` queries go through it)")
        owners = start_owners_service(data_dir, opts.serve_port, broker.connection("owners"))

        # With what goodput accounting must find planted, so that the summary can compare.
        # As agents that read the scheduler's allocations report it: free GPUs, GPUs held and never opened.
        # And a serving deployment beside it, holding more replicas than its traffic needs.
        fleet = with_serving(build_fleet(opts.seed, opts.hosts, opts.gpus_per_host, opts.workflows, planted=True,
                                         scheduler=True))
        ticks = int(opts.sim_minutes * 60)
        start_ms = (int(time.time()) // 60 * 60 - ticks) * 1000
        plan = SimulationPlan(start_ms, ticks, 1000, opts.speed)
        progress = SimulationProgress()
        sim_thread = threading.Thread(
            target=run_simulation, name="simulator",
            kwargs={"fleet": fleet, "plan": plan, "publisher": Publisher(broker.connection("agent"), Codec()),
                    "stop": stop, "progress": progress,
                    "serving": lambda tick: serving_samples_at(fleet, tick, ticks, start_ms, 1000)},
            daemon=True,
        )
        print(f"simulating {len(fleet.workflows)} workflows on {fleet.gpu_count} GPUs "
              f"({opts.hosts} hosts), {opts.sim_minutes:g} simulated minutes at {opts.speed:g}x")
        idle = next((w.workflow_id for w in fleet.workflows if w.profile is UNTOUCHED), None)
        print(f"  the job that never opened its GPUs, on the owners' service: {job_url(owners.url, idle)}\n"
              if idle else "")
        sim_thread.start()
        watch = OffsetWatch(broker.connection("admin"))
        last_samples, last_t = 0, time.monotonic()
        caught_up_since = None
        while True:
            time.sleep(1.0)
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited with code {worker.returncode}; log {worker_log}:\n"
                                   f"{local_kafka.tail(worker_log)}")
            now = time.monotonic()
            rate = (progress.samples - last_samples) / (now - last_t)
            last_samples, last_t = progress.samples, now
            try:
                worker_lag = watch.lag(WORKER_GROUP, [GPU_SAMPLES])
                sink_lag = watch.lag(SINK_GROUP, list(dict.fromkeys(t.topic for t in TABLES)))
                sink_lag += watch.lag(ENFORCER_GROUP, [ENFORCEMENT])  # its outcomes go to the sink in turn
                counts = [watch.total(spec) for spec in (WORKFLOW_WINDOWS, ALERTS, DEAD_LETTERS)]
            except KafkaException as exc:
                # A broker that is still electing leaders or loading its coordinator answers
                # with retriable errors; the progress line waits for the next second.
                log.debug("offsets not readable yet: %s", exc)
                worker_lag = sink_lag = None
            if worker_lag is not None:
                _line(f"[{now - t0:5.0f}s] sim {progress.ticks_done / 60:5.1f}/{opts.sim_minutes:g} min | "
                      f"samples {progress.samples:>8} ({rate:6.0f}/s) | windows {counts[0]:>5} | "
                      f"alerts {counts[1]:>4} | dead letters {counts[2]:>3} | "
                      f"lag worker {worker_lag:>6} sink {sink_lag:>6} | rows {sum(sink.stats.rows.values()):>8}")
            done = not sim_thread.is_alive() and worker_lag == 0 and sink_lag == 0
            caught_up_since = (caught_up_since or now) if done else None
            if caught_up_since and now - caught_up_since >= 2.0:
                break
            if now - t0 > opts.max_wall_s:
                print(f"\nstopping: the {opts.max_wall_s:g}s wall-time limit was reached before the pipeline caught up")
                break
        watch.close()
    finally:
        stop.set()
        if worker is not None and worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
        for thread in (sink_thread, enforcer_thread):
            if thread is not None:
                thread.join(60)
        if owners is not None:
            owners.stop()
        if queries is not None:
            queries.stop()
        if not opts.keep_kafka:
            local_kafka.stop(data_dir / "kafka")
    print("\n\nPer-workflow summary (from ClickHouse, closed windows only):\n")
    columns, rows = run_query(writer.client, SUMMARY_SQL)
    print(format_table(columns, rows))
    counts = {t: run_query(writer.client, f"SELECT count() FROM {DATABASE}.{t}")[1][0][0]
              for t in ("gpu_samples", "workflow_windows", "capacity_windows", "alerts", "dead_letters")}
    print("\nrows stored: " + ", ".join(f"{t} {n}" for t, n in counts.items()))
    print("\nWhere the fleet lost GPU-hours (gpufleet opportunities):\n")
    print(format_table(*opportunities(writer.client, DATABASE, "cause", "all", limit=10)))
    print("\nWhere the allocated GPU-hours went (gpufleet goodput):\n")
    print(goodput_against_planted(writer.client, fleet, start_ms))
    print("\nGPUs the scheduler gave and no process opened (an agent with --allocations sees them):\n")
    print(untouched_against_planted(writer.client, fleet, progress.ticks_done))
    print("\nThe serving deployment, judged by its traffic (gpufleet serving):\n")
    print(serving_against_planted(writer.client, DATABASE, fleet, ticks, progress.ticks_done, start_ms, ServingPlan()))
    print("\nThe enforcement ladder (gpufleet enforce, a dry run):\n")
    print(enforcement_against_planted(writer.client, fleet, start_ms, ladders[0]))
    print(f"\nData: ClickHouse {dsn} (database {DATABASE}); Kafka log dirs {data_dir / 'kafka'}"
          f"{' (broker still running)' if opts.keep_kafka else ''}.")
    print(f"Try:\n  {_self_command(data_dir)} sql \"{EXAMPLE_SQL}\"\n"
          f"  {_self_command(data_dir)} opportunities --by team --since all\n"
          f"  {_self_command(data_dir)} goodput --by team --since all --rates {shlex.quote(str(RATES_EXAMPLE))}\n"
          f"  {_self_command(data_dir)} serving --since all\n"
          f"  {_self_command(data_dir)} report --since all --html fleet-report.html\n"
          f"  {_self_command(data_dir)} serve --dev   # then open http://127.0.0.1:8470/jobs/{idle or ''}")
    return 0


def start_owners_service(data_dir: Path, port: int, kafka):
    """The owners' service (``gpufleet serve --dev``) on loopback, reading through the demo's query
    server and taking actions through its broker."""
    import getpass

    from gpufleet.commands.serve import actions_on
    from gpufleet.web.app import Service, create_app

    client = find_server(Path(default_dsn(data_dir)[len("chdb://"):]))
    service = Service(client, DATABASE, dev_user=getpass.getuser(), actions=actions_on(kafka))
    server = AsgiServer(create_app(service), "127.0.0.1", port, name="owners").start()
    service.base_url = server.url
    print(f"  the owners' service at {server.url} (development mode: loopback only, you are its operator)")
    return server
