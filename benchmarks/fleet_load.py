"""The load the stream benchmarks put on the worker: a simulated 10k-GPU fleet sending as its
agents do, produced as fast as the broker takes it, and how to read what the worker committed."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support.samples

from kafka_client.config import consumer_config
from producers.simulate.fleet import build_fleet
from schemas.codec import Codec
from schemas.sample_columns import columns_of
from schemas.topics import GPU_SAMPLES, key_of
from tests.support.samples import batch_samples  # the older GpuSampleBatch format, for comparison

CODEC = Codec()
GPUS_PER_HOST = 8


def fleet_10k(seed: int = 3):
    return build_fleet(seed=seed, hosts=1250, gpus_per_host=GPUS_PER_HOST, workflows=600)


class AgentSends:
    """What the hosts' agents send each second. Each agent samples every second and sends
    every ``every`` seconds (``gpufleet agent --send-every``), each workflow's samples since
    its last send in one GpuSampleColumns message (the forwarder's merge); the hosts' send
    times are spread over the interval. ``every=1``: one message per tick; ``fmt="batch"``: a
    GpuSampleBatch instead (older agents), ``fmt="gpu"``: one GpuSample message per GPU and tick
    (no batching at all)."""

    def __init__(self, fleet, start_ms: int, every: int = 1, fmt: str = "columns") -> None:
        self.fleet, self.start_ms, self.every, self.fmt = fleet, start_ms, max(1, every), fmt
        self.hosts = sorted({g.host for w in fleet.workflows for g in w.gpus})
        self.phase = {h: i % self.every for i, h in enumerate(self.hosts)}
        self.pending: dict[str, list[dict]] = {h: [] for h in self.hosts}

    def tick(self, t: int) -> list[tuple[bytes, bytes]]:
        samples = list(self.fleet.samples_at(t, self.start_ms, 1000))
        if self.fmt == "gpu":
            return [(key_of(GPU_SAMPLES, s), CODEC.encode("GpuSample", s)) for s in samples]
        for s in samples:
            self.pending[s["host"]].append(s)
        return self._send([h for h in self.hosts if self.phase[h] == t % self.every])

    def rest(self) -> list[tuple[bytes, bytes]]:
        """What the agents still hold (they send it when they stop)."""
        return self._send(self.hosts)

    def _send(self, hosts) -> list[tuple[bytes, bytes]]:
        out = []
        group, schema = (batch_samples, "GpuSampleBatch") if self.fmt == "batch" else (columns_of, "GpuSampleColumns")
        for h in hosts:
            out += [(key_of(GPU_SAMPLES, b), CODEC.encode(schema, b))
                    for b in group(self.pending[h], per_tick=self.every == 1)]
            self.pending[h] = []
        return out


def produce(producer: Producer, topic: str, messages) -> int:
    n = 0
    for key, value in messages:
        while True:
            try:
                producer.produce(topic, value=value, key=key)
                break
            except BufferError:
                producer.poll(0.05)
            except KafkaException as exc:  # a topic created a moment ago, not yet in the metadata
                if exc.args[0].code() != KafkaError._UNKNOWN_TOPIC:
                    raise
                producer.poll(0.2)
        n += 1
    producer.poll(0)
    return n


class Lag:
    """(committed total, end total) of ``group`` on ``topic``, asked of the broker with one
    consumer that never joins the group: polled every 0.2 s, a new consumer per question took
    CPU from the worker being measured (two cores here)."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int) -> None:
        self.consumer = Consumer(consumer_config(bootstrap, group))
        self.tps = [TopicPartition(topic, p) for p in range(partitions)]

    def __call__(self) -> tuple[int, int]:
        for attempt in range(20):  # the group's coordinator can be loading or moving: ask again
            try:
                committed = sum(max(tp.offset, 0) for tp in self.consumer.committed(self.tps, timeout=10))
                end = sum(self.consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1] for tp in self.tps)
                return committed, end
            except KafkaException:
                if attempt == 19:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.consumer.close()


def rate_from_commits(bootstrap, group, topic, partitions, total, proc, timeout=600.0, measure_s=60.0) -> float:
    """Messages/s between the group's first commit on ``topic`` and its last, or the last
    within ``measure_s`` of the first (a slow consumer need not read everything)."""
    first = None
    deadline = time.monotonic() + timeout
    lag = Lag(bootstrap, group, topic, partitions)
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
            committed, _ = lag()
            now = time.monotonic()
            if committed and first is None:
                first = (now, committed)
            if committed >= total or (first and now - first[0] >= measure_s):
                if first[1] >= total:
                    raise RuntimeError("everything was committed at once: publish more ticks")
                return (committed - first[1]) / (now - first[0])
            time.sleep(0.2)
    finally:
        lag.close()
    raise RuntimeError(f"{group} did not commit {total} messages within {timeout:.0f}s")


def worker(bootstrap, prefix, data_dir, app_id, *options, root: Path = ROOT) -> subprocess.Popen:
    """``gpufleet worker`` of the code in ``root`` (``python -m`` imports from its directory first)."""
    with open(data_dir / f"{app_id}.log", "ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "gpufleet", "--data-dir", str(data_dir), "--log-level", "warning", "worker",
             "--bootstrap", bootstrap, "--topic-prefix", prefix, "--app-id", app_id, *options],
            cwd=root, stdout=log, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
