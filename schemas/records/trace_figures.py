"""The nested records of a ``TraceAnalysis``: each analysis' rows (idle per stream, kernel types and
top kernels, memory copies, collectives, operators' roofline, annotations, launch queues, steps)."""

from __future__ import annotations

from schemas.fields import Field, Record, array, optional

STREAM_IDLE = Record(
    "StreamIdle",
    fields=(
        Field("stream", "int", "The CUDA stream."),
        Field(
            "host_wait_us",
            "double",
            "Idle time on the stream while the host had launched nothing for it (HTA's HOST_WAIT).",
        ),
        Field(
            "kernel_wait_us",
            "double",
            ("Idle time between kernels launched back to back, shorter than HTA's kernel-wait threshold "
             "(KERNEL_WAIT)."),
        ),
        Field("other_us", "double", "The stream's other idle time (OTHER)."),
    ),
)


KERNEL_TYPE_TIME = Record(
    "KernelTypeTime",
    fields=(
        Field(
            "kernel_type",
            "string",
            ("COMPUTATION, COMMUNICATION or MEMORY, or two or three of them joined by 'overlapping' where they ran "
             "at once."),
        ),
        Field(
            "time_us",
            "double",
            "GPU time during which kernels of that type (and no other) ran, each type's intervals merged.",
        ),
        Field("pct", "double", "Share of the time of all kernel types, in percent."),
    ),
)


TOP_KERNEL = Record(
    "TopKernel",
    fields=(
        Field("kernel_type", "string", "The kernel's type: COMPUTATION, COMMUNICATION or MEMORY."),
        Field("name", "string", "The kernel's name, or 'others'."),
        Field("kernels", "int", "Distinct kernels in the row: 1, or how many kernels 'others' holds."),
        Field("launches", "long", "Times it was launched."),
        Field("time_us", "double", "Its total GPU time."),
        Field("min_us", "double", "Its shortest launch."),
        Field("max_us", "double", "Its longest launch."),
        Field("mean_us", "double", "Its mean launch."),
        Field("stddev_us", "double", "Sample standard deviation (n-1) of the launches' durations; 0 for one launch."),
    ),
)


MEMORY_COPY_KIND = Record(
    "MemoryCopyKind",
    fields=(
        Field("kind", "string", "Memcpy HtoD, Memcpy DtoH, Memcpy DtoD, Memcpy PtoP or Memset."),
        Field("copies", "long", "Copies (or memsets) of the kind."),
        Field("bytes", "long", "Bytes they moved."),
        Field("time_us", "double", "Their GPU time."),
        Field("achieved_gbps", optional("double"), "Bytes over GPU time of the kind's copies, GB/s.", default=None),
        Field(
            "bw_samples",
            "long",
            ("HTA's memory bandwidth summary: values of the kind's concurrent bandwidth after each change, zeros "
             "left out; their count, mean, std, min, quartiles, max."),
        ),
        Field("bw_mean_gbps", optional("double"), "Mean of the bandwidth summary's values, GB/s.", default=None),
        Field("bw_std_gbps", optional("double"), "Their standard deviation, GB/s.", default=None),
        Field("bw_min_gbps", optional("double"), "Their minimum, GB/s.", default=None),
        Field("bw_p25_gbps", optional("double"), "Their first quartile, GB/s.", default=None),
        Field("bw_p50_gbps", optional("double"), "Their median, GB/s.", default=None),
        Field("bw_p75_gbps", optional("double"), "Their third quartile, GB/s.", default=None),
        Field("bw_max_gbps", optional("double"), "Their maximum, GB/s.", default=None),
    ),
)


COLLECTIVE_LAUNCHES = Record(
    "CollectiveLaunches",
    fields=(
        Field("name", "string", "The collective's kernel name (NCCL)."),
        Field(
            "durations_us",
            array("double"),
            "Each launch's duration in launch order, at most 20,000: what the ranks' comparison reads.",
        ),
    ),
)


