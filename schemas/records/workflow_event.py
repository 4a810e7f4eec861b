"""WorkflowEvent: its fields and versions (``schemas.fields``)."""

from __future__ import annotations

from schemas.fields import OWNER, TEAM, TIMESTAMP_MS, Enum, Field, Record, array, optional

WORKFLOW_EVENT_TYPE = Enum(
    "WorkflowEventType",
    ("STARTED", "HEARTBEAT", "ENDED"),
)


# Each version's doc is the one before's, and what it adds (v4 says anew what a workflow's event
# is: a scheduler's allocation makes one too).
_PROCESSES = ("A workflow's processes appeared on (STARTED), are still on (HEARTBEAT) or left (ENDED) a host, with "
              "what the agent could learn about it.")
_ALLOCATIONS = ("A workflow appeared on (STARTED), is still on (HEARTBEAT) or left (ENDED) a host: its processes "
                "were seen there or, where the agent reads the scheduler's allocations, the scheduler gave it GPUs "
                "there, with what the agent could learn about it.")
_V2 = " v2 adds the model (from the job's environment) and the cluster (from the agent)."
_V3 = " v3 adds the scheduler's quality of service and partition (what enforcement ladders may exempt)."
_V4 = (" v4 adds what the scheduler allocated (the scheduler, the job's name, time limit and node list, when the "
       "allocation began on this host); an ENDED from the scheduler carries the scheduler's end time as its event "
       "time and also travels on the samples topic, after the job's last samples from the host, so that the "
       "worker can close the job's windows as soon as they are complete.")
_V5 = (" v5 adds what the scheduler could not be asked (scheduler_unknown, scheduler_problem) and, on an ENDED "
       "from the scheduler, how the job ended (end_state, exit_code, exit_signal, cancelled_by).")
_V6 = (" v6 adds the service the workflow is a replica of, where its labels or its environment declare it a "
       "serving replica.")


WORKFLOW_EVENT = Record(
    "WorkflowEvent",
    versions={
        1: _PROCESSES,
        2: _PROCESSES + _V2,
        3: _PROCESSES + _V2 + _V3,
        4: _ALLOCATIONS + _V2 + _V3 + _V4,
        5: _ALLOCATIONS + _V2 + _V3 + _V4 + _V5,
        6: _ALLOCATIONS + _V2 + _V3 + _V4 + _V5 + _V6,
    },
    fields=(
        Field("workflow_id", "string", "The workflow (the record's key)."),
        Field("event", WORKFLOW_EVENT_TYPE, "STARTED, HEARTBEAT or ENDED."),
        Field("event_time", TIMESTAMP_MS, "When the agent (or the scheduler) saw it."),
        Field("host", "string", "The host that tells it."),
        OWNER,
        TEAM,
        Field("gpu_uuids", array("string"), "The workflow's GPUs on the host."),
        Field("pids", array("int"), "Its processes on the GPUs."),
        Field("cmdline", optional("string"), "The command line of one of them.", default=None),
        Field(
            "framework",
            optional("string"),
            "The framework its processes run (pytorch, jax ...), where known.",
            default=None,
        ),
        Field("framework_version", optional("string"), "That framework's version.", default=None),
        Field("scheduler_job_id", optional("string"), "The scheduler's id of the job.", default=None),
        Field("attribution", "string", "How the workflow id was found: env:<KEY>, slurm-cgroup, k8s-cgroup, none."),
        Field(
            "model",
            optional("string"),
            "What the job trains or serves, from its environment (GPUFLEET_MODEL by default).",
            since=2,
            default=None,
        ),
        Field(
            "cluster",
            optional("string"),
            "The cluster the host belongs to (gpufleet agent --cluster).",
            since=2,
            default=None,
        ),
        Field(
            "scheduler_qos",
            optional("string"),
            "The scheduler's quality of service of the job (Slurm SLURM_JOB_QOS), where it has one.",
            since=3,
            default=None,
        ),
        Field(
            "scheduler_partition",
            optional("string"),
            "The scheduler's partition (queue) of the job (Slurm SLURM_JOB_PARTITION), where it has one.",
            since=3,
            default=None,
        ),
        Field(
            "scheduler",
            optional("string"),
            ("The allocation source that gave the workflow its GPUs on this host: slurm or kubernetes; null where "
             "the agent saw its processes only."),
            since=4,
            default=None,
        ),
        Field(
            "job_name",
            optional("string"),
            "The scheduler's name of the job (Slurm JobName, the pod's name).",
            since=4,
            default=None,
        ),
        Field(
            "time_limit_s",
            optional("long"),
            "The job's time limit in seconds, where the scheduler sets one.",
            since=4,
            default=None,
        ),
        Field(
            "nodes",
            optional("string"),
            "The job's nodes as the scheduler writes them (Slurm's node list).",
            since=4,
            default=None,
        ),
        Field(
            "allocated_at",
            optional(TIMESTAMP_MS),
            "When the scheduler gave the job its resources (Slurm StartTime; first seen in the kubelet's list).",
            since=4,
            default=None,
        ),
        Field(
            "scheduler_unknown",
            array("string"),
            ("The facts of the job its scheduler could not be asked (user, account, partition, qos, name, "
             "time_limit, start, end, end_state): the enforcement ladders act on no job whose exemptions depend "
             "on one of them."),
            since=5,
            default=[],
        ),
        Field(
            "scheduler_problem",
            optional("string"),
            "Why those facts are unknown, as the prolog or epilog found it.",
            since=5,
            default=None,
        ),
        Field(
            "end_state",
            optional("string"),
            ("On an ENDED from the scheduler: how the job ended (COMPLETED, CANCELLED, TIMEOUT, FAILED, "
             "PREEMPTED, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE)."),
            since=5,
            default=None,
        ),
        Field(
            "exit_code",
            optional("int"),
            "The job's exit code, as its scheduler's accounting keeps it.",
            since=5,
            default=None,
        ),
        Field("exit_signal", optional("int"), "The signal that ended the job (0: none).", since=5, default=None),
        Field(
            "cancelled_by",
            optional("string"),
            "Who cancelled the job (a user name), for a CANCELLED end.",
            since=5,
            default=None,
        ),
        Field(
            "service",
            optional("string"),
            ("The service the workflow is a replica of, where it is declared a serving replica: by its pod's labels "
             "(gpufleet.io/service, or what gpufleet agent --serving-labels names) or its processes' environment "
             "(GPUFLEET_SERVICE). The worker judges such a workflow by its traffic from its first window."),
            since=6,
            default=None,
        ),
    ),
)
