"""WorkflowWindow: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import OWNER, TEAM, TIMESTAMP_MS, Field, Record, goodput_fields, optional

WORKFLOW_WINDOW = Record(
    "WorkflowWindow",
    versions={
        1: "Aggregate of one workflow's GPU samples over one event-time tumbling window [window_start, window_end).",
        2: ("Aggregate of one workflow's GPU samples over one event-time tumbling window [window_start, "
            "window_end). v2 adds where the GPU-seconds went (efficiency) and hardware health."),
        3: ("Aggregate of one workflow's GPU samples over one event-time tumbling window [window_start, "
            "window_end). v2 adds where the GPU-seconds went (efficiency) and hardware health. v3 adds the "
            "workflow's CPU and the hosts' I/O wait."),
        4: ("Aggregate of one workflow's GPU samples over one event-time tumbling window [window_start, "
            "window_end). v2 adds where the GPU-seconds went (efficiency) and hardware health. v3 adds the "
            "workflow's CPU and the hosts' I/O wait. v4 adds the version: a window completed by late samples is "
            "emitted again with a higher version, and the highest version is the window (ClickHouse: "
            "ReplacingMergeTree(version))."),
        5: ("Aggregate of one workflow's GPU samples over one event-time tumbling window [window_start, "
            "window_end). v2 adds where the GPU-seconds went (efficiency) and hardware health. v3 adds the "
            "workflow's CPU and the hosts' I/O wait. v4 adds the version: a window completed by late samples is "
            "emitted again with a higher version, and the highest version is the window (ClickHouse: "
            "ReplacingMergeTree(version)). v5 adds the goodput waterfall: each GPU-second of the window in "
            "exactly one bucket (unhealthy, startup, idle, input_bound, low_util, productive) with its energy, "
            "the GPUs' model, and the model FLOPs utilisation the job's reported throughput gives."),
        6: ("Aggregate of one workflow's GPU samples over one event-time tumbling window [window_start, "
            "window_end). v2 adds where the GPU-seconds went (efficiency) and hardware health. v3 adds the "
            "workflow's CPU and the hosts' I/O wait. v4 adds the version: a window completed by late samples is "
            "emitted again with a higher version, and the highest version is the window (ClickHouse: "
            "ReplacingMergeTree(version)). v5 adds the goodput waterfall: each GPU-second of the window in "
            "exactly one bucket (unhealthy, startup, idle, input_bound, low_util, productive) with its energy, "
            "the GPUs' model, and the model FLOPs utilisation the job's reported throughput gives. v6 adds the "
            "unobserved bucket: the time the scheduler says the job held its GPUs and no sample came."),
    },
    fields=(
        Field("workflow_id", "string", "The workflow (the record's key)."),
        OWNER,
        TEAM,
        Field("window_start", TIMESTAMP_MS, "The window's start (event time)."),
        Field("window_end", TIMESTAMP_MS, "Its end, excluded."),
        Field("sample_count", "long", "GPU samples in the window."),
        Field("gpu_count", "int", "Distinct GPUs (by UUID) seen in the window."),
        Field("gpu_seconds", "double", "Sum of the samples' intervals."),
        Field("utilization_mean_pct", "double", "Mean utilisation weighted by sample interval."),
        Field("utilization_min_pct", "double", "The lowest sample's utilisation."),
        Field("utilization_max_pct", "double", "The highest sample's utilisation."),
        Field("memory_used_mean_bytes", optional("double"), "Mean device memory in use per sample.", default=None),
        Field(
            "energy_joules",
            optional("double"),
            "Sum of power x interval over samples that report power.",
            default=None,
        ),
        Field("active_gpu_seconds", "double", "GPU-seconds with utilisation above 0 %.", since=2, default=0),
        Field("wasted_gpu_seconds", "double", "Allocated GPU-seconds x (1 - utilisation).", since=2, default=0),
        Field("zero_util_gpu_seconds", "double", "GPU-seconds at 0 % utilisation.", since=2, default=0),
        Field("utilization_p50_pct", optional("double"), "Median utilisation of the samples.", since=2, default=None),
        Field(
            "utilization_p95_pct",
            optional("double"),
            "95th percentile of the samples' utilisation.",
            since=2,
            default=None,
        ),
        Field(
            "sm_active_mean_pct",
            optional("double"),
            "GPM SM activity, where the GPU reports it.",
            since=2,
            default=None,
        ),
        Field(
            "tensor_active_mean_pct",
            optional("double"),
            "GPM tensor activity, where the GPU reports it.",
            since=2,
            default=None,
        ),
        Field(
            "memory_peak_fraction",
            optional("double"),
            "Highest memory used / total of any sample.",
            since=2,
            default=None,
        ),
        Field(
            "memory_mean_fraction",
            optional("double"),
            "Mean device memory in use over the memory the GPUs have.",
            since=2,
            default=None,
        ),
        Field("power_mean_watts", optional("double"), "Mean power per GPU.", since=2, default=None),
        Field(
            "gpu_imbalance_pct",
            optional("double"),
            "Highest minus lowest per-GPU mean utilisation.",
            since=2,
            default=None,
        ),
        Field("idle_gpus", "int", "GPUs of the workflow at 0 % for the whole window.", since=2, default=0),
        Field(
            "throttled_gpu_seconds",
            "double",
            "GPU-seconds under power or thermal clock limits.",
            since=2,
            default=0,
        ),
        Field("xid_count", "int", "XID errors reported in the window.", since=2, default=0),
        Field(
            "ecc_uncorrected_max",
            optional("long"),
            "Highest volatile uncorrected ECC count seen.",
            since=2,
            default=None,
        ),
        Field(
            "workflow_cpu_mean_pct",
            optional("double"),
            "Mean CPU of the workflow's processes per GPU sample, in % of one core.",
            since=3,
            default=None,
        ),
        Field(
            "host_iowait_mean_pct",
            optional("double"),
            "Mean I/O wait of the workflow's hosts.",
            since=3,
            default=None,
        ),
        Field(
            "gpu_model",
            optional("string"),
            "The model of the window's GPUs (of the first GPU where they differ).",
            since=5,
            default=None,
        ),
        *goodput_fields(since=5),
        Field(
            "model_mfu_pct",
            optional("double"),
            ("Model FLOPs utilisation from what the job reported (model_tflops of its samples) against its GPUs' "
             "bf16 dense peak (schemas/gpu_peaks.json), weighted like utilisation; null where the job reports no "
             "throughput or its GPU model is not in the table."),
            since=5,
            default=None,
        ),
        Field(
            "version",
            "int",
            ("1 when the window first closes; each emission with late samples added counts up. Replays of the "
             "same emission carry the same version."),
            since=4,
            default=1,
        ),
        Field("closed_at", TIMESTAMP_MS, "Wall-clock time the worker closed the window."),
        Field(
            "unobserved_gpu_seconds",
            "double",
            ("GPU-seconds the job held in the window, as its scheduler says, that no sample stands for (its agent "
             "was not running: UnobservedTime); part of gpu_seconds, in no other bucket, judged by no detector."),
            since=6,
            default=0.0,
        ),
        Field("unobserved_joules", "double", "Always 0: nothing measured that time's energy.", since=6, default=0.0),
    ),
)
