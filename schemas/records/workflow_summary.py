"""WorkflowSummary: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import OWNER, TEAM, TIMESTAMP_MS, Field, Record, array, goodput_fields, optional

RIGHT_SIZE = Record(
    "RightSize",
    fields=(
        Field("kind", "string", "gpu_count, mig, gpu_model or cpu_per_gpu"),
        Field("current", optional("string"), "What the job asked for.", default=None),
        Field("recommended", "string", "What would have served it."),
        Field("reason", "string", "Why, with the figures."),
        Field("source", "string", "Which measurement it used (NVML used memory, GPM SM activity ...)."),
        Field("gpu_hours_freed", "double", "Over the run so far, had the job asked for it."),
    ),
)


WORKFLOW_SUMMARY = Record(
    "WorkflowSummary",
    versions={
        1: ("The efficiency record of one executed workflow, from its first to its last window; emitted once when "
            "it ends."),
        2: ("The efficiency record of one executed workflow, from its first to its last window; emitted once when "
            "it ends. v2 adds the job's goodput waterfall (its windows' buckets summed) and its GPUs' model."),
        3: ("The efficiency record of one executed workflow, from its first to its last window; emitted once when "
            "it ends. v2 adds the job's goodput waterfall (its windows' buckets summed) and its GPUs' model. v3 "
            "adds right_size (what the job should ask for next time, streams.right_size) and the job's mean "
            "tensor-core activity and model FLOPs utilisation."),
        4: ("The efficiency record of one executed workflow, from its first to its last window; emitted once when "
            "it ends. v2 adds the job's goodput waterfall (its windows' buckets summed) and its GPUs' model. v3 "
            "adds right_size (what the job should ask for next time, streams.right_size) and the job's mean "
            "tensor-core activity and model FLOPs utilisation. v4 adds the unobserved bucket and what the "
            "scheduler says of the job: its id, its start and end, and how it ended."),
        5: ("The efficiency record of one executed workflow, from its first to its last window; emitted once when "
            "it ends. v2 adds the job's goodput waterfall (its windows' buckets summed) and its GPUs' model. v3 "
            "adds right_size (what the job should ask for next time, streams.right_size) and the job's mean "
            "tensor-core activity and model FLOPs utilisation. v4 adds the unobserved bucket and what the "
            "scheduler says of the job: its id, its start and end, and how it ended. v5 adds untouched_gpus: the "
            "GPUs no process of the job ever opened."),
    },
    fields=(
        Field("workflow_id", "string", "The workflow (the record's key)."),
        OWNER,
        TEAM,
        Field("first_window_start", TIMESTAMP_MS, "The start of its first window."),
        Field("last_window_end", TIMESTAMP_MS, "The end of its last window."),
        Field("end_reason", "string", "Why it is known to have ended."),
        Field("windows", "int", "Its windows."),
        Field("max_gpus", "int", "The most GPUs it held in a window."),
        Field("gpu_seconds", "double", "Its allocated GPU-seconds, observed and unobserved (schemas/vocabulary.py)."),
        Field("active_gpu_seconds", "double", "GPU-seconds with utilisation above 0 %."),
        Field("wasted_gpu_seconds", "double", "Allocated GPU-seconds x (1 - utilisation)."),
        Field("zero_util_gpu_seconds", "double", "GPU-seconds at 0 % utilisation."),
        Field("throttled_gpu_seconds", "double", "GPU-seconds under a power or thermal clock limit."),
        Field("utilization_mean_pct", "double", "Mean utilisation, weighted by GPU-seconds."),
        Field(
            "memory_peak_fraction",
            optional("double"),
            "The highest device memory in use over the memory its GPUs have.",
            default=None,
        ),
        Field("energy_joules", optional("double"), "The energy its GPUs used.", default=None),
        Field("xid_count", "int", "XID errors its GPUs reported."),
        Field("gpu_model", optional("string"), "The model of the workflow's GPUs.", since=2, default=None),
        *goodput_fields(since=2),
        Field("alerts_fired", array("string"), "Detectors that fired during the job."),
        Field(
            "tensor_active_mean_pct",
            optional("double"),
            ("Mean tensor-core activity over the job (GPM, Hopper and later), weighted by GPU-seconds: the "
             "hardware MFU estimate; null where the GPUs report none."),
            since=3,
            default=None,
        ),
        Field(
            "model_mfu_pct",
            optional("double"),
            ("Model FLOPs utilisation over the job, from the model work it reported (the profiling hook's "
             "report_throughput) against its GPUs' bf16 dense peak, weighted by GPU-seconds; null where it "
             "reported none."),
            since=3,
            default=None,
        ),
        Field(
            "right_size",
            array(RIGHT_SIZE),
            ("What the job should ask for next time, from its whole run: fewer GPUs, a MIG slice, a smaller GPU "
             "model, CPU cores per GPU; each with the measurement it used and the GPU-hours following it would "
             "have freed."),
            since=3,
            default=[],
        ),
        Field("summarized_at", TIMESTAMP_MS, "When the summary was made (a later one replaces it)."),
        Field(
            "unobserved_gpu_seconds",
            "double",
            "GPU-seconds the job held that no sample stands for (part of gpu_seconds).",
            since=4,
            default=0.0,
        ),
        Field("unobserved_joules", "double", "Always 0.", since=4, default=0.0),
        Field(
            "scheduler",
            optional("string"),
            "The scheduler that allocated the job (slurm, kubernetes); null for a workflow its processes named.",
            since=4,
            default=None,
        ),
        Field(
            "scheduler_job_id",
            optional("string"),
            "The scheduler's own id of the job (Slurm's raw job id, also for an array task).",
            since=4,
            default=None,
        ),
        Field(
            "allocated_at",
            optional(TIMESTAMP_MS),
            "When the scheduler gave the job its resources (its StartTime).",
            since=4,
            default=None,
        ),
        Field(
            "ended_at",
            optional(TIMESTAMP_MS),
            "When the scheduler took them back (its EndTime); null where it did not say.",
            since=4,
            default=None,
        ),
        Field(
            "end_state",
            optional("string"),
            ("How the scheduler says the job ended: COMPLETED, CANCELLED, TIMEOUT, FAILED, PREEMPTED, NODE_FAIL, "
             "OUT_OF_MEMORY, BOOT_FAIL, DEADLINE."),
            since=4,
            default=None,
        ),
        Field("exit_code", optional("int"), "The job's exit code.", since=4, default=None),
        Field("exit_signal", optional("int"), "The signal that ended the job (0: none).", since=4, default=None),
        Field("cancelled_by", optional("string"), "Who cancelled the job, for a CANCELLED end.", since=4, default=None),
        Field(
            "untouched_gpus",
            optional("int"),
            ("GPUs the scheduler gave the job that no process of it ever opened, over its whole life (null: the "
             "agents did not count processes). Equal to max_gpus: the job never used a GPU at all (it ran on the "
             "CPU, or failed before CUDA started)."),
            since=5,
            default=None,
        ),
    ),
)
