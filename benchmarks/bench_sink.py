"""The ClickHouse side, on the embedded engine: sink throughput and bytes per sample on disk.

1. Writer throughput: ``ClickHouseWriter.insert`` of decoded samples (record dicts -> columns,
   deduplication token, insert) against a raw clickhouse-connect column insert of the same
   columns into the same table, prepared beforehand, in the same run. Goal (issue 7): >= 80 %.
   Also printed: the whole sink path per message (Avro decode + validation + writer) against
   decode + raw insert, so that the cost of each part is visible.
2. Storage: bytes per raw sample on disk in ``gpu_samples`` after the codecs (after a merge)
   against its Avro size on the wire (Confluent framing included). Goal: >= 10x smaller.
   The simulated fleet adds uniform noise to every gauge each second; real gauges change
   more slowly and compress better, so this is a floor.

    python benchmarks/bench_sink.py [--samples 200000] [--batch 20000]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from producers.simulate.fleet import build_fleet
from schemas.codec import Codec
from schemas.validate_sample import validate_sample
from sinks.clickhouse_client import connect
from sinks.clickhouse_ddl import GPU_SAMPLES_TABLE, KAFKA_COLUMNS
from sinks.write_clickhouse import ClickHouseWriter, Row

START_MS = 1_767_225_600_000
TOPIC, TOPIC_ID = "gpufleet.gpu-samples.v1", "bench-topic-id"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=20_000)
    args = parser.parse_args()
    codec = Codec()
    fleet = build_fleet(seed=5, hosts=125, gpus_per_host=8, workflows=300)
    records, tick = [], 0
    while len(records) < args.samples:
        records += list(fleet.samples_at(tick, START_MS, 1000))
        tick += 1
    records = records[:args.samples]
    wire = [codec.encode("GpuSample", r) for r in records]
    decoded = [r for _, _, r in codec.decode_many(wire)[0]]
    batches = [range(i, min(i + args.batch, len(records))) for i in range(0, len(records), args.batch)]

    client = connect(f"chdb://{tempfile.mkdtemp(prefix='gpufleet-bench-sink-')}")
    raw_db, writer_db, sink_db = ClickHouseWriter(client, "raw"), ClickHouseWriter(client, "writer"), \
        ClickHouseWriter(client, "sink")
    for w in (raw_db, writer_db, sink_db):
        w.ensure_tables()
    names = [*GPU_SAMPLES_TABLE.columns, *KAFKA_COLUMNS]
    prepared = []
    for b in batches:
        rows = [GPU_SAMPLES_TABLE.prepare(decoded[i]) for i in b]
        columns = [[r.get(c) for r in rows] for c in GPU_SAMPLES_TABLE.columns] + [
            [0] * len(b), list(b), [TOPIC] * len(b), [TOPIC_ID] * len(b)]
        prepared.append(columns)

    t0 = time.perf_counter()
    for columns in prepared:
        client.insert("gpu_samples", columns, column_names=names, column_oriented=True, database="raw")
    raw_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    for b in batches:
        assert writer_db.insert(GPU_SAMPLES_TABLE, [Row(0, i, decoded[i], TOPIC, TOPIC_ID) for i in b]) == []
    writer_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    for b in batches:
        ok, errors = codec.decode_many([wire[i] for i in b])
        assert not errors and not any(validate_sample(r) for _, _, r in ok)
        assert sink_db.insert(GPU_SAMPLES_TABLE, [Row(0, b[i], r, TOPIC, TOPIC_ID) for i, _, r in ok]) == []
    sink_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    codec.decode_many(wire)
    decode_s = time.perf_counter() - t0

    n = len(records)
    print(f"sink: {n:,} GpuSample rows in batches of {args.batch:,}, embedded ClickHouse")
    print(f"  raw clickhouse-connect column insert   {n / raw_s:>10,.0f} rows/s")
    print(f"  ClickHouseWriter.insert (dicts)         {n / writer_s:>10,.0f} rows/s   "
          f"{raw_s / writer_s:.2f} of raw (goal >= 0.80)")
    print(f"  whole sink path (decode+validate+write) {n / sink_s:>10,.0f} rows/s   "
          f"{(raw_s + decode_s) / sink_s:.2f} of decode + raw insert")

    for db in ("raw", "writer", "sink"):
        count = client.query(f"SELECT count() FROM {db}.gpu_samples").result_rows[0][0]
        assert count == n, (db, count)
    client.command("OPTIMIZE TABLE writer.gpu_samples FINAL")
    on_disk, rows = client.query(
        "SELECT sum(bytes_on_disk), sum(rows) FROM system.parts "
        "WHERE database = 'writer' AND table = 'gpu_samples' AND active").result_rows[0]
    avro = sum(len(v) for v in wire) / n
    print(f"storage: {on_disk / rows:.1f} bytes per sample on disk against {avro:.1f} bytes of Avro on the wire: "
          f"{avro / (on_disk / rows):.1f}x smaller (goal >= 10x)")
    per_column = client.query(
        "SELECT name, data_compressed_bytes FROM system.columns WHERE database = 'writer' AND table = 'gpu_samples' "
        "ORDER BY data_compressed_bytes DESC LIMIT 5").result_rows
    print("  largest columns: " + ", ".join(f"{name} {b / rows:.2f} B" for name, b in per_column))


if __name__ == "__main__":
    main()
