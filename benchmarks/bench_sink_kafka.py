"""The sink on its real input: GpuSampleColumns messages on a real broker, into embedded ClickHouse.

Starts its own Kafka (``gpufleet/local/kafka.py``), publishes 10,000 GPUs x ``--ticks`` seconds
as the agents send them (each host every ``--send-every`` seconds, a GpuSampleColumns message
per workflow: ``benchmarks/bench_stream.py``'s ``AgentSends``), then measures on that topic,
in one run and ``--repeat`` times each (medians; this machine is noisy):

- baseline: a bare confluent-kafka consumer that decodes each batch and inserts its columns
  into ``gpu_samples`` with one raw clickhouse-connect column insert (no checks, no commit);
- ``ClickHouseSink``: consume, hand the messages to ClickHouse's own Avro parser, check and
  insert there with its deduplication token (``sinks.insert_sample_columns``), commit. Goal
  (issue 15): >= 0.8 of the baseline;
- the same sink in its first 10 minutes after being given its partitions, when it reads what
  ClickHouse holds of them before each insert (``ClickHouseSink._not_stored``);
- the same sink decoding and checking every message in Python (the path a batch with a bad
  message takes, and every batch before), for comparison;
- a ``gpufleet worker`` process on the same topic, as ``bench_stream.py`` runs it: one sink
  must keep up with what one worker consumes (ratio >= 1).

Both consumers take batches of ``--batch`` messages (or what 1 s brings); a rate is the
samples after the first batch over the time from its end to the end of the last, so that
joining the group is not counted.

    python benchmarks/bench_sink_kafka.py [--ticks 120] [--send-every 5] [--repeat 3] [--batch 2000]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path
from statistics import median

from bench_stream import AgentSends, fleet_10k, produce, rate_from_commits, stop, worker
from confluent_kafka import Consumer, Producer

from gpufleet.local import kafka as local_kafka
from kafka_client.admin import ensure_topics
from kafka_client.config import consumer_config, producer_config
from schemas.codec import Codec
from schemas.topics import GPU_SAMPLES
from sinks.clickhouse_client import connect
from sinks.consume_to_clickhouse import ClickHouseSink
from sinks.ddl_samples import GPU_SAMPLES_TABLE
from sinks.table import KAFKA_COLUMNS
from sinks.write_clickhouse import ClickHouseWriter

PREFIX = "sk."
TOPIC = PREFIX + GPU_SAMPLES.name


class Progress:
    """(time, samples so far) at the end of each batch."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, int]] = []

    def mark(self, samples: int) -> None:
        self.marks.append((time.perf_counter(), samples))

    def rate(self) -> float:
        (t0, n0), (t1, n1) = self.marks[0], self.marks[-1]
        if len(self.marks) < 3:
            raise RuntimeError("fewer than three batches: publish more ticks or take smaller batches")
        return (n1 - n0) / (t1 - t0)


def bare(bootstrap: str, client, database: str, total: int, batch: int) -> float:
    """Samples/s of consume + decode + one raw column insert per batch."""
    codec, progress, n = Codec(), Progress(), 0
    names = [*GPU_SAMPLES_TABLE.columns, *KAFKA_COLUMNS]
    consumer = Consumer(consumer_config(bootstrap, f"bare-{time.time_ns()}"))
    consumer.subscribe([TOPIC])
    try:
        while n < total:
            messages, deadline = [], time.monotonic() + 1.0
            while len(messages) < batch and (timeout := deadline - time.monotonic()) > 0:
                messages += consumer.consume(num_messages=batch - len(messages), timeout=timeout)
            ok, errors = codec.decode_many([m.value() for m in messages])
            assert not errors, errors[:3]
            columns = {c: [] for c in names}
            for i, _, block in ok:
                m, size = messages[i], len(block["event_time"])
                for c in GPU_SAMPLES_TABLE.columns:
                    value = block[c]
                    columns[c] += value if isinstance(value, list) else [value] * size
                for c, value in zip(KAFKA_COLUMNS, (m.partition(), m.offset(), m.topic(), "")):
                    columns[c] += [value] * size
                n += size
            if ok:
                client.insert("gpu_samples", list(columns.values()), column_names=names, column_oriented=True,
                              database=database)
                progress.mark(n)
    finally:
        consumer.close()
    return progress.rate()


class TimedSink(ClickHouseSink):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.progress = Progress()

    def _step(self, messages: list) -> None:  # (each batch, as the consume loop hands it over)
        super()._step(messages)
        if messages:
            self.progress.mark(self.stats.rows["gpu_samples"])


