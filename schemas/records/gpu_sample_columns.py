"""GpuSampleColumns: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import TIMESTAMP_MS, Field, Record, array, optional

GPU_SAMPLE_COLUMNS = Record(
    "GpuSampleColumns",
    versions={
        1: ("GPU samples of one workflow on one host, column by column: field X holds the X of every sample, in "
            "the same order (GpuSample v4's fields; host, workflow, owner and team once). All columns have one "
            "value per sample. A column is null when none of the samples reports that field; samples that report "
            "different sets of fields travel in different messages. Keyed by workflow_id like GpuSample. A stream "
            "worker decodes and aggregates whole columns instead of one record per sample: a third to a sixth of "
            "the decode time of the same samples in a GpuSampleBatch (benchmarks/bench_window_utilization.py)."),
        2: ("GPU samples of one workflow on one host, column by column: field X holds the X of every sample, in "
            "the same order (GpuSample v4's fields; host, workflow, owner and team once). All columns have one "
            "value per sample. A column is null when none of the samples reports that field; samples that report "
            "different sets of fields travel in different messages. Keyed by workflow_id like GpuSample. A stream "
            "worker decodes and aggregates whole columns instead of one record per sample: a third to a sixth of "
            "the decode time of the same samples in a GpuSampleBatch (benchmarks/bench_window_utilization.py). v2 "
            "adds model_tflops (GpuSample v5)."),
        3: ("GPU samples of one workflow on one host, column by column: field X holds the X of every sample, in "
            "the same order (GpuSample v4's fields; host, workflow, owner and team once). All columns have one "
            "value per sample. A column is null when none of the samples reports that field; samples that report "
            "different sets of fields travel in different messages. Keyed by workflow_id like GpuSample. A stream "
            "worker decodes and aggregates whole columns instead of one record per sample: a third to a sixth of "
            "the decode time of the same samples in a GpuSampleBatch (benchmarks/bench_window_utilization.py). v2 "
            "adds model_tflops (GpuSample v5). v3 adds the framework allocator's peaks and the workflow's host "
            "memory."),
        4: ("GPU samples of one workflow on one host, column by column: field X holds the X of every sample, in "
            "the same order (GpuSample v7's fields; host, workflow, owner and team once). All columns have one "
            "value per sample. A column is null when none of the samples reports that field; samples that report "
            "different sets of fields travel in different messages. Keyed by workflow_id like GpuSample. A stream "
            "worker decodes and aggregates whole columns instead of one record per sample: a third to a sixth of "
            "the decode time of the same samples in a GpuSampleBatch (benchmarks/bench_window_utilization.py). v2 "
            "adds model_tflops (GpuSample v5). v3 adds the framework allocator's peaks and the workflow's host "
            "memory. v4 adds foreign_workflow_id: on a GPU the scheduler allocated to this workflow, the workflow "
            "of a process of another one that runs there."),
    },
    fields=(
        Field("host", "string", "The host all the samples come from."),
        Field("workflow_id", "string", "The workflow all the samples belong to (the message key)."),
        Field("owner", optional("string"), "Of the workflow, as on each GpuSample.", default=None),
        Field("team", optional("string"), "Of the workflow, as on each GpuSample.", default=None),
        Field("event_time", array(TIMESTAMP_MS), "When the sample was taken (UTC)."),
        Field("interval_ms", array("int"), "Sampling interval this sample stands for; GPU-seconds are summed from it."),
        Field("gpu_index", array("int"), "The GPU's index on its host (NVML's). (a column: one per sample)"),
        Field("gpu_uuid", array("string"), "The GPU's UUID (a MIG instance's own UUID). (a column: one per sample)"),
        Field("gpu_model", array("string"), "The GPU's model, as NVML names it. (a column: one per sample)"),
        Field("utilization_pct", array("float"), "Share of the interval in which a kernel ran, 0-100."),
        Field(
            "memory_utilization_pct",
            optional(array("float")),
            "Null when no sample of the batch reports it.",
            default=None,
        ),
        Field(
            "memory_used_bytes",
            optional(array("long")),
            "Null when no sample of the batch reports it.",
            default=None,
        ),
        Field(
            "memory_total_bytes",
            optional(array("long")),
            "Null when no sample of the batch reports it.",
            default=None,
        ),
        Field("power_watts", optional(array("float")), "Null when no sample of the batch reports it.", default=None),
        Field("temperature_c", optional(array("float")), "Null when no sample of the batch reports it.", default=None),
        Field("sm_clock_mhz", optional(array("int")), "Null when no sample of the batch reports it.", default=None),
        Field(
            "share",
            optional(array("float")),
            ("Fraction of the GPU attributed to this workflow (1 when it is the only user); GPU-seconds are "
             "interval x share. Null when no sample of the batch reports it."),
            default=None,
        ),
        Field(
            "process_count",
            optional(array("int")),
            "The workflow's processes on this GPU. Null when no sample of the batch reports it.",
            default=None,
        ),
        Field(
            "process_memory_bytes",
            optional(array("long")),
            "GPU memory those processes hold. Null when no sample of the batch reports it.",
            default=None,
        ),
        Field(
            "process_sm_util_pct",
            optional(array("float")),
            ("SM utilisation of those processes (NVML per-process samples). Null when no sample of the batch "
             "reports it."),
            default=None,
        ),
        Field(
            "power_limit_watts",
            optional(array("float")),
            "Null when no sample of the batch reports it.",
            default=None,
        ),
        Field(
            "energy_joules_total",
            optional(array("double")),
            "The GPU's energy counter since the driver loaded. Null when no sample of the batch reports it.",
            default=None,
        ),
        Field("sm_clock_max_mhz", optional(array("int")), "Null when no sample of the batch reports it.", default=None),
        Field("mem_clock_mhz", optional(array("int")), "Null when no sample of the batch reports it.", default=None),
        Field(
            "mem_clock_max_mhz",
            optional(array("int")),
            "Null when no sample of the batch reports it.",
            default=None,
        ),
        Field(
            "clock_event_reasons",
            optional(array("long")),
            "NVML clock-event (throttle) reason bitmask. Null when no sample of the batch reports it.",
            default=None,
        ),
        Field(
            "pcie_tx_bytes_per_s",
            optional(array("long")),
            "Null when no sample of the batch reports it.",
            default=None,
        ),
        Field(
            "pcie_rx_bytes_per_s",
            optional(array("long")),
            "Null when no sample of the batch reports it.",
            default=None,
        ),
        Field(
            "ecc_uncorrected_volatile",
            optional(array("long")),
            "Null when no sample of the batch reports it.",
            default=None,
        ),
        Field(
            "remapped_rows_uncorrectable",
            optional(array("int")),
            "Null when no sample of the batch reports it.",
            default=None,
        ),
        Field(
            "remapped_rows_pending",
            optional(array("boolean")),
            "Null when no sample of the batch reports it.",
            default=None,
        ),
        Field(
            "sm_active_pct",
            optional(array("float")),
            "GPM (Hopper and newer): share of SMs busy. Null when no sample of the batch reports it.",
            default=None,
        ),
        Field(
            "sm_occupancy_pct",
            optional(array("float")),
            "GPM: warps resident vs the maximum. Null when no sample of the batch reports it.",
            default=None,
        ),
        Field(
            "tensor_active_pct",
            optional(array("float")),
            "GPM: share of time any tensor pipe was busy. Null when no sample of the batch reports it.",
            default=None,
        ),
        Field(
            "dram_bw_pct",
            optional(array("float")),
            "GPM: DRAM bandwidth used vs the peak. Null when no sample of the batch reports it.",
            default=None,
        ),
        Field(
            "parent_gpu_uuid",
            optional(array("string")),
            "For a MIG instance: the physical GPU. Null when no sample of the batch reports it.",
            default=None,
        ),
        Field("mig_gi_id", optional(array("int")), "Null when no sample of the batch reports it.", default=None),
        Field("mig_ci_id", optional(array("int")), "Null when no sample of the batch reports it.", default=None),
        Field("xids", array(array("int")), "XID errors NVML reported since the previous sample."),
        Field(
            "workflow_cpu_pct",
            optional(array("float")),
            ("CPU of the workflow's processes on this host (their children included), in % of one core. Null when "
             "no sample of the batch reports it."),
            default=None,
        ),
        Field(
            "host_iowait_pct",
            optional(array("float")),
            "The host's CPU time waiting for I/O, 0-100. Null when no sample of the batch reports it.",
            default=None,
        ),
        Field(
            "rank",
            optional(array("int")),
            ("The lowest distributed rank (RANK, else SLURM_PROCID) of the workflow's processes on this GPU. Null "
             "when no sample of the batch reports it."),
            default=None,
        ),
        Field(
            "model_tflops",
            optional(array("float")),
            ("TFLOPS of model work the job reported for its process on this GPU (the profiling hook's "
             "report_throughput: 6 x parameters x tokens/s, or the job's own FLOPs/s), divided among the GPUs the "
             "process uses; null where the job reports none."),
            since=2,
            default=None,
        ),
        Field(
            "allocator_peak_bytes",
            optional(array("long")),
            ("Peak bytes the job's framework allocator held in use for its process on this GPU (PyTorch's "
             "torch.cuda.max_memory_allocated, reported by the profiling hook's report_memory), divided among the "
             "GPUs the process uses: what the job needs, where NVML's used memory also counts what the allocator "
             "reserved and keeps cached; null where the job reports none. Null when no sample of the batch "
             "reports it."),
            since=3,
            default=None,
        ),
        Field(
            "allocator_reserved_bytes",
            optional(array("long")),
            ("Peak bytes the framework allocator reserved from the GPU for its process "
             "(torch.cuda.max_memory_reserved), divided among the GPUs the process uses; null where the job "
             "reports none. Null when no sample of the batch reports it."),
            since=3,
            default=None,
        ),
        Field(
            "workflow_memory_bytes",
            optional(array("long")),
            ("Resident memory of the workflow's processes on this host, in bytes (the agent's per-workflow host "
             "counters); the same on each of the workflow's GPUs of the host; null where not measured. Null when "
             "no sample of the batch reports it."),
            since=3,
            default=None,
        ),
        Field(
            "foreign_workflow_id",
            optional(array("string")),
            ("On a GPU the scheduler allocated to this workflow, the workflow of a process that is not this "
             "workflow's running there (the lowest pid's). Null when no sample of the batch has one."),
            since=4,
            default=None,
        ),
    ),
)
