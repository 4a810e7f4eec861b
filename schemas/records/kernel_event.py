"""KernelEvent: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import Enum, Field, Record, array, optional

EVENT_KIND = Enum(
    "EventKind",
    ("kernel", "memcpy", "memset", "sync", "runtime", "cpu_op", "annotation", "other"),
)


KERNEL_EVENT = Record(
    "KernelEvent",
    versions={
        1: ("One event of a profiler trace (one rank), as the trace analysis needs it; times in whole "
            "microseconds after HTA's rounding. Published in start-time order, seq counting from 0, then a "
            "TraceEnd."),
        2: ("One event of a profiler trace (one rank), as the trace analysis needs it; times in whole "
            "microseconds after HTA's rounding. Published in start-time order, seq counting from 0, then a "
            "TraceEnd. v2 adds the bandwidth the profiler measured for a copy or set, the CPU thread of an event, "
            "and the FLOPs, precision and bytes of an operator that counts them (the roofline)."),
        3: ("One event of a profiler trace (one rank), as the trace analysis needs it; times in whole "
            "microseconds after HTA's rounding. Published in start-time order, seq counting from 0, then a "
            "TraceEnd. v2 adds the bandwidth the profiler measured for a copy or set, the CPU thread of an event, "
            "and the FLOPs, precision and bytes of an operator that counts them (the roofline). v3 adds a copy's "
            "or set's place in the trace file (equal times are taken in the file's order)."),
    },
    fields=(
        Field("trace_id", "string", "The trace it belongs to."),
        Field("workflow_id", "string", "The workflow profiled."),
        Field("rank", "int", "The trace's rank."),
        Field("seq", "long", "Position in the trace's event stream, from 0."),
        Field("kind", EVENT_KIND, "What the event is (a kernel, a copy, a memset, a sync, a runtime call ...)."),
        Field("cat", "string", "The profiler's category, as written in the trace."),
        Field("name", "string", "Its name in the trace."),
        Field("ts", "long", "Start, microseconds."),
        Field("dur", "long", "Duration, microseconds (may be 0)."),
        Field("stream", "int", "CUDA stream; -1 for CPU-side events."),
        Field("device", "int", "The GPU it ran on.", default=-1),
        Field("correlation", "long", "Links a runtime call to the GPU event it launched; -1 if none."),
        Field("bytes", optional("long"), "Bytes a copy or memset moved.", default=None),
        Field(
            "bandwidth_gbps",
            optional("double"),
            ("A copy's or set's bandwidth as the profiler measured it (its 'memory bandwidth (GB/s)'), from the "
             "unrounded duration."),
            since=2,
            default=None,
        ),
        Field(
            "memcpy_kind",
            optional("string"),
            "e.g. HtoD, DtoH, DtoD; Pageable or Pinned where the trace says.",
            default=None,
        ),
        Field("grid", optional(array("int")), "A kernel's grid.", default=None),
        Field("block", optional(array("int")), "A kernel's block.", default=None),
        Field(
            "tid",
            "long",
            "The CPU thread of a CPU-side event (a named thread as a number of its own); -1 on the GPU side.",
            since=2,
            default=-1,
        ),
        Field(
            "flops",
            optional("long"),
            "An operator's FLOPs, where the profiler counted them (with_flops=True).",
            since=2,
            default=None,
        ),
        Field(
            "precision",
            optional("string"),
            "That operator's precision (fp32, bf16, ...), from its inputs' types.",
            since=2,
            default=None,
        ),
        Field(
            "op_bytes",
            optional("long"),
            "The bytes that operator moves at least: its inputs and, where its shape follows from them, its output.",
            since=2,
            default=None,
        ),
        Field(
            "trace_order",
            optional("long"),
            ("A copy's or set's position among the trace file's kept events, from 0 (the memory bandwidth summary "
             "counts copies that end in the same microsecond in this order); null for other events."),
            since=3,
            default=None,
        ),
    ),
)
