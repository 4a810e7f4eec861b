"""ServingSample: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import OWNER, TEAM, TIMESTAMP_MS, Field, Record, array, optional

SERVING_SAMPLE = Record(
    "ServingSample",
    versions={
        1: ("What a serving replica's engine did in the time a GPU sample stands for, read from its Prometheus "
            "endpoint (vLLM, SGLang, TGI, Triton) by the host agent, or from a recorded fleet by gpufleet replay. "
            "Sent on the samples topic keyed by workflow, beside the replica's GPU samples and attributed to the "
            "same workflow and GPUs: the worker judges a replica by its traffic, not by its GPUs' utilisation "
            "alone."),
    },
    fields=(
        Field("workflow_id", "string", "The workflow that holds the replica's GPUs."),
        Field("host", "string", "The replica's host."),
        OWNER,
        TEAM,
        Field("gpu_uuids", array("string"), "The GPUs the replica runs on."),
        Field("service", "string", "The model or deployment the replica serves: its replicas are one service."),
        Field("engine", "string", "vllm, sglang, tgi, triton, or recorded (a replay)."),
        Field("event_time", TIMESTAMP_MS, "When the endpoint was read."),
        Field("interval_ms", "long", "The time since the previous reading, which the figures cover."),
        Field(
            "requests",
            "double",
            "Requests the replica finished in the interval (a recorded trace's may be scaled: not whole).",
        ),
        Field("tokens", optional("double"), "Tokens it generated in the interval.", default=None),
        Field("running", optional("double"), "Requests being served at the reading.", default=None),
        Field("waiting", optional("double"), "Requests queued at the reading.", default=None),
        Field(
            "queue_time_ms",
            optional("double"),
            "The mean time the interval's requests waited in the queue.",
            default=None,
        ),
        Field("ttft_ms", optional("double"), "The mean time to their first token.", default=None),
        Field("kv_cache_usage", optional("double"), "The KV cache's use at the reading, 0..1.", default=None),
        Field(
            "batch_size",
            optional("double"),
            "The batch's size at the reading, or the interval's mean.",
            default=None,
        ),
    ),
)
