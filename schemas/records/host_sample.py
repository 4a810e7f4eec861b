"""HostSample: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import TIMESTAMP_MS, Field, Record, array, optional

WORKFLOW_HOST_USAGE = Record(
    "WorkflowHostUsage",
    fields=(
        Field("workflow_id", "string"),
        Field("processes", "int"),
        Field("cpu_pct", "float", "CPU of the workflow's processes, in % of one core (400 = four cores busy)."),
        Field("rss_bytes", "long"),
    ),
)


HOST_SAMPLE = Record(
    "HostSample",
    versions={
        1: ("A GPU host's whole-system metrics in one agent tick, and the CPU and memory of each workflow's "
            "processes (their children included), so that streams can tell a CPU- or input-bound job from a "
            "GPU-bound one."),
    },
    fields=(
        Field("event_time", TIMESTAMP_MS),
        Field("interval_ms", "int"),
        Field("host", "string"),
        Field("cpu_count", "int"),
        Field("cpu_pct", "float", "Host CPU utilisation, 0-100 over all cores."),
        Field("iowait_pct", optional("float"), default=None),
        Field("memory_used_bytes", "long"),
        Field("memory_total_bytes", "long"),
        Field("disk_read_bytes_per_s", optional("double"), default=None),
        Field("disk_write_bytes_per_s", optional("double"), default=None),
        Field("net_rx_bytes_per_s", optional("double"), default=None),
        Field("net_tx_bytes_per_s", optional("double"), default=None),
        Field("workflows", array(WORKFLOW_HOST_USAGE)),
        Field("spool_dropped_total", "long", "Records the agent's full spool has dropped since it started."),
    ),
)