OPERATOR_ROOFLINE = Record(
    "OperatorRoofline",
    fields=(
        Field("name", "string", "The operator (aten::mm, aten::conv2d, ...)."),
        Field("calls", "long", "Its calls in the trace."),
        Field("flops", "long", "The FLOPs the profiler counted for them."),
        Field(
            "bytes",
            optional("long"),
            "Bytes moved at least (inputs, and outputs whose shape follows from them); null without shapes.",
            default=None,
        ),
        Field("gpu_time_us", "double", "GPU time of the kernels launched from inside the operator."),
        Field("precision", "string", "The precision its peak is read at (bf16, fp16, fp32, tf32, ...)."),
        Field("achieved_tflops", "double", "FLOPs over the GPU time of the kernels it launched, TFLOP/s."),
        Field(
            "achieved_gbps",
            optional("double"),
            "Bytes (its inputs and, for matrix and element-wise operators, its output) over that time, GB/s.",
            default=None,
        ),
        Field("intensity", optional("double"), "FLOPs per byte.", default=None),
        Field(
            "peak_tflops",
            optional("double"),
            "The GPU's dense peak at that precision (schemas/gpu_peaks.json).",
            default=None,
        ),
        Field("peak_gbps", optional("double"), "The GPU's memory bandwidth.", default=None),
        Field("bound", optional("string"), "compute or memory; null without bytes or peaks.", default=None),
        Field(
            "roof_tflops",
            optional("double"),
            "Its roof: the peak, or bandwidth times intensity where it is memory-bound.",
            default=None,
        ),
        Field("roof_pct", optional("double"), "Achieved over roof, in percent.", default=None),
        Field("at_stake_us", "double", "GPU time the operator would save at 70 % of its roof."),
    ),
)


ANNOTATION_TIME = Record(
    "AnnotationTime",
    fields=(
        Field("name", "string", "The record_function range, as the profiler projects it onto the GPU."),
        Field("kernels", "int", "Names in the row: 1, or how many 'others' holds."),
        Field("launches", "long", "Ranges."),
        Field("time_us", "double", "Its total GPU time."),
        Field("min_us", "double", "Its shortest occurrence on the GPU."),
        Field("max_us", "double", "Its longest."),
        Field("mean_us", "double", "Its mean."),
        Field("stddev_us", "double", "The standard deviation of its occurrences."),
    ),
)


STREAM_QUEUE = Record(
    "StreamQueue",
    fields=(
        Field("stream", "int", "The CUDA stream."),
        Field(
            "samples",
            "long",
            "Values the queue took (one after each launch or start on the stream): the summary's count.",
        ),
        Field(
            "mean",
            optional("double"),
            "Mean of the operations launched on the stream and not yet started.",
            default=None,
        ),
        Field("std", optional("double"), "Their standard deviation.", default=None),
        Field("min", optional("double"), "Their minimum.", default=None),
        Field("p25", optional("double"), "Their first quartile.", default=None),
        Field("p50", optional("double"), "Their median.", default=None),
        Field("p75", optional("double"), "Their third quartile.", default=None),
        Field("max", optional("double"), "Their maximum.", default=None),
        Field("blocked_us", "double", "Time the queue held at least 1024 operations: the host could not launch."),
    ),
)


STEP_TIMELINE = Record(
    "StepTimeline",
    fields=(
        Field("step", "string", "The profiler step (ProfilerStep#N)."),
        Field("cpu_us", "double", "The step's duration on the CPU."),
        Field("gpu_events", "long", "GPU events launched in the step."),
        Field("gpu_span_us", "double", "From the first start to the last end of the step's GPU events."),
        Field("gpu_busy_us", "double", "Time within their span when some of them ran."),
        Field("gpu_idle_us", "double", "Time within their span when none ran."),
        Field("compute_us", "double", "Time within their span when a computation kernel ran."),
    ),
)
