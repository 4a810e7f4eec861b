"""The fleet's shape on a real broker or cluster: workers side by side, and the time faults cost.

In one run, so that the ratios mean something on a noisy machine (issue 15):

1. Throughput of 2 workers in one group against 1 worker on the same pre-published messages
   (10,000 simulated GPUs, as the agents send them), with the CPU each worker process used.
   On a 2-core machine the broker and both workers share two cores: report, don't expect 2x.
2. A worker killed with SIGKILL under a live load (``--live-gpus`` at 1 Hz, real time, two
   workers): seconds from the kill until the group's lag is back at what it was before.
3. A broker of a 3-node cluster killed with SIGKILL: seconds from the kill until a producer
   has records acknowledged again, and until a consumer reads again.
4. The per-workflow state: bytes a second written to the changelogs at 10,000 GPUs, per
   workflow, and how long a new worker takes to restore a partition's state from them.

    python benchmarks/bench_fleet.py [--ticks 120] [--live-gpus 2000] [--skip cluster]
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from statistics import median

import psutil
from confluent_kafka import Consumer, Producer, TopicPartition

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from fleet_load import AgentSends, Lag, fleet_10k, produce, rate_from_commits, stop, worker

from gpufleet.local import kafka as local_kafka
from gpufleet.local.kafka_node_config import SESSION_TIMEOUT_MS
from kafka_client.admin import ensure_topics
from kafka_client.config import consumer_config, producer_config
from schemas.topics import GPU_SAMPLES

START_MS = 1_767_225_600_000
PARTITIONS = 8


def cpu_s(proc) -> float:
    try:
        t = psutil.Process(proc.pid).cpu_times()
        return t.user + t.system
    except psutil.NoSuchProcess:
        return float("nan")


def publish_ticks(bootstrap: str, topic: str, ticks: int) -> tuple[int, float]:
    producer = Producer(producer_config(bootstrap, **{"linger.ms": 50}))
    agents = AgentSends(fleet_10k(), START_MS, 5, "columns")
    total = sum(produce(producer, topic, agents.tick(t)) for t in range(ticks)) + produce(
        producer, topic, agents.rest()
    )
    producer.flush(60)
    return total, 10_000 * ticks / total


def side_by_side(bootstrap: str, data_dir: Path, ticks: int) -> None:
    prefix = "side."
    ensure_topics(bootstrap, prefix=prefix, partitions=PARTITIONS)
    topic = prefix + GPU_SAMPLES.name
    total, per_message = publish_ticks(bootstrap, topic, ticks)
    print(f"1. throughput: {10_000 * ticks:,} samples of 10,000 GPUs in {total:,} messages on {PARTITIONS} partitions")
    rates = {}
    for n in (1, 2):
        app = f"side-{n}"
        procs = [worker(bootstrap, prefix, data_dir, app, "--idle-partition-s", "3600") for _ in range(n)]
        try:
            rate = rate_from_commits(bootstrap, app, topic, PARTITIONS, total, procs[0]) * per_message
            cpu = [cpu_s(p) for p in procs]
        finally:
            for p in procs:
                stop(p)
        rates[n] = rate
        print(f"   {n} worker{'s' if n > 1 else ' '}  {rate:>10,.0f} samples/s   CPU used: "
              + ", ".join(f"{c:.1f} s" for c in cpu))
    print(f"   2 workers / 1 worker: {rates[2] / rates[1]:.2f} (2 cores, shared with the broker and this script)")


def lag_of(lag: Lag) -> int:
    committed, end = lag()
    return end - committed


def killed_worker(bootstrap: str, data_dir: Path, gpus: int) -> None:
    prefix = "kill."
    ensure_topics(bootstrap, prefix=prefix, partitions=PARTITIONS)
    topic = prefix + GPU_SAMPLES.name
    hosts = max(1, gpus // 8)
    from producers.simulate.fleet import build_fleet

    agents = AgentSends(build_fleet(seed=5, hosts=hosts, gpus_per_host=8, workflows=max(1, hosts // 2)),
                        int(time.time() * 1000) // 1000 * 1000 - 60_000, 1, "columns")
    producer = Producer(producer_config(bootstrap))
    stop_load = threading.Event()

    def load():
        t = 0
        start = time.monotonic()
        while not stop_load.is_set():
            produce(producer, topic, agents.tick(t))
            producer.poll(0)
            t += 1
            time.sleep(max(0.0, start + t - time.monotonic()))
        producer.flush(30)

    app = "kill-app"
    procs = [worker(bootstrap, prefix, data_dir, app, "--idle-partition-s", "3600") for _ in range(2)]
    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    lag = Lag(bootstrap, app, topic, PARTITIONS)
    try:
        time.sleep(40)  # both in the group, keeping up
        before = []
        for _ in range(10):
            time.sleep(0.5)
            before.append(lag_of(lag))
        normal = max(2 * median(before), 10)
        killed = time.monotonic()
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait()
        worst, back = 0, None
        while time.monotonic() - killed < 180:
            now_lag = lag_of(lag)
            worst = max(worst, now_lag)
            if time.monotonic() - killed > 5 and now_lag <= normal:
                back = time.monotonic() - killed
                break
            time.sleep(0.5)
        print(
            f"2. a worker killed with SIGKILL, {hosts * 8:,} GPUs at 1 Hz, two workers: "
            f"lag before {median(before):.0f} "
            f"messages, at worst {worst}; back under {normal:.0f} after "
            + (f"{back:.1f} s" if back else "more than 180 s")
            + " (the group notices after the session timeout, 10 s, then restores the partitions)"
        )
    finally:
        stop_load.set()
        thread.join(60)
        lag.close()
        for p in procs:
            stop(p)


def killed_broker(data_dir: Path) -> None:
    cluster = local_kafka.start(data_dir / "cluster", brokers=3, heap="384m")
    try:
        ensure_topics(cluster.bootstrap, [GPU_SAMPLES], prefix="broker.", partitions=PARTITIONS)
        topic = "broker." + GPU_SAMPLES.name
        producer = Producer(producer_config(cluster.bootstrap, **{"linger.ms": 5}))
        acked: list[float] = []
        read: list[float] = []
        stop_all = threading.Event()

        def produce_loop():
            i = 0
            while not stop_all.is_set():
                producer.produce(topic, key=str(i % 64).encode(), value=b"x" * 100,
                                 on_delivery=lambda err, _m: acked.append(time.monotonic()) if err is None else None)
                producer.poll(0.01)
                i += 1
            producer.flush(60)

        def consume_loop():
            c = Consumer(consumer_config(cluster.bootstrap, "broker-reader", **{"auto.offset.reset": "latest"}))
            c.subscribe([topic])
            while not stop_all.is_set():
                for m in c.consume(100, timeout=0.2):
                    if not m.error():
                        read.append(time.monotonic())
            c.close()

        threads = [threading.Thread(target=f, daemon=True) for f in (produce_loop, consume_loop)]
        for t in threads:
            t.start()
        time.sleep(15)
        from confluent_kafka.admin import AdminClient

        leaders = [p.leader for p in AdminClient({"bootstrap.servers": cluster.bootstrap})
                   .list_topics(timeout=10).topics[topic].partitions.values()]
        victim = max(set(leaders), key=leaders.count)
        killed = time.monotonic()
        local_kafka.kill_node(cluster.data_dir, victim)
        time.sleep(40)
        stop_all.set()
        for t in threads:
            t.join(90)

        def resumed(times):
            # After the kill: the first gap in the stream of events, and when it ended.
            after = [t for t in times if t > killed]
            gaps = [(b - a, b) for a, b in zip([killed, *after], after)]
            longest = max(gaps, default=(float("nan"), float("nan")))
            return longest[1] - killed

        print(f"3. the broker leading most partitions of 3 killed with SIGKILL: producers acknowledged again "
              f"{resumed(acked):.1f} s after, a consumer read again {resumed(read):.1f} s after "
              f"(the controller declares a node dead after {SESSION_TIMEOUT_MS / 1000:g} s)")
    finally:
        local_kafka.stop(data_dir / "cluster")


def changelog_and_restore(bootstrap: str, data_dir: Path, ticks: int) -> None:
    prefix = "state."
    ensure_topics(bootstrap, prefix=prefix, partitions=PARTITIONS)
    topic = prefix + GPU_SAMPLES.name
    total, _ = publish_ticks(bootstrap, topic, ticks)
    app = "state-app"
    proc = worker(bootstrap, prefix, data_dir, app, "--idle-partition-s", "3600")
    try:
        rate_from_commits(bootstrap, app, topic, PARTITIONS, total, proc, measure_s=1e9)
    finally:
        stop(proc)
    c = Consumer(consumer_config(bootstrap, "state-reader"))
    changelog_bytes, workflows = {}, set()
    for table in ("window-state", "window-history"):
        name = f"{app}-{table}-changelog"
        c.assign([TopicPartition(name, p, 0) for p in range(PARTITIONS)])
        ends = {p: c.get_watermark_offsets(TopicPartition(name, p), timeout=10)[1] for p in range(PARTITIONS)}
        n, done = 0, {p for p, e in ends.items() if e == 0}
        while len(done) < PARTITIONS:
            for m in c.consume(5000, timeout=1):
                if m.error():
                    continue
                n += len(m.value() or b"") + len(m.key() or b"")
                if table == "window-state":
                    workflows.add(m.key())
                if m.offset() + 1 >= ends[m.partition()]:
                    done.add(m.partition())
        changelog_bytes[table] = n
    c.close()
    seconds = ticks  # of event time, at 1 Hz
    per_wf = {t: b / seconds / max(1, len(workflows)) for t, b in changelog_bytes.items()}
    print(f"4. changelogs at 10,000 GPUs ({len(workflows)} workflows, {seconds} s of samples): "
          + ", ".join(f"{t} {b / seconds / 1e3:,.1f} kB/s ({per_wf[t]:,.0f} B/s a workflow)"
                      for t, b in changelog_bytes.items()))
    # A new worker of the same group restores every partition's state from the changelogs.
    logfile = data_dir / "restore.log"
    with open(logfile, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpufleet", "--data-dir", str(data_dir), "--log-level", "info", "worker",
             "--bootstrap", bootstrap, "--topic-prefix", prefix, "--app-id", app, "--idle-partition-s", "3600"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "Restore complete" not in logfile.read_text(errors="replace"):
            time.sleep(0.5)
    finally:
        stop(proc)
    stamps = [datetime.strptime(m, "%Y-%m-%d %H:%M:%S,%f") for m in re.findall(
        r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\] \[\d+\] \[INFO\] \[\^---Recovery\]: "
        r"(?:Restoring state from changelog topics|Restore complete)", logfile.read_text(errors="replace"))]
    if len(stamps) >= 2:
        print(f"   a new worker restored the state of all {PARTITIONS} partitions in "
              f"{(stamps[1] - stamps[0]).total_seconds():.2f} s")
    else:
        print(f"   restore time: not found in {logfile}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=120)
    parser.add_argument("--live-gpus", type=int, default=2000)
    parser.add_argument("--skip", nargs="*", default=[], choices=["side", "kill", "cluster", "state"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-") as tmp:
        data_dir = Path(tmp)
        broker = local_kafka.start(data_dir / "kafka", partitions=PARTITIONS)
        try:
            if "side" not in args.skip:
                side_by_side(broker.bootstrap, data_dir, args.ticks)
            if "kill" not in args.skip:
                killed_worker(broker.bootstrap, data_dir, args.live_gpus)
            if "state" not in args.skip:
                changelog_and_restore(broker.bootstrap, data_dir, args.ticks)
        finally:
            local_kafka.stop(data_dir / "kafka")
        if "cluster" not in args.skip:
            killed_broker(data_dir)


if __name__ == "__main__":
    main()
