"""The goodput buckets, in the order a sample is judged (``streams.windows.goodput`` says what each
means), then ``unobserved``: the time the scheduler says a job held its GPUs and no sample came
(``UnobservedTime``), which no sample decides. Part of the wire contract, since
``WorkflowWindow`` (v5; v6 with unobserved) and ``WorkflowSummary`` (v2; v4) carry
``<bucket>_gpu_seconds`` and ``<bucket>_joules`` for each."""

OBSERVED_BUCKETS = ("unhealthy", "startup", "idle", "input_bound", "low_util", "productive")
UNOBSERVED = "unobserved"
BUCKETS = (*OBSERVED_BUCKETS, UNOBSERVED)
SECONDS_FIELDS = tuple(f"{b}_gpu_seconds" for b in BUCKETS)
JOULES_FIELDS = tuple(f"{b}_joules" for b in BUCKETS)
