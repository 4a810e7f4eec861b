"""A chaos soak of the whole pipeline: a 3-broker cluster, 2 workers, 2 sinks, the notifier with
a local webhook and the enforcer (dry run) under a steady planted load, for ``--minutes``, while
a seeded random schedule kills and restarts one component at a time (5-20 s down): brokers and
workers, the notifier and the enforcer with SIGKILL; the sinks, which share the embedded
ClickHouse and so run as threads of this process, die between an insert and its commit (the
worst moment for a sink; their thread never polls again and the group drops it).

At the end an oracle computed from what was published checks, and prints with its numbers:

1. every workflow's GPU-seconds in ``workflow_windows FINAL`` equal to what was published, one
   row per window (every window closed before the last minute);
2. every published sample stored exactly once in ``gpu_samples``;
3. each alert episode (an alert id FIRING) notified exactly once, each resolution once;
4. each enforcement step recorded once (one row per step in ClickHouse), and the enforcer's
   outcome once per action that fell due;
5. no dead letter (no fault may make good data look bad);
6. no component ended without being killed (a supervisor would hide it: the soak names it, and
   starts it again when the schedule next comes to it).

The load has known waste: one workflow holds its GPUs at 0 % throughout, one is idle for 20
simulated minutes out of every 40 (an alert episode, and a ladder episode, each time).

    python benchmarks/soak.py [--minutes 30] [--seed 1] [--fault-every-s 60]

Exit status 0 when every check holds. Not part of ``make test``: it runs for half an hour.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from http.server import ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer, TopicPartition
from soak_parts import ENDED_BY_ITSELF, PREFIX, Process, Sinks, Webhook

from gpufleet.demo import DEMO_POLICY
from gpufleet.local import kafka as local_kafka
from kafka_client.admin import ensure_topics
from kafka_client.config import consumer_config
from producers.publish_kafka import Publisher
from producers.simulate.fleet import HEALTHY, IDLE, build_fleet
from schemas.codec import Codec
from schemas.topics import ALERTS, DEAD_LETTERS, ENFORCEMENT, GPU_SAMPLES
from sinks.clickhouse_client import connect
from sinks.write_clickhouse import ClickHouseWriter

PARTITIONS = 6
TICKS_PER_S = 20  # simulated seconds per wall second
BASE_MS = 1_767_225_600_000
PHASE_TICKS = 20 * 60  # the intermittent workflow: idle for this many ticks, then busy as long
CODEC = Codec()










def planted_fleet():
    """Six workflows on 16 GPUs: one holds its GPUs at 0 %, one is idle every other 20 minutes."""
    fleet = build_fleet(seed=8, hosts=4, gpus_per_host=4, workflows=6)
    profiles = [IDLE, HEALTHY, HEALTHY, HEALTHY, HEALTHY, HEALTHY]
    return dataclasses.replace(fleet, workflows=tuple(
        dataclasses.replace(w, profile=p) for w, p in zip(fleet.workflows, profiles)))


def samples_at(fleet, tick: int) -> list[dict]:
    samples = list(fleet.samples_at(tick, BASE_MS, 1000))
    intermittent = fleet.workflows[1].workflow_id
    if (tick // PHASE_TICKS) % 2 == 1:
        for s in samples:
            if s["workflow_id"] == intermittent:
                s.update(utilization_pct=0.0, memory_utilization_pct=0.0, sm_clock_mhz=210)
    return samples


def committed_everything(bootstrap: str, group: str, topic: str) -> bool:
    c = Consumer(consumer_config(bootstrap, group))
    try:
        tps = [TopicPartition(topic, p) for p in c.list_topics(topic, timeout=10).topics[topic].partitions]
        for tp in c.committed(tps, timeout=10):
            high = c.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=10)[1]
            if high > 0 and tp.offset < high:
                return False
        return True
    finally:
        c.close()


def read_all(bootstrap: str, topic: str) -> list[tuple[str, dict]]:
    c = Consumer(consumer_config(bootstrap, "soak-oracle"))
    out = []
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        c.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end > 0])
        left = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + 120
        while left and time.monotonic() < deadline:
            for m in c.consume(num_messages=10_000, timeout=1):
                if m.error():
                    continue
                out.append(CODEC.decode(m.value()))
                if m.offset() + 1 >= ends[m.partition()]:
                    left.discard(m.partition())
    finally:
        c.close()
    return out


def sent_kinds(sent: Counter) -> str:
    kinds = Counter(status for _, status in sent.elements())
    return ", ".join(f"{n} {status}" for status, n in sorted(kinds.items())) or "nothing"


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    raise TimeoutError(f"{what}: not within {timeout:g} s")


def inject(kind: str, rng: random.Random, down: float, data: Path, sinks: Sinks, processes: dict) -> str:
    """Kill one component of ``kind`` (a random broker, sink or worker of ``processes[kind]``),
    wait ``down`` seconds and start it again; what was killed."""
    if kind == "broker":
        node = rng.randint(1, 3)
        local_kafka.kill_node(data / "kafka", node, signal.SIGKILL)
        time.sleep(down)
        local_kafka.start_node(data / "kafka", node, partitions=PARTITIONS, heap="384m")
        local_kafka.wait_for(data / "kafka", 180)
        return f"broker {node}"
    if kind == "sink":
        i = rng.randrange(len(sinks.running))
        sinks.kill(i)
        time.sleep(down)
        sinks.start()
        return f"sink {i + 1} (between an insert and its commit)"
    target = rng.choice(processes[kind]) if kind == "worker" else processes[kind][0]
    target.kill()
    time.sleep(down)
    target.start()
    return target.name


def none_ended(processes: list[Process]) -> bool:
    """Check 6: no component ended without being killed (printed with what each said)."""
    for p in processes:
        p.ended()
    ok = not ENDED_BY_ITSELF
    print(f"6. components that ended without being killed: {len(ENDED_BY_ITSELF)}: {'OK' if ok else 'VIOLATION'}"
          + "".join(f"\n   {what}" for what in ENDED_BY_ITSELF))
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fault-every-s", type=float, default=60.0, help="mean time between faults")
    parser.add_argument("--data-dir", type=Path, default=None, help="default: a temporary directory")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    data = args.data_dir or Path(tempfile.mkdtemp(prefix="gpufleet-soak-"))
    data.mkdir(parents=True, exist_ok=True)
    print(f"soak: seed {args.seed}, {args.minutes:g} minutes, a fault every ~{args.fault_every_s:g} s; data in {data}",
          flush=True)

    cluster = local_kafka.start(data / "kafka", brokers=3, heap="384m")
    bootstrap = cluster.bootstrap
    ensure_topics(bootstrap, prefix=PREFIX, partitions=PARTITIONS)
    client = connect(f"chdb://{data / 'clickhouse'}")
    database = "soak"
    ClickHouseWriter(client, database).ensure_tables()
    http = ThreadingHTTPServer(("127.0.0.1", 0), Webhook)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    (data / "routing.toml").write_text(f'[default]\nwebhook = "http://127.0.0.1:{http.server_address[1]}/"\n')
    (data / "enforcement.toml").write_text(DEMO_POLICY)  # (the demo's dry run)
    common = ["--bootstrap", bootstrap, "--topic-prefix", PREFIX]
    workers = [Process(f"worker-{n}", ["--data-dir", str(data / f"worker-{n}"), "--log-level", "info", "worker",
                                       *common, "--app-id", f"{PREFIX}worker", "--detector-min-s", "120",
                                       "--idle-partition-s", "5", "--enforcement", str(data / "enforcement.toml"),
                                       "--no-periodic-profiles"], data) for n in (1, 2)]
    notifier = Process("notifier", ["--data-dir", str(data / "notifier"), "notify", *common,
                                    "--routing", str(data / "routing.toml"), "--group-id", f"{PREFIX}notifier"], data)
    enforcer = Process("enforcer", ["enforce", *common, "--policy", str(data / "enforcement.toml"),
                                    "--group-id", f"{PREFIX}enforcer"], data)
    sinks = Sinks(bootstrap, client, database)
    processes = [*workers, notifier, enforcer]
    for p in processes:
        p.start()
    sinks.start()
    sinks.start()

    fleet = planted_fleet()
    published: list[tuple[str, int, float, str, str]] = []  # (workflow, event time, seconds, host, gpu)
    stop_publishing = threading.Event()

    def publish() -> None:
        pub = Publisher(bootstrap, CODEC)
        tick = 0
        while not stop_publishing.is_set():
            samples = samples_at(fleet, tick)
            pub.publish(GPU_SAMPLES, samples, topic=PREFIX + GPU_SAMPLES.name)
            published.extend((s["workflow_id"], s["event_time"], s["interval_ms"] / 1000, s["host"], s["gpu_uuid"])
                             for s in samples)
            tick += 1
            stop_publishing.wait(1 / TICKS_PER_S)
        if pub.flush(600):
            raise RuntimeError("samples the broker never acknowledged")

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()

    faults: list[tuple[float, str, float]] = []
    t0 = time.monotonic()
    end = t0 + args.minutes * 60
    kinds = ["broker", "worker", "sink", "notifier", "enforcer"]
    try:
        while True:
            wait = rng.uniform(0.5, 1.5) * args.fault_every_s
            if time.monotonic() + wait > end:
                break
            time.sleep(wait)
            kind = kinds[len(faults) % len(kinds)] if len(faults) < len(kinds) else rng.choice(kinds)
            down = rng.uniform(5, 20)
            at = time.monotonic() - t0
            what = inject(kind, rng, down, data, sinks, {"worker": workers, "notifier": [notifier],
                                                         "enforcer": [enforcer]})
            faults.append((at, what, down))
            print(f"[{at:7.1f} s] killed {what}, down {down:.1f} s; {len(published):,} samples published", flush=True)
    finally:
        stop_publishing.set()
        publisher.join(600)

    print(f"load stopped after {time.monotonic() - t0:.0f} s: {len(published):,} samples; {len(faults)} faults "
          f"({', '.join(f'{k} {n}' for k, n in Counter(w.split()[0].split('-')[0] for _, w, _ in faults).items())})",
          flush=True)
    violations = 0
    try:
        wait_until(lambda: committed_everything(bootstrap, f"{PREFIX}worker", PREFIX + GPU_SAMPLES.name), 600,
                   "the workers to commit every sample")
        last = max(t for _, t, *_ in published)
        closed_before = (last - 10_000) // 60_000 * 60_000
        windows_per_workflow = (closed_before - BASE_MS) // 60_000
        expected = defaultdict(float)
        for wf, t, seconds, *_ in published:
            if t < closed_before:
                expected[wf] += seconds

        def windows():
            rows = client.query(f"SELECT workflow_id, sum(gpu_seconds), count() FROM {database}.workflow_windows FINAL "
                                f"WHERE window_start < fromUnixTimestamp64Milli({closed_before}) GROUP BY workflow_id"
                                ).result_rows
            return {wf: (round(s, 6), n) for wf, s, n in rows}

        want = {wf: (round(s, 6), windows_per_workflow) for wf, s in expected.items()}
        try:
            wait_until(lambda: windows() == want, 600, "every closed window in ClickHouse")
        except TimeoutError:
            pass
        got = windows()
        ok = got == want
        violations += not ok
        print(f"1. windows: {sum(n for _, n in got.values())} rows for {len(got)} workflows x {windows_per_workflow} "
              f"closed windows; GPU-seconds {sum(s for s, _ in got.values()):,.1f} of "
              f"{sum(s for s, _ in want.values()):,.1f} published: {'OK' if ok else 'VIOLATION'}"
              + ("" if ok else f" {[(wf, got.get(wf), w) for wf, w in want.items() if got.get(wf) != w]}"))

        def stored():
            return client.query(f"SELECT count(), uniqExact(workflow_id, host, gpu_uuid, event_time) "
                                f"FROM {database}.gpu_samples").result_rows[0]

        try:
            wait_until(lambda: stored()[0] >= len(published), 600, "every sample in gpu_samples")
        except TimeoutError:
            pass
        rows, unique = stored()
        ok = rows == unique == len(published)
        violations += not ok
        print(f"2. samples: {rows:,} rows, {unique:,} distinct, {len(published):,} published: "
              f"{'OK' if ok else 'VIOLATION'}")

        wait_until(lambda: committed_everything(bootstrap, f"{PREFIX}notifier", PREFIX + ALERTS.name), 300,
                   "the notifier to read every alert")
        alerts = [r for name, r in read_all(bootstrap, PREFIX + ALERTS.name) if name == ALERTS.schema]
        firing = {a["alert_id"] for a in alerts if a["status"] == "FIRING" and a["notify"]}
        resolved = {a["alert_id"] for a in alerts if a["status"] == "RESOLVED"} & firing
        sent = Counter((a["alert_id"], a["status"]) for a in Webhook.received)
        twice = {k: n for k, n in sent.items() if n > 1}
        missing = {a for a in firing if (a, "FIRING") not in sent} | {
            a for a in resolved if (a, "RESOLVED") not in sent
        }
        ok = not twice and not missing and bool(firing)
        violations += not ok
        print(f"3. alerts: {len(firing)} episodes fired, {len(resolved)} resolved; notified {sent_kinds(sent)}; "
              f"twice: {twice or 'none'}; never: {sorted(missing) or 'none'}: {'OK' if ok else 'VIOLATION'}")

        wait_until(lambda: committed_everything(bootstrap, f"{PREFIX}enforcer", PREFIX + ENFORCEMENT.name), 300,
                   "the enforcer to read every step")
        steps = [r for name, r in read_all(bootstrap, PREFIX + ENFORCEMENT.name) if name == ENFORCEMENT.schema]
        outcomes = Counter(r["alert_id"] for r in steps if r["step"] in ("WOULD_ACT", "ACTED", "ACTION_FAILED"))
        due = {r["alert_id"] for r in steps if r["step"] == "ACTION_DUE"}
        (rows_, events), = client.query(f"SELECT count(), uniqExact(event_id) FROM {database}.enforcement FINAL"
                                        ).result_rows
        ok = rows_ == events and set(outcomes) == due and all(n == 1 for n in outcomes.values()) and bool(due)
        violations += not ok
        print(f"4. enforcement: {len(due)} actions due, outcomes {dict(Counter(outcomes.values()))} (per action), "
              f"{rows_} rows for {events} distinct steps in ClickHouse: {'OK' if ok else 'VIOLATION'}")

        letters = read_all(bootstrap, PREFIX + DEAD_LETTERS.name)
        ok = not letters
        violations += not ok
        print(f"5. dead letters: {len(letters)}: {'OK' if ok else 'VIOLATION'}"
              + ("" if ok else f" {[r.get('reason') for _, r in letters[:5]]}"))
        violations += not none_ended(processes)
    finally:
        for p in processes:
            p.stop()
        sinks.stop()
        http.shutdown()
        local_kafka.stop(data / "kafka")
    print(f"soak: seed {args.seed}, {len(faults)} faults in {args.minutes:g} minutes, "
          f"{violations} violation(s)")
    for at, what, down in faults:
        print(f"  {at:7.1f} s  {what}, down {down:.1f} s")
    return 1 if violations else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
