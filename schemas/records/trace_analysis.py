"""TraceAnalysis: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import TIMESTAMP_MS, Field, Record, array, optional
from schemas.records.trace_end import PROFILE_SYSTEM_CONTEXT
from schemas.records.trace_figures import (
    ANNOTATION_TIME,
    COLLECTIVE_LAUNCHES,
    KERNEL_TYPE_TIME,
    MEMORY_COPY_KIND,
    OPERATOR_ROOFLINE,
    STEP_TIMELINE,
    STREAM_IDLE,
    STREAM_QUEUE,
    TOP_KERNEL,
)

TRACE_ANALYSIS = Record(
    "TraceAnalysis",
    versions={
        1: ("Analysis of one rank's trace: HTA-equal temporal breakdown, communication/computation overlap, idle "
            "breakdown per stream and CUDA launch statistics."),
        2: ("Analysis of one rank's trace: HTA-equal temporal breakdown, communication/computation overlap, idle "
            "breakdown per stream and CUDA launch statistics."),
        3: ("Analysis of one rank's trace: HTA-equal temporal breakdown, communication/computation overlap, idle "
            "breakdown per stream and CUDA launch statistics. v3 adds model FLOPs utilisation (MFU) from the "
            "FLOPs the profiler counted."),
        4: ("Analysis of one rank's trace: HTA-equal temporal breakdown, communication/computation overlap, idle "
            "breakdown per stream and CUDA launch statistics. v3 adds model FLOPs utilisation (MFU) from the "
            "FLOPs the profiler counted. v4 adds HTA's kernel breakdown: GPU time by kernel type (with overlaps) "
            "the top kernels of each type, the memory copies per kind with HTA's memory bandwidth summary, the "
            "collectives' durations for the multi-rank analysis, the roofline of the operators that count their "
            "FLOPs, the GPU time of the user's annotations, the launch queue per stream, and per-step timelines."),
    },
    fields=(
        Field(
            "trace_id",
            "string",
            "The trace's id (the record's key): workflow/file, or profile/request/host/rank for a requested profile.",
        ),
        Field("workflow_id", "string", "The workflow profiled."),
        Field("rank", "int", "The rank of the trace (its distributed info; 0 where it has none)."),
        Field("source", optional("string"), "The trace file it was read from.", default=None),
        Field(
            "partial",
            "boolean",
            ("Whether the trace was cut short (a damaged file, a capture that ended early): the figures cover what "
             "was read."),
        ),
        Field("error", optional("string"), "What cut it short, where it was.", default=None),
        Field("events", "long", "Events analysed."),
        Field("gpu_events", "long", "Kernels, copies and memsets among them."),
        Field("gpu_events_without_launch", "long", "GPU events whose runtime call is not in the trace."),
        Field(
            "kernel_time_us",
            "double",
            ("The GPU timeline's span: from the first GPU event's start to the last one's end (HTA's temporal "
             "breakdown)."),
        ),
        Field("idle_time_us", "double", "Time in that span when no kernel ran."),
        Field("compute_time_us", "double", "Time when a computation kernel ran."),
        Field("non_compute_time_us", "double", "Time when only communication or memory kernels ran."),
        Field("idle_pct", optional("double"), "Idle time over the span, in percent.", default=None),
        Field("compute_pct", optional("double"), "Compute time over the span, in percent.", default=None),
        Field("non_compute_pct", optional("double"), "Non-compute time over the span, in percent.", default=None),
        Field("communication_time_us", "double", "Time when a communication kernel ran (HTA's overlap analysis)."),
        Field("comp_comm_overlap_us", "double", "Communication time during which computation ran too."),
        Field(
            "comp_comm_overlap_pct",
            optional("double"),
            "That overlap over the communication time, in percent.",
            default=None,
        ),
        Field("idle_by_stream", array(STREAM_IDLE), "Idle time per CUDA stream, by cause (HTA's idle time breakdown)."),
        Field(
            "launches",
            "long",
            "Kernel launches joined to their runtime call (HTA's CUDA kernel launch statistics).",
        ),
        Field(
            "launch_delay_mean_us",
            optional("double"),
            "Mean time from a launch call's start to its kernel's start.",
            default=None,
        ),
        Field("launch_delay_max_us", optional("double"), "The longest of those.", default=None),
        Field("launch_delay_total_us", "double", "Their sum."),
        Field(
            "cpu_duration_mean_us",
            optional("double"),
            "Mean duration of the launch calls on the CPU.",
            default=None,
        ),
        Field("gpu_duration_mean_us", optional("double"), "Mean duration of the kernels they launched.", default=None),
        Field("short_kernels", "long", "Kernels shorter than HTA's short-kernel threshold."),
        Field("short_kernel_gpu_us", "double", "Their GPU time."),
        Field("runtime_outliers", "long", "Launch calls longer on the CPU than HTA's runtime cutoff."),
        Field("launch_delay_outliers", "long", "Launches with a delay longer than HTA's launch-delay cutoff."),
        Field("gpu_name", optional("string"), "The rank's GPU, as the trace names it.", since=3, default=None),
        Field(
            "model_flops",
            optional("long"),
            "FLOPs of the operators the profiler counted (with_flops=True), all precisions.",
            since=3,
            default=None,
        ),
        Field(
            "model_flops_precision",
            optional("string"),
            "The precision most of those FLOPs ran at, whose peak MFU is measured against.",
            since=3,
            default=None,
        ),
        Field(
            "peak_tflops",
            optional("double"),
            ("The GPU's dense peak at that precision (schemas/gpu_peaks.json); null where the model or precision "
             "is not in the table."),
            since=3,
            default=None,
        ),
        Field(
            "mfu_pct",
            optional("double"),
            ("Model FLOPs utilisation: the FLOPs over the GPU timeline's span (idle + compute + non-compute "
             "time), against the peak, in percent."),
            since=3,
            default=None,
        ),
        Field(
            "profiler_steps",
            "int",
            ("Profiler steps the analysis covers (the last one is dropped, as HTA does, when there are two or "
             "more); per-step figures divide by it."),
            since=4,
            default=0,
        ),
        Field(
            "kernel_types",
            array(KERNEL_TYPE_TIME),
            ("GPU time with exactly these kernel types running (COMPUTATION, COMMUNICATION, MEMORY, and 'X "
             "overlapping Y' where they overlap), largest first; only types with time."),
            since=4,
            default=[],
        ),
        Field(
            "top_kernels",
            array(TOP_KERNEL),
            ("Per kernel type, the kernels that took most time (HTA's rule: at most 10, within the 0.8 quantile "
             "of the running total), then 'others' for the rest."),
            since=4,
            default=[],
        ),
        Field(
            "memory_copies",
            array(MEMORY_COPY_KIND),
            "Memory copies and sets per kind (Memcpy HtoD, Memcpy DtoH, Memcpy DtoD, Memset...).",
            since=4,
            default=[],
        ),
        Field(
            "collectives",
            array(COLLECTIVE_LAUNCHES),
            ("Per NCCL collective kernel name, the duration of each launch in GPU order (at most 20000 per name): "
             "across a job's ranks, the shortest of the k-th launches is the rank that arrived last."),
            since=4,
            default=[],
        ),
        Field(
            "operators",
            array(OPERATOR_ROOFLINE),
            ("Roofline of the operators that count their FLOPs (with_flops=True), by GPU time, at most 10: "
             "achieved TFLOP/s and bandwidth against the GPU's peaks, compute- or memory-bound, and the GPU time "
             "at stake below 70 % of the roof."),
            since=4,
            default=[],
        ),
        Field(
            "gpu_annotations",
            array(ANNOTATION_TIME),
            ("HTA's GPU user-annotation breakdown: per record_function range name its time on the GPU (count, "
             "total, min, max, mean, deviation), by total time."),
            since=4,
            default=[],
        ),
        Field(
            "queue_lengths",
            array(STREAM_QUEUE),
            ("HTA's launch queue length per stream: the operations launched and not yet started, summarised over "
             "the values it takes after each change (count, mean, std, min, quartiles, max), and the time it held "
             "CUDA's full 1024."),
            since=4,
            default=[],
        ),
        Field(
            "steps",
            array(STEP_TIMELINE),
            ("Per profiler step (at most 10000): its CPU duration and the GPU timeline of the work launched "
             "during it (a GPU event belongs to the step its launch call was made in)."),
            since=4,
            default=[],
        ),
        Field(
            "analyzed_at",
            TIMESTAMP_MS,
            "When the analysis was made (it replaces an older one of the same trace_id).",
        ),
        Field(
            "system",
            optional(PROFILE_SYSTEM_CONTEXT),
            "From the TraceEnd: what the host saw while the trace was captured.",
            since=2,
            default=None,
        ),
    ),
)
