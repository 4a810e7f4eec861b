"""Right-sizing from a job's totals, built by the same accumulation the worker does: fewer GPUs
for GPUs that sat idle, a MIG slice or a smaller model for a job that used little of a big GPU,
nothing for a job that fills what it has; each with the measurement it used."""

from __future__ import annotations

import pytest

from streams.windows.right_size import recommend
from streams.windows.summary import accumulate, summary
from streams.windows.workflow_state import WorkflowState
from tests.support.samples import BASE_MS, window

MIN = 60_000


def job_of(minutes: int = 60, **fields) -> WorkflowState:
    state = WorkflowState(partition=0)
    for m in range(minutes):
        accumulate(state, window(window_start=BASE_MS + m * MIN, window_end=BASE_MS + (m + 1) * MIN, **fields), [])
    return state


def by_kind(records) -> dict[str, dict]:
    return {r["kind"]: r for r in records}


def test_gpus_idle_for_most_of_the_job_are_given_back():
    state = job_of(gpu_count=4, gpu_seconds=240.0, zero_util_gpu_seconds=120.0, utilization_mean_pct=40.0,
                   memory_peak_fraction=0.9, sm_active_mean_pct=None, gpu_model="NVIDIA H100 80GB HBM3")
    rec = by_kind(recommend(state.job))["gpu_count"]
    assert (rec["current"], rec["recommended"]) == ("4 GPUs", "2 GPUs")
    assert rec["gpu_hours_freed"] == pytest.approx(2.0)  # 2 GPUs for the hour


def test_a_job_using_a_sliver_of_a_hopper_gpu_gets_the_mig_slice_that_holds_it():
    state = job_of(gpu_count=1, gpu_seconds=60.0, zero_util_gpu_seconds=0.0, utilization_mean_pct=30.0,
                   memory_peak_fraction=6 / 80, sm_active_mean_pct=8.0, gpu_model="NVIDIA H100 80GB HBM3")
    rec = by_kind(recommend(state.job))["mig"]
    assert rec["recommended"] == "MIG 1g.10gb of H100"
    assert "GPM SM activity" in rec["source"] and "NVML used memory" in rec["source"]
    assert rec["gpu_hours_freed"] == pytest.approx(6 / 7)


def test_without_gpm_utilisation_stands_in_and_the_record_says_so():
    state = job_of(gpu_count=1, gpu_seconds=60.0, zero_util_gpu_seconds=0.0, utilization_mean_pct=30.0,
                   memory_peak_fraction=20 / 80, sm_active_mean_pct=None, gpu_model="NVIDIA H100 80GB HBM3")
    rec = by_kind(recommend(state.job))["mig"]
    assert rec["recommended"] == "MIG 3g.40gb of H100"  # 24 GB and 36 % of the SMs with headroom
    assert "NVML utilisation (an upper bound)" in rec["source"]


def test_a_gpu_without_mig_points_to_a_smaller_model():
    state = job_of(gpu_count=1, gpu_seconds=60.0, zero_util_gpu_seconds=0.0, utilization_mean_pct=20.0,
                   memory_peak_fraction=10 / 48, sm_active_mean_pct=20.0, gpu_model="NVIDIA L40S")
    rec = by_kind(recommend(state.job))["gpu_model"]
    assert (rec["current"], rec["recommended"]) == ("NVIDIA L40S", "L4")


def test_a_job_that_fills_its_gpus_gets_no_gpu_recommendation_and_its_cpu_is_sized():
    state = job_of(gpu_count=8, gpu_seconds=480.0, zero_util_gpu_seconds=0.0, utilization_mean_pct=92.0,
                   memory_peak_fraction=0.95, sm_active_mean_pct=85.0, gpu_model="NVIDIA H100 80GB HBM3",
                   workflow_cpu_mean_pct=1200.0)
    records = recommend(state.job)
    assert [r["kind"] for r in records] == ["cpu_per_gpu"]
    assert records[0]["recommended"] == "2 CPU core(s) per GPU" and records[0]["gpu_hours_freed"] == 0.0


def test_the_summary_carries_them_and_an_unknown_model_gets_no_model_advice():
    state = job_of(gpu_count=1, gpu_seconds=60.0, zero_util_gpu_seconds=0.0, utilization_mean_pct=5.0,
                   memory_peak_fraction=0.05, sm_active_mean_pct=3.0, gpu_model="Some Future GPU")
    record = summary("wf-a", state, "ended", BASE_MS)
    assert record["right_size"] == recommend(state.job) and not any(
        r["kind"] in ("mig", "gpu_model") for r in record["right_size"])


