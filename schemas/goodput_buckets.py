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

# A serving replica's window is judged by its traffic (``streams.serving``): the GPU-seconds (and
# joules) its GPUs' judgement put in these buckets go to productive where it served requests (busy,
# headroom or saturated: its GPUs did the service's work, whatever their utilisation), to idle
# where it served none; unhealthy, start-up and unobserved stay as its GPUs said, so that each
# GPU-second is still in one bucket. Every report reads it so: ClickHouse's ``judged_windows``
# (``sinks/ddl_workflows.py``) and the worker's job totals (``WorkflowSummary``).
REJUDGED = ("idle", "input_bound", "low_util", "productive")


def judged_by_traffic(window: dict, served: bool) -> dict:
    """``window`` with its buckets as a replica's traffic judges them (``served``: it served requests)."""
    out = dict(window)
    for kind in ("gpu_seconds", "joules"):
        pooled = sum(window.get(f"{b}_{kind}") or 0.0 for b in REJUDGED)
        for b in REJUDGED:
            out[f"{b}_{kind}"] = 0.0
        out[f"{'productive' if served else 'idle'}_{kind}"] = pooled
    return out
