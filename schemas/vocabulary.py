"""The words of every report, defined once.

"Allocated", "start-up", "idle", "wasted" and the rest mean one thing in the fleet report,
``gpufleet goodput``, ``opportunities``, ``workflows``, the job report and the alerts, and each
is summed the same way: over the **closed windows** the worker emitted (``WorkflowWindow``, as
ClickHouse keeps them: ``workflow_windows`` FINAL and the goodput views over it), never over raw
samples, whose last minutes have no window yet. So the same data gives the same numbers through
every command (``tests/unit/gpufleet/test_vocabulary.py``). ``docs/vocabulary.md`` is this
module as a table for readers.

Every term is GPU-seconds (reports show GPU-hours): a sample counts for its interval times the
job's share of the GPU, and each allocated GPU-second falls in exactly one goodput bucket
(``streams.windows.goodput``).

One field keeps an older name on the wire: ``wasted_gpu_seconds`` of ``WorkflowWindow`` and
``WorkflowSummary`` is what this module calls **unused** (GPU-seconds times the share of time
the GPU was not busy). Reports call it that, never "wasted".
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.goodput_buckets import BUCKETS
from schemas.goodput_buckets import UNOBSERVED as UNOBSERVED_BUCKET
from schemas.validate_sample import FREE_CAPACITY

# Every bucket but productive, and but unobserved: time no sample stands for is neither used nor wasted.
WASTE_BUCKETS = tuple(b for b in BUCKETS if b not in ("productive", UNOBSERVED_BUCKET))


@dataclass(frozen=True)
class Term:
    name: str
    meaning: str
    sql: str  # summed over rows of workflow_windows or the goodput views (unallocated: the capacity views)


def _sum(*columns: str) -> str:
    return "sum(" + " + ".join(columns) + ")"


# Rows of jobs: the agents' pseudo-workflows for capacity no job held are not any job's. The
# sink keeps them in capacity_windows (and the capacity_hourly / capacity_daily views); JOBS
# still guards the jobs' tables against rows an older sink wrote there during an upgrade.
JOBS = "workflow_id NOT IN (" + ", ".join(f"'{n}'" for n in sorted(FREE_CAPACITY)) + ")"
FREE = "workflow_id IN (" + ", ".join(f"'{n}'" for n in sorted(FREE_CAPACITY)) + ")"

ALLOCATED = Term(
    "allocated",
    "GPU-seconds a job held, in its closed windows: from its first sample to its last (from the scheduler's start "
    "to its end, where a scheduler allocated it), whether the GPU worked or not, seen or not, times the job's "
    "share of each GPU. The sum of the goodput buckets (and of windows written before goodput, unclassified).",
    "sum(gpu_seconds)")
UNOBSERVED = Term(
    "unobserved",
    "allocated GPU-seconds no sample stands for: the scheduler says the job held the GPUs, and the host's agent "
    "was not running (killed, restarting, started after the job). Neither used nor wasted; judged by no alert.",
    "sum(unobserved_gpu_seconds)")
UNALLOCATED = Term(
    "unallocated",
    "GPU-seconds no job held: the scheduler gave the GPU to nobody (or, where the agent sees processes only, no "
    "process used it). Beside the allocated hours, never in them: its windows are kept in capacity_windows (and "
    "the capacity_hourly / capacity_daily views), never in workflow_windows.", "sum(gpu_seconds)")
CAPACITY = Term("capacity", "allocated + unallocated: every GPU-second the agents saw (workflow_windows and "
                "capacity_windows).", "sum(gpu_seconds)")
STARTUP = Term(
    "start-up",
    "allocated GPU-seconds before the job's GPUs first did any work, for at most 15 minutes after its first "
    "sample: loading, compiling, waiting for peers.", "sum(startup_gpu_seconds)")
IDLE = Term(
    "idle",
    "allocated GPU-seconds at 0 % utilisation after start-up: held and not used. A serving replica's: its "
    "GPU-seconds after start-up in windows in which it served no request (judged_windows), whatever its GPUs did.",
    "sum(idle_gpu_seconds)")
WASTED = Term(
    "wasted",
    "allocated GPU-seconds that did no productive work: unhealthy + start-up + idle + input-bound + low "
    "utilisation, i.e. allocated - productive (for windows written before goodput: none).",
    _sum(*(f"{b}_gpu_seconds" for b in WASTE_BUCKETS)))
PRODUCTIVE = Term("productive", "allocated GPU-seconds in none of the waste buckets. A serving replica's: its "
                  "GPU-seconds after start-up in windows in which it served requests (busy, headroom, or saturated: "
                  "its GPUs did the service's work, too few replicas did it), whatever its GPUs' utilisation.",
                  "sum(productive_gpu_seconds)")
GOODPUT = Term("goodput", "productive / observed allocated (allocated - unobserved, of the windows with buckets), "
               "in %.", "")
UNUSED = Term(
    "unused",
    "allocated GPU-seconds times the share of time the GPU was not busy (100 % - utilisation): a busy-but-light "
    "GPU is partly unused without being in a waste bucket. On the wire: wasted_gpu_seconds (an older name).",
    "sum(wasted_gpu_seconds)")
UTILISATION = Term(
    "utilisation",
    "the GPU's busy share (NVML utilisation), averaged over the allocated GPU-seconds samples stand for.",
    "sum(utilization_mean_pct * (gpu_seconds - unobserved_gpu_seconds)) / sum(gpu_seconds - unobserved_gpu_seconds)")

TERMS = (CAPACITY, ALLOCATED, UNALLOCATED, STARTUP, IDLE, WASTED, PRODUCTIVE, UNOBSERVED, GOODPUT, UNUSED,
         UTILISATION)


# A serving replica (``ServingWindow``, as ClickHouse keeps them: ``serving_windows`` FINAL) is also
# judged by its traffic; these sum its windows' GPU-seconds by what the traffic said of them. They
# are in the allocated GPU-seconds already, never added to them: its waterfall puts them in
# productive and idle by the same states (``judged_windows``, sinks/ddl_workflows.py).
SERVED = Term("served", "a serving replica's GPU-seconds in windows in which it served traffic within the queue "
                        "target (busy or headroom).", "sumIf(gpu_seconds, state IN ('BUSY', 'HEADROOM'))")
HEADROOM = Term("headroom", "a serving replica's GPU-seconds in windows whose traffic was below the capacity it "
                            "showed in its own busiest window, by more than the margin: spare capacity a service keeps "
                            "for its peaks, not waste.", "sumIf(gpu_seconds, state = 'HEADROOM')")
IDLE_REPLICA = Term("idle replica", "a serving replica's GPU-seconds in windows in which it served no request: held "
                                    "for no traffic.", "sumIf(gpu_seconds, state = 'IDLE')")
SATURATED = Term("saturated", "a serving replica's GPU-seconds in windows whose requests waited longer than the queue "
                              "target: the service had too few replicas.", "sumIf(gpu_seconds, state = 'SATURATED')")
REPLICAS_NEEDED = Term("replicas needed", "the fewest replicas of a service whose capacities (largest first) cover the "
                                          "requests a second of its busiest span, with the margin (gpufleet serving).",
                       "")
SERVING_TERMS = (SERVED, HEADROOM, IDLE_REPLICA, SATURATED, REPLICAS_NEEDED)


def wasted_seconds(window: dict) -> float:
    """A ``WorkflowWindow`` (or summary) dict's wasted GPU-seconds, as ``WASTED`` sums them."""
    return sum(window.get(f"{b}_gpu_seconds") or 0.0 for b in WASTE_BUCKETS)


def markdown_table(terms: tuple[Term, ...] = TERMS) -> str:
    """The terms as a table in docs/vocabulary.md (``TERMS``, and ``SERVING_TERMS``)."""
    rows = ["| term | meaning | summed in SQL as |", "|---|---|---|"]
    for t in terms:
        rows.append(f"| {t.name} | {t.meaning} | {f'`{t.sql}`' if t.sql else '—'} |")
    return "\n".join(rows) + "\n"
