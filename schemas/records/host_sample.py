"""HostSample: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import TIMESTAMP_MS, Field, Record, array, optional

WORKFLOW_HOST_USAGE = Record(
    "WorkflowHostUsage",
    fields=(
        Field("workflow_id", "string", "The workflow."),
        Field("processes", "int", "Its processes on the host."),
        Field("cpu_pct", "float", "CPU of the workflow's processes, in % of one core (400 = four cores busy)."),
        Field("rss_bytes", "long", "Their resident memory."),
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
        Field("event_time", TIMESTAMP_MS, "When the host was sampled."),
        Field("interval_ms", "int", "The time the sample stands for."),
        Field("host", "string", "The host."),
        Field("cpu_count", "int", "Logical CPUs of the host."),
        Field("cpu_pct", "float", "Host CPU utilisation, 0-100 over all cores."),
        Field("iowait_pct", optional("float"), "CPU time waiting on I/O, in percent.", default=None),
        Field("memory_used_bytes", "long", "Host memory in use."),
        Field("memory_total_bytes", "long", "Host memory in all."),
        Field("disk_read_bytes_per_s", optional("double"), "Disk bytes read a second.", default=None),
        Field("disk_write_bytes_per_s", optional("double"), "Disk bytes written a second.", default=None),
        Field("net_rx_bytes_per_s", optional("double"), "Network bytes received a second.", default=None),
        Field("net_tx_bytes_per_s", optional("double"), "Network bytes sent a second.", default=None),
        Field("workflows", array(WORKFLOW_HOST_USAGE), "What each workflow's processes on the host used."),
        Field("spool_dropped_total", "long", "Records the agent's full spool has dropped since it started."),
    ),
)
