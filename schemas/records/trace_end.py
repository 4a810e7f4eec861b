"""TraceEnd: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import TIMESTAMP_MS, Field, Record, map_of, optional

PROFILE_SYSTEM_CONTEXT = Record(
    "ProfileSystemContext",
    doc=("What the host agent saw while the rank was profiled (NVML and host metrics at the profile's sampling "
         "rate, 10 Hz by default); means are weighted by the time each sample stands for."),
    namespace="gpufleet",
    fields=(
        Field("ticks", "int", "Agent samples taken during the capture."),
        Field("span_ms", "long", "The time they cover."),
        Field("interval_ms_mean", optional("double"), "Mean time between samples.", default=None),
        Field("gpus", "int", "GPUs of the rank (of the workflow on the host when samples carry no rank)."),
        Field("gpu_utilization_mean_pct", optional("double"), "Mean NVML utilisation of those GPUs.", default=None),
        Field(
            "gpu_zero_utilization_share",
            optional("double"),
            "Share of the GPU time at 0 % utilisation, 0..1.",
            default=None,
        ),
        Field("sm_active_mean_pct", optional("double"), "GPM SM activity, where the GPU reports it.", default=None),
        Field("power_mean_watts", optional("double"), "Mean power of those GPUs.", default=None),
        Field(
            "memory_peak_fraction",
            optional("double"),
            "Highest memory used / total over the capture, 0..1.",
            default=None,
        ),
        Field(
            "workflow_cpu_mean_pct",
            optional("double"),
            "CPU of the workflow's processes on the host, percent of one core.",
            default=None,
        ),
        Field("host_cpu_mean_pct", optional("double"), "Mean CPU use of the host.", default=None),
        Field("host_iowait_mean_pct", optional("double"), "Mean I/O wait of the host.", default=None),
    ),
)


TRACE_END = Record(
    "TraceEnd",
    versions={
        1: "End-of-trace marker: follows the last KernelEvent of a trace on the same key.",
        2: "End-of-trace marker: follows the last KernelEvent of a trace on the same key.",
        3: ("End-of-trace marker: follows the last KernelEvent of a trace on the same key. v3 adds the FLOPs the "
            "profiler counted and the GPU's name: model FLOPs utilisation."),
    },
    fields=(
        Field("trace_id", "string", "The trace that ended."),
        Field("workflow_id", "string", "The workflow profiled."),
        Field("rank", "int", "The trace's rank."),
        Field("events", "long", "How many KernelEvents were published for the trace."),
        Field("events_read", "long", "Trace events the reader parsed from the file."),
        Field("source", "string", "Where the trace came from (file path)."),
        Field("partial", "boolean", "The file was damaged; only what preceded the damage was published."),
        Field("error", optional("string"), "What cut it short, where it was.", default=None),
        Field("last_step_dropped", "boolean", "Whether its last profiler step was dropped, as HTA drops it."),
        Field(
            "memory_peak_bytes",
            optional("long"),
            "Highest memory allocated on a GPU of the trace, from the profiler's memory events.",
            default=None,
        ),
        Field("memory_total_bytes", optional("long"), "That GPU's memory.", default=None),
        Field(
            "flops",
            optional(map_of("long")),
            ("FLOPs of the operators the profiler counted (with_flops=True), per precision of their inputs (bf16, "
             "fp16, fp32, fp64, fp8; unknown without record_shapes); null where the trace counts none."),
            since=3,
            default=None,
        ),
        Field(
            "gpu_name",
            optional("string"),
            "The GPU most of the rank's GPU events ran on, as the trace's deviceProperties name it.",
            since=3,
            default=None,
        ),
        Field("published_at", TIMESTAMP_MS, "When its last event was published."),
        Field(
            "system",
            optional(PROFILE_SYSTEM_CONTEXT),
            "The host's view during a requested profile; null for a trace file published on its own.",
            since=2,
            default=None,
        ),
    ),
)
