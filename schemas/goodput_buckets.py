"""The goodput buckets, in the order a sample is judged (``streams.windows.goodput`` says what each
means): part of the wire contract, since ``WorkflowWindow`` (v5) and ``WorkflowSummary`` (v2)
carry ``<bucket>_gpu_seconds`` and ``<bucket>_joules`` for each."""

BUCKETS = ("unhealthy", "startup", "idle", "input_bound", "low_util", "productive")
SECONDS_FIELDS = tuple(f"{b}_gpu_seconds" for b in BUCKETS)
JOULES_FIELDS = tuple(f"{b}_joules" for b in BUCKETS)
