"""The straightforward Faust design the worker is measured against (benchmarks/bench_stream.py).

One ``faust.Record`` per sample and one update of a Faust tumbling-window table per sample:
what the Faust documentation's examples lead to. Run as a Faust worker:

    GPUFLEET_BOOTSTRAP=127.0.0.1:9092 GPUFLEET_BENCH_TOPIC=bench.gpu-samples.v1 \
        python benchmarks/naive_record_agent.py worker -l warn
"""

from __future__ import annotations

import os

import faust
from faust.serializers import codecs

from schemas.codec import Codec
from schemas.sample_columns import rows_of

CODEC = Codec()


class AvroWire(codecs.Codec):
    """Confluent-framed Avro to a dict, one message at a time."""

    def _loads(self, s: bytes) -> dict:
        name, record = CODEC.decode(s)
        if name == "GpuSampleColumns":
            return {"workflow_id": record["workflow_id"], "samples": rows_of(record)}
        return record if name == "GpuSampleBatch" else {"workflow_id": record["workflow_id"], "samples": [record]}

    def _dumps(self, obj) -> bytes:
        raise NotImplementedError("read-only benchmark codec")


codecs.register("gpufleet-avro", AvroWire())


class GpuSampleRecord(faust.Record):
    event_time: int
    interval_ms: int
    host: str
    gpu_index: int
    gpu_uuid: str
    workflow_id: str
    utilization_pct: float
    memory_used_bytes: int = None
    memory_total_bytes: int = None
    power_watts: float = None
    share: float = None


class GpuSampleBatchRecord(faust.Record, serializer="gpufleet-avro"):
    """A GpuSample message is read as a batch of one, a GpuSampleColumns message row by row."""

    workflow_id: str
    samples: list[GpuSampleRecord]


app = faust.App(
    os.environ.get("GPUFLEET_BENCH_APP", "gpufleet-bench-naive"),
    broker=f"kafka://{os.environ['GPUFLEET_BOOTSTRAP']}",
    store="memory://",
    web_enabled=False,
    datadir=os.environ.get("GPUFLEET_BENCH_DATADIR", "/tmp/gpufleet-bench-naive"),
)
samples = app.topic(os.environ["GPUFLEET_BENCH_TOPIC"], value_type=GpuSampleBatchRecord, key_serializer="raw")
busy = app.Table("busy-gpu-ms", default=float, partitions=8).tumbling(60, expires=3600).relative_to_stream()


@app.agent(samples)
async def per_record(stream):
    async for batch in stream:
        for sample in batch.samples:
            busy[sample.workflow_id] += sample.interval_ms * sample.utilization_pct / 100.0


if __name__ == "__main__":
    app.main()
