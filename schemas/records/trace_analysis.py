"""TraceAnalysis: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import TIMESTAMP_MS, Field, Record, array, optional
from schemas.records.trace_end import PROFILE_SYSTEM_CONTEXT

STREAM_IDLE = Record(
    "StreamIdle",
    fields=(
        Field("stream", "int"),
        Field("host_wait_us", "double"),
        Field("kernel_wait_us", "double"),
        Field("other_us", "double"),
    ),
)


KERNEL_TYPE_TIME = Record(
    "KernelTypeTime",
    fields=(
        Field("kernel_type", "string"),
        Field("time_us", "double"),
        Field("pct", "double", "Share of the time of all kernel types, in percent."),
    ),
)


TOP_KERNEL = Record(
    "TopKernel",
    fields=(
        Field("kernel_type", "string"),
        Field("name", "string", "The kernel's name, or 'others'."),
        Field("kernels", "int", "Distinct kernels in the row: 1, or how many kernels 'others' holds."),
        Field("launches", "long"),
        Field("time_us", "double"),
        Field("min_us", "double"),
        Field("max_us", "double"),
        Field("mean_us", "double"),
        Field("stddev_us", "double", "Sample standard deviation (n-1) of the launches' durations; 0 for one launch."),
    ),
)


MEMORY_COPY_KIND = Record(
    "MemoryCopyKind",
    fields=(
        Field("kind", "string"),
        Field("copies", "long"),
        Field("bytes", "long"),
        Field("time_us", "double"),
        Field("achieved_gbps", optional("double"), "Bytes over GPU time of the kind's copies, GB/s.", default=None),
        Field(
            "bw_samples",
            "long",
            ("HTA's memory bandwidth summary: values of the kind's concurrent bandwidth after each change, zeros "
             "left out; their count, mean, std, min, quartiles, max."),
        ),
        Field("bw_mean_gbps", optional("double"), default=None),
        Field("bw_std_gbps", optional("double"), default=None),
        Field("bw_min_gbps", optional("double"), default=None),
        Field("bw_p25_gbps", optional("double"), default=None),
        Field("bw_p50_gbps", optional("double"), default=None),
        Field("bw_p75_gbps", optional("double"), default=None),
        Field("bw_max_gbps", optional("double"), default=None),
    ),
)


COLLECTIVE_LAUNCHES = Record(
    "CollectiveLaunches",
    fields=(
        Field("name", "string"),
        Field("durations_us", array("double")),
    ),
)


OPERATOR_ROOFLINE = Record(
    "OperatorRoofline",
    fields=(
        Field("name", "string"),
        Field("calls", "long"),
        Field("flops", "long"),
        Field(
            "bytes",
            optional("long"),
            "Bytes moved at least (inputs, and outputs whose shape follows from them); null without shapes.",
            default=None,
        ),
        Field("gpu_time_us", "double", "GPU time of the kernels launched from inside the operator."),
        Field("precision", "string"),
        Field("achieved_tflops", "double"),
        Field("achieved_gbps", optional("double"), default=None),
        Field("intensity", optional("double"), "FLOPs per byte.", default=None),
        Field("peak_tflops", optional("double"), default=None),
        Field("peak_gbps", optional("double"), default=None),
        Field("bound", optional("string"), "compute or memory; null without bytes or peaks.", default=None),
        Field("roof_tflops", optional("double"), default=None),
        Field("roof_pct", optional("double"), default=None),
        Field("at_stake_us", "double", "GPU time the operator would save at 70 % of its roof."),
    ),
)


ANNOTATION_TIME = Record(
    "AnnotationTime",
    fields=(
        Field("name", "string"),
        Field("kernels", "int", "Names in the row: 1, or how many 'others' holds."),
        Field("launches", "long", "Ranges."),
        Field("time_us", "double"),
        Field("min_us", "double"),
        Field("max_us", "double"),
        Field("mean_us", "double"),
        Field("stddev_us", "double"),
    ),
)


STREAM_QUEUE = Record(
    "StreamQueue",
    fields=(
        Field("stream", "int"),
        Field("samples", "long"),
        Field("mean", optional("double"), default=None),
        Field("std", optional("double"), default=None),
        Field("min", optional("double"), default=None),
        Field("p25", optional("double"), default=None),
        Field("p50", optional("double"), default=None),
        Field("p75", optional("double"), default=None),
        Field("max", optional("double"), default=None),
        Field("blocked_us", "double", "Time the queue held at least 1024 operations: the host could not launch."),
    ),
)


STEP_TIMELINE = Record(
    "StepTimeline",
    fields=(
        Field("step", "string"),
        Field("cpu_us", "double"),
        Field("gpu_events", "long"),
        Field("gpu_span_us", "double", "From the first start to the last end of the step's GPU events."),
        Field("gpu_busy_us", "double"),
        Field("gpu_idle_us", "double"),
        Field("compute_us", "double"),
    ),
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
        Field("trace_id", "string"),
        Field("workflow_id", "string"),
        Field("rank", "int"),
        Field("source", optional("string"), default=None),
        Field("partial", "boolean"),
        Field("error", optional("string"), default=None),
        Field("events", "long"),
        Field("gpu_events", "long"),
        Field("gpu_events_without_launch", "long"),
        Field("kernel_time_us", "double"),
        Field("idle_time_us", "double"),
        Field("compute_time_us", "double"),
        Field("non_compute_time_us", "double"),
        Field("idle_pct", optional("double"), default=None),
        Field("compute_pct", optional("double"), default=None),
        Field("non_compute_pct", optional("double"), default=None),
        Field("communication_time_us", "double"),
        Field("comp_comm_overlap_us", "double"),
        Field("comp_comm_overlap_pct", optional("double"), default=None),
        Field("idle_by_stream", array(STREAM_IDLE)),
        Field("launches", "long"),
        Field("launch_delay_mean_us", optional("double"), default=None),
        Field("launch_delay_max_us", optional("double"), default=None),
        Field("launch_delay_total_us", "double"),
        Field("cpu_duration_mean_us", optional("double"), default=None),
        Field("gpu_duration_mean_us", optional("double"), default=None),
        Field("short_kernels", "long"),
        Field("short_kernel_gpu_us", "double"),
        Field("runtime_outliers", "long"),
        Field("launch_delay_outliers", "long"),
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
        Field("analyzed_at", TIMESTAMP_MS),
        Field(
            "system",
            optional(PROFILE_SYSTEM_CONTEXT),
            "From the TraceEnd: what the host saw while the trace was captured.",
            since=2,
            default=None,
        ),
    ),
)