def test_stored_recommendations_rank_fleet_wide_and_reach_the_job_report(chdb_client, database):
    """Through the ClickHouse table: ``gpufleet opportunities --by right-size`` sums what each
    kind would free, and the job report (``gpufleet workflow ID``) reads the stored row."""
    from gpufleet.reports.opportunities import opportunities
    from gpufleet.reports.workflows import workflow_summary
    from sinks.clickhouse_ddl import WORKFLOW_SUMMARIES_TABLE
    from sinks.job_report import job_report
    from sinks.write_clickhouse import ClickHouseWriter, Row

    idle = job_of(gpu_count=4, gpu_seconds=240.0, zero_util_gpu_seconds=120.0, memory_peak_fraction=0.9,
                  sm_active_mean_pct=None, gpu_model="NVIDIA H100 80GB HBM3", owner="ana", team="nlp")
    small = job_of(gpu_count=1, gpu_seconds=60.0, zero_util_gpu_seconds=0.0, memory_peak_fraction=6 / 80,
                   sm_active_mean_pct=8.0, gpu_model="NVIDIA H100 80GB HBM3", owner="bo", team="cv")
    records = [
        summary(wf, state, "ended", BASE_MS + 3_600_000) for wf, state in (("wf-idle", idle), ("wf-small", small))
    ]
    writer = ClickHouseWriter(chdb_client, database)
    writer.ensure_tables()
    assert writer.insert(WORKFLOW_SUMMARIES_TABLE, [Row(0, i, r) for i, r in enumerate(records)]) == []

    columns, rows = opportunities(chdb_client, database, by="right-size", since="all")
    got = {cause: (hours, n, top) for cause, hours, n, top in rows}
    assert columns == ["cause", "gpu_hours", "workflows", "top_workflows"]
    assert got == {"right_size:gpu_count": (2.0, 1, ["wf-idle: 2 GPUs"]),
                   "right_size:mig": (pytest.approx(6 / 7, abs=1e-3), 1, ["wf-small: MIG 1g.10gb of H100"])}

    stored, _ = workflow_summary(chdb_client, database, "wf-small")
    text, page = job_report(stored)
    assert "What to ask for next time:" in text
    assert "- MIG 1g.10gb of H100 instead of NVIDIA H100 80GB HBM3: peak memory 6.0 GB of 80" in text
    assert "GPM SM activity" in text and "MIG 1g.10gb" in page


def test_memory_is_judged_by_the_allocator_where_the_job_reports_it():
    """NVML sees the 70 GB PyTorch's caching allocator reserved; the job's own peak is 6 GB:
    through the window and the job's totals, the advice follows the allocator, and says so."""
    from tests.support.samples import sample
    from tests.support.windows import close_one

    def one_minute(**fields):
        return close_one([sample(event_time=BASE_MS + t * 1000, gpu_model="NVIDIA H100 80GB HBM3",
                                 memory_used_bytes=70 << 30, memory_total_bytes=80 << 30, sm_active_pct=8.0,
                                 **fields) for t in range(60)])

    reported, silent = WorkflowState(partition=0), WorkflowState(partition=0)
    accumulate(reported, one_minute(allocator_peak_bytes=6 << 30, allocator_reserved_bytes=70 << 30), [])
    accumulate(silent, one_minute(), [])
    assert reported.job["alloc_peak"] == pytest.approx(6 / 80) and "alloc_peak" not in silent.job
    rec = by_kind(recommend(reported.job))["mig"]
    assert rec["recommended"] == "MIG 1g.10gb of H100" and "max_memory_allocated" in rec["source"]
    assert not any(r["kind"] in ("mig", "gpu_model") for r in recommend(silent.job))  # 70 GB fits nothing smaller


def test_host_memory_per_gpu_is_sized_from_the_workflows_resident_memory():
    from tests.support.samples import sample
    from tests.support.windows import close_one

    window = close_one([sample(event_time=BASE_MS + t * 1000, gpu_uuid=f"GPU-{i}", gpu_index=i,
                               workflow_memory_bytes=40 << 30) for t in range(60) for i in range(4)])
    assert window["host_memory_per_gpu_bytes"] == 10 << 30  # 40 GiB on the host, 4 GPUs
    state = WorkflowState(partition=0)
    accumulate(state, window, [])
    (rec,) = [r for r in recommend(state.job) if r["kind"] == "host_memory_per_gpu"]
    assert rec["recommended"] == "12 GiB of host memory per GPU" and "10.0 GiB per GPU" in rec["reason"]


def test_the_summary_carries_the_jobs_tensor_activity_and_model_mfu_and_the_report_shows_them():
    """Goodput (issue 18): the job-end report's MFU is the job's, weighted by GPU-seconds over
    its windows (tensor activity where GPM reads it; model MFU where the job reported its work)."""
    from sinks.job_report import job_report

    state = WorkflowState(partition=0)
    for m, (gpu_s, tensor, mfu) in enumerate([(60.0, 40.0, 30.0), (180.0, 20.0, None)]):
        accumulate(state, window(window_start=BASE_MS + m * MIN, window_end=BASE_MS + (m + 1) * MIN,
                                 gpu_seconds=gpu_s, tensor_active_mean_pct=tensor, model_mfu_pct=mfu), [])
    record = summary("wf-a", state, "ended", BASE_MS)
    assert record["tensor_active_mean_pct"] == pytest.approx((60 * 40 + 180 * 20) / 240)
    assert record["model_mfu_pct"] == pytest.approx(30.0)  # only the window that had it
    text, _ = job_report(record)
    assert "tensor cores active 25.0%" in text and "model FLOPs utilisation 30.0%" in text


def test_time_no_sample_stands_for_says_nothing_of_how_many_gpus_a_job_needs():
    # 2 GPUs for 100 s, one at 0 % while sampled; 25 s of each unobserved (the agent was down).
    job = {"gpu_seconds": 200.0, "unobserved_gpu_seconds": 50.0, "zero_util_gpu_seconds": 75.0, "max_gpus": 2,
           "util_weighted": 80.0 * 75.0}
    sizes = {r["kind"]: r for r in recommend(job)}
    assert sizes["gpu_count"]["recommended"] == "1 GPUs"
