"""A scheduler's job at its edges on this host: its first sample reaches back to the scheduler's
start of it, and when the scheduler says it ended, a last sample runs from the agent's last
tick to that end (``producers.agent.host_agent``; ``producers.agent.hold_samples`` cuts what came after)."""

from __future__ import annotations

from producers.agent.allocations.allocation import Allocation, Allocations, holders
from producers.agent.gpus.reading import GpuReading

# What every GPU sample takes from its reading as it is.
READING_FIELDS = (
    "utilization_pct", "memory_utilization_pct", "memory_used_bytes", "memory_total_bytes", "power_watts",
    "temperature_c", "sm_clock_mhz", "power_limit_watts", "energy_joules_total", "sm_clock_max_mhz",
    "mem_clock_mhz", "mem_clock_max_mhz", "clock_event_reasons", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
    "ecc_uncorrected_volatile", "remapped_rows_uncorrectable", "remapped_rows_pending", "sm_active_pct",
    "sm_occupancy_pct", "tensor_active_pct", "dram_bw_pct", "mig_gi_id", "mig_ci_id",
)
BACKFILL_TICKS = 10


def first_interval(job: Allocation, last_tick: int | None, now: int, interval: int) -> int:
    """The interval of a job's first sample here: back to the scheduler's start of the
    allocation, which can lie before the last tick (the prolog runs after the start, and its
    record is read at the next tick), up to ``BACKFILL_TICKS`` intervals back; just the tick's
    interval where the agent has no last tick (it started after the job: the time before is
    unobserved, ``producers.agent.checkpoint``) or the scheduler gave no start; never back
    past the start."""
    if job.started_ms is None:
        return interval
    since = now - job.started_ms
    if last_tick is not None and 0 < since <= BACKFILL_TICKS * interval:
        return since
    return max(0, min(interval, since))


def final_samples(readings: list[GpuReading], allocated: Allocations, last_tick: int | None, now: int, host: str,
                  active: set[str] | dict) -> list[tuple[Allocation, list[dict]]]:
    """For each job that ended since the last tick: its GPUs' samples from the last tick to
    the scheduler's end time (none where the end came before that tick)."""
    out = []
    held = holders(allocated.ended, readings)
    for a in allocated.ended:
        last = []
        end = a.ended_ms if a.ended_ms is not None else now
        if last_tick is not None and end > last_tick and a.workflow_id in active:
            for r in readings:
                if any(j is a for j in held.get(r.uuid, ())):
                    last.append({
                        **{f: getattr(r, f) for f in READING_FIELDS},
                        "event_time": end, "interval_ms": min(end - last_tick, now - last_tick), "host": host,
                        "gpu_index": r.index, "gpu_uuid": r.uuid, "gpu_model": r.name, "workflow_id": a.workflow_id,
                        "owner": a.owner, "team": a.team, "share": 1.0 / len(held[r.uuid]), "process_count": None,
                        "utilization_pct": r.utilization_pct if r.utilization_pct is not None else 0.0,
                        "parent_gpu_uuid": r.parent_uuid, "xids": [],
                    })
        out.append((a, last))
    return out
