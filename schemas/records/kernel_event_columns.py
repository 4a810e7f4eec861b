"""KernelEventColumns: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import Field, Record, array, optional
from schemas.records.kernel_event import EVENT_KIND

EVENT_EXTRAS = Record(
    "EventExtras",
    fields=(
        Field("row", "int", "The event's index in the columns."),
        Field("bytes", optional("long"), "A copy's or set's size.", default=None),
        Field(
            "bandwidth_gbps",
            optional("double"),
            "A copy's or set's bandwidth as the profiler measured it.",
            default=None,
        ),
        Field(
            "memcpy_kind",
            optional("string"),
            "e.g. HtoD, DtoH, DtoD; Pageable or Pinned where the trace says.",
            default=None,
        ),
        Field(
            "trace_order",
            optional("long"),
            "A copy's or set's position among the trace file's kept events.",
            default=None,
        ),
        Field("flops", optional("long"), "An operator's FLOPs, where the profiler counted them.", default=None),
        Field("precision", optional("string"), "That operator's precision, from its inputs' types.", default=None),
        Field("op_bytes", optional("long"), "The bytes that operator moves at least.", default=None),
    ),
)


KERNEL_EVENT_COLUMNS = Record(
    "KernelEventColumns",
    versions={
        1: ("Consecutive events of one profiler trace (one rank), column by column: field X holds the X of every "
            "event, in start-time order (KernelEvent v3's fields; trace, workflow and rank once). The events' seq "
            "are first_seq, first_seq + 1, ...; a trace's messages follow each other in seq order, then its "
            "TraceEnd. Names and categories are given once each in strings and referred to by index. Keyed by "
            "trace_id like KernelEvent. The trace stage decodes and analyses whole columns instead of a record "
            "per event."),
    },
    fields=(
        Field("trace_id", "string", "The trace they belong to."),
        Field("workflow_id", "string", "The workflow profiled."),
        Field("rank", "int", "The trace's rank."),
        Field("first_seq", "long", "The seq of the first event (KernelEvent.seq), from 0."),
        Field("strings", array("string"), "The distinct names and categories of these events, each once."),
        Field("kind", array(EVENT_KIND), "What each event is (a column)."),
        Field("cat", array("int"), "The profiler's category, as an index into strings."),
        Field("name", array("int"), "The event's name, as an index into strings."),
        Field("ts", array("long"), "Start, microseconds."),
        Field("dur", array("long"), "Duration, microseconds (may be 0)."),
        Field("stream", array("int"), "CUDA stream; -1 for CPU-side events."),
        Field("device", array("int"), "The GPU each ran on (a column)."),
        Field("correlation", array("long"), "Links a runtime call to the GPU event it launched; -1 if none."),
        Field("tid", array("long"), "The CPU thread of a CPU-side event; -1 on the GPU side."),
        Field(
            "extras",
            array(EVENT_EXTRAS),
            "The fields few events have (copies, sets, operators that count their FLOPs), by row.",
        ),
    ),
)
