"""GpuSample: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import OWNER, TEAM, TIMESTAMP_MS, Field, Record, array, optional

GPU_SAMPLE = Record(
    "GpuSample",
    versions={
        1: "One GPU at one instant, as a host agent saw it. Fields a GPU does not report are null.",
        2: ("One GPU (or MIG instance) at one instant, for one workflow using it. Fields a GPU does not report "
            "are null. v2 adds the host agent's NVML fields; v1 records read as v2 with these null."),
        3: ("One GPU (or MIG instance) at one instant, for one workflow using it. Fields a GPU does not report "
            "are null. v2 added the host agent's NVML fields; v3 adds the workflow's CPU on the host and the "
            "host's I/O wait, so that streams can tell an input- or CPU-bound job on the same partition as its "
            "GPU samples."),
        4: ("One GPU (or MIG instance) at one instant, for one workflow using it. Fields a GPU does not report "
            "are null. v2 added the host agent's NVML fields; v3 adds the workflow's CPU on the host and the "
            "host's I/O wait, so that streams can tell an input- or CPU-bound job on the same partition as its "
            "GPU samples. v4 adds the rank of the workflow's process on the GPU, so a straggler is named by its "
            "rank."),
        5: ("One GPU (or MIG instance) at one instant, for one workflow using it. Fields a GPU does not report "
            "are null. v2 added the host agent's NVML fields; v3 adds the workflow's CPU on the host and the "
            "host's I/O wait, so that streams can tell an input- or CPU-bound job on the same partition as its "
            "GPU samples. v4 adds the rank of the workflow's process on the GPU, so a straggler is named by its "
            "rank. v5 adds model_tflops: the model FLOPs/s a job reports, for its model FLOPs utilisation."),
        6: ("One GPU (or MIG instance) at one instant, for one workflow using it. Fields a GPU does not report "
            "are null. v2 added the host agent's NVML fields; v3 adds the workflow's CPU on the host and the "
            "host's I/O wait, so that streams can tell an input- or CPU-bound job on the same partition as its "
            "GPU samples. v4 adds the rank of the workflow's process on the GPU, so a straggler is named by its "
            "rank. v5 adds model_tflops: the model FLOPs/s a job reports, for its model FLOPs utilisation. v6 "
            "adds the framework allocator's peaks (allocator_peak_bytes, allocator_reserved_bytes) and the "
            "workflow's host memory (workflow_memory_bytes)."),
        7: ("One GPU (or MIG instance) at one instant, for one workflow using it. Fields a GPU does not report "
            "are null. v2 added the host agent's NVML fields; v3 adds the workflow's CPU on the host and the "
            "host's I/O wait, so that streams can tell an input- or CPU-bound job on the same partition as its "
            "GPU samples. v4 adds the rank of the workflow's process on the GPU, so a straggler is named by its "
            "rank. v5 adds model_tflops: the model FLOPs/s a job reports, for its model FLOPs utilisation. v6 "
            "adds the framework allocator's peaks (allocator_peak_bytes, allocator_reserved_bytes) and the "
            "workflow's host memory (workflow_memory_bytes). v7 adds foreign_workflow_id: on a GPU the scheduler "
            "allocated to this workflow, the workflow of a process of another one that runs there."),
    },
    fields=(
        Field("event_time", TIMESTAMP_MS, "When the sample was taken (UTC)."),
        Field("interval_ms", "int", "Sampling interval this sample stands for; GPU-seconds are summed from it."),
        Field("host", "string", "The host the GPU is in."),
        Field("gpu_index", "int", "The GPU's index on its host (NVML's)."),
        Field("gpu_uuid", "string", "The GPU's UUID (a MIG instance's own UUID)."),
        Field("gpu_model", "string", "The GPU's model, as NVML names it."),
        Field("workflow_id", "string", "The workflow holding this GPU."),
        OWNER,
        TEAM,
        Field("utilization_pct", "float", "Share of the interval in which a kernel ran, 0-100."),
        Field(
            "memory_utilization_pct",
            optional("float"),
            "NVML's memory (bandwidth) utilisation over the sample period.",
            default=None,
        ),
        Field("memory_used_bytes", optional("long"), "Device memory in use.", default=None),
        Field("memory_total_bytes", optional("long"), "Device memory in all.", default=None),
        Field("power_watts", optional("float"), "Power draw.", default=None),
        Field("temperature_c", optional("float"), "GPU temperature, Celsius.", default=None),
        Field("sm_clock_mhz", optional("int"), "SM clock.", default=None),
        Field(
            "share",
            optional("float"),
            ("Fraction of the GPU attributed to this workflow (1 when it is the only user); GPU-seconds are "
             "interval x share."),
            since=2,
            default=None,
        ),
        Field("process_count", optional("int"), "The workflow's processes on this GPU.", since=2, default=None),
        Field("process_memory_bytes", optional("long"), "GPU memory those processes hold.", since=2, default=None),
        Field(
            "process_sm_util_pct",
            optional("float"),
            "SM utilisation of those processes (NVML per-process samples).",
            since=2,
            default=None,
        ),
        Field("power_limit_watts", optional("float"), "The power limit in force.", since=2, default=None),
        Field(
            "energy_joules_total",
            optional("double"),
            "The GPU's energy counter since the driver loaded.",
            since=2,
            default=None,
        ),
        Field("sm_clock_max_mhz", optional("int"), "The SM clock's maximum.", since=2, default=None),
        Field("mem_clock_mhz", optional("int"), "Memory clock.", since=2, default=None),
        Field("mem_clock_max_mhz", optional("int"), "The memory clock's maximum.", since=2, default=None),
        Field(
            "clock_event_reasons",
            optional("long"),
            "NVML clock-event (throttle) reason bitmask.",
            since=2,
            default=None,
        ),
        Field("pcie_tx_bytes_per_s", optional("long"), "PCIe bytes sent a second.", since=2, default=None),
        Field("pcie_rx_bytes_per_s", optional("long"), "PCIe bytes received a second.", since=2, default=None),
        Field(
            "ecc_uncorrected_volatile",
            optional("long"),
            "Uncorrected ECC errors since the driver loaded.",
            since=2,
            default=None,
        ),
        Field(
            "remapped_rows_uncorrectable",
            optional("int"),
            "Rows remapped for uncorrectable errors.",
            since=2,
            default=None,
        ),
        Field(
            "remapped_rows_pending",
            optional("boolean"),
            "Whether a row remapping waits for a GPU reset.",
            since=2,
            default=None,
        ),
        Field("sm_active_pct", optional("float"), "GPM (Hopper and newer): share of SMs busy.", since=2, default=None),
        Field("sm_occupancy_pct", optional("float"), "GPM: warps resident vs the maximum.", since=2, default=None),
        Field(
            "tensor_active_pct",
            optional("float"),
            "GPM: share of time any tensor pipe was busy.",
            since=2,
            default=None,
        ),
        Field("dram_bw_pct", optional("float"), "GPM: DRAM bandwidth used vs the peak.", since=2, default=None),
        Field("parent_gpu_uuid", optional("string"), "For a MIG instance: the physical GPU.", since=2, default=None),
        Field("mig_gi_id", optional("int"), "The MIG GPU instance, for a MIG device.", since=2, default=None),
        Field("mig_ci_id", optional("int"), "The MIG compute instance, for a MIG device.", since=2, default=None),
        Field("xids", array("int"), "XID errors NVML reported since the previous sample.", since=2, default=[]),
        Field(
            "workflow_cpu_pct",
            optional("float"),
            "CPU of the workflow's processes on this host (their children included), in % of one core.",
            since=3,
            default=None,
        ),
        Field(
            "host_iowait_pct",
            optional("float"),
            "The host's CPU time waiting for I/O, 0-100.",
            since=3,
            default=None,
        ),
        Field(
            "rank",
            optional("int"),
            "The lowest distributed rank (RANK, else SLURM_PROCID) of the workflow's processes on this GPU.",
            since=4,
            default=None,
        ),
        Field(
            "model_tflops",
            optional("float"),
            ("TFLOPS of model work the job reported for its process on this GPU (the profiling hook's "
             "report_throughput: 6 x parameters x tokens/s, or the job's own FLOPs/s), divided among the GPUs the "
             "process uses; null where the job reports none."),
            since=5,
            default=None,
        ),
        Field(
            "allocator_peak_bytes",
            optional("long"),
            ("Peak bytes the job's framework allocator held in use for its process on this GPU (PyTorch's "
             "torch.cuda.max_memory_allocated, reported by the profiling hook's report_memory), divided among the "
             "GPUs the process uses: what the job needs, where NVML's used memory also counts what the allocator "
             "reserved and keeps cached; null where the job reports none."),
            since=6,
            default=None,
        ),
        Field(
            "allocator_reserved_bytes",
            optional("long"),
            ("Peak bytes the framework allocator reserved from the GPU for its process "
             "(torch.cuda.max_memory_reserved), divided among the GPUs the process uses; null where the job "
             "reports none."),
            since=6,
            default=None,
        ),
        Field(
            "workflow_memory_bytes",
            optional("long"),
            ("Resident memory of the workflow's processes on this host, in bytes (the agent's per-workflow host "
             "counters); the same on each of the workflow's GPUs of the host; null where not measured."),
            since=6,
            default=None,
        ),
        Field(
            "foreign_workflow_id",
            optional("string"),
            ("On a GPU the scheduler allocated to this workflow, the workflow of a process that is not this "
             "workflow's running there (the lowest pid's); null where none is, or the agent reads no allocations."),
            since=7,
            default=None,
        ),
    ),
)
