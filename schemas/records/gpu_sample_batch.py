"""GpuSampleBatch: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import TIMESTAMP_MS, Field, Record, Versioned, array
from schemas.records.gpu_sample import GPU_SAMPLE

GPU_SAMPLE_BATCH = Record(
    "GpuSampleBatch",
    versions={
        1: ("The GPU samples of one workflow on one host at one tick, in one message: a stream worker pays its "
            "per-message cost once per batch instead of once per GPU. Keyed by workflow_id like GpuSample, so it "
            "lands on the workflow's partition; every sample carries the batch's workflow_id."),
        2: ("The GPU samples of one workflow on one host at one tick, in one message: a stream worker pays its "
            "per-message cost once per batch instead of once per GPU. Keyed by workflow_id like GpuSample, so it "
            "lands on the workflow's partition; every sample carries the batch's workflow_id. v2 carries "
            "GpuSample v4."),
    },
    fields=(
        Field("host", "string", "The host the samples come from."),
        Field("workflow_id", "string", "The workflow all the samples belong to (the message key)."),
        Field("event_time", TIMESTAMP_MS, "The tick's time (UTC); each sample has its own."),
        Field("samples", array(Versioned({1: GPU_SAMPLE.at(3), 2: GPU_SAMPLE.at(4)})),
              "The samples, at least one (GpuSample v3 in version 1, v4 in version 2)."),
    ),
)