def sink(bootstrap: str, client, database: str, total: int, batch: int, in_sql: bool = True,
         fence_s: float = 0.0) -> float:
    """Samples/s of the sink (``in_sql=False``: decoding and checking every message in Python,
    as all releases before ``sinks.insert_sample_columns`` did). ``fence_s`` 0: as it runs once
    the 10 minutes after it was given its partitions are over, when it no longer reads what
    ClickHouse holds before each insert (``ClickHouseSink._not_stored``); its default: as
    during those 10 minutes."""
    s = TimedSink(bootstrap, ClickHouseWriter(client, database), group_id=f"sink-{time.time_ns()}",
                  topic_prefix=PREFIX, tables=(GPU_SAMPLES_TABLE,), batch_rows=batch, sample_columns_in_sql=in_sql,
                  fence_s=fence_s)
    done = threading.Event()
    thread = threading.Thread(target=s.run, args=(done,))
    thread.start()
    try:
        while s.stats.rows["gpu_samples"] < total and thread.is_alive():
            time.sleep(0.05)  # polling the count only; the rate comes from the batches' own marks
    finally:
        done.set()
        thread.join()
    assert s.stats.rows["gpu_samples"] == total and s.stats.dead_letters == 0, s.stats
    return s.progress.rate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=120)
    parser.add_argument("--send-every", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2000, help="messages per batch")
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-sink-kafka-"))
    broker = local_kafka.start(data_dir / "kafka", partitions=GPU_SAMPLES.partitions)
    try:
        bootstrap = broker.bootstrap
        ensure_topics(bootstrap, prefix=PREFIX)  # all of them: the worker needs its co-partitioned inputs alike
        producer = Producer(producer_config(bootstrap, **{"linger.ms": 50}))
        agents = AgentSends(fleet_10k(), 1_767_225_600_000, args.send_every)
        messages = sum(produce(producer, TOPIC, agents.tick(t)) for t in range(args.ticks))
        messages += produce(producer, TOPIC, agents.rest())
        producer.flush(60)
        total = 10_000 * args.ticks
        print(f"sink on its real input: {total:,} samples of 10,000 GPUs x {args.ticks} ticks in {messages:,} "
              f"GpuSampleColumns messages (each host every {args.send_every} s), batches of {args.batch:,} messages")

        client = connect(f"chdb://{data_dir / 'clickhouse'}")
        rates: dict[str, list[float]] = {"bare": [], "sink": [], "fenced": [], "python": []}
        runs = (("bare", bare), ("sink", sink), ("fenced", lambda *a: sink(*a, fence_s=600.0)),
                ("python", lambda *a: sink(*a, in_sql=False)))
        for r in range(args.repeat):
            for name, run in runs:
                database = f"{name}_{r}"
                ClickHouseWriter(client, database).ensure_tables()
                rates[name].append(run(bootstrap, client, database, total, args.batch))
                stored = client.query(f"SELECT count() FROM {database}.gpu_samples").result_rows[0][0]
                assert stored == total, (database, stored)
                client.command(f"DROP DATABASE {database}")
            print(f"  run {r + 1}: bare {rates['bare'][-1]:,.0f} samples/s, sink {rates['sink'][-1]:,.0f} samples/s "
                  f"({rates['sink'][-1] / rates['bare'][-1]:.2f}), in its first 10 minutes "
                  f"{rates['fenced'][-1]:,.0f} samples/s, decoding in Python {rates['python'][-1]:,.0f} samples/s")
        b, s, py = median(rates["bare"]), median(rates["sink"]), median(rates["python"])
        fenced = sorted(x / y for x, y in zip(rates["fenced"], rates["sink"]))
        ratios = sorted(x / y for x, y in zip(rates["sink"], rates["bare"]))
        print(f"  bare consume + decode + raw insert {b:>10,.0f} samples/s (median of {args.repeat})")
        print(f"  ClickHouseSink                     {s:>10,.0f} samples/s   {s / b:.2f} of bare "
              f"(per-run ratios {', '.join(f'{x:.2f}' for x in ratios)}; goal >= 0.80)")
        print(f"  ClickHouseSink, first 10 minutes   {median(rates['fenced']):>10,.0f} samples/s   "
              f"{median(fenced):.2f} of the sink (per-run ratios {', '.join(f'{x:.2f}' for x in fenced)}): reading "
              "what ClickHouse holds before each insert")
        print(f"  ClickHouseSink decoding in Python  {py:>10,.0f} samples/s   {py / b:.2f} of bare; "
              f"ClickHouse's own parser is {s / py:.2f}x that")

        proc = worker(bootstrap, PREFIX, data_dir, "sk-worker", "--idle-partition-s", "3600")
        try:
            ours = rate_from_commits(bootstrap, "sk-worker", TOPIC, GPU_SAMPLES.partitions, messages, proc)
        finally:
            stop(proc)
        ours *= total / messages
        print(f"  gpufleet worker                    {ours:>10,.0f} samples/s   one sink keeps up with "
              f"{s / ours:.2f} workers (goal >= 1; {py / ours:.2f} decoding in Python)")
    finally:
        local_kafka.stop(data_dir / "kafka")


if __name__ == "__main__":
    main()
