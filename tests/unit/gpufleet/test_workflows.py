"""The owner-facing commands' queries on the embedded ClickHouse, on data written by the sink's writer."""

import pytest

from gpufleet.reports.workflows import list_workflows, workflow_timeline
from sinks.clickhouse_ddl import ALERTS_TABLE, WORKFLOW_WINDOWS_TABLE
from sinks.write_clickhouse import ClickHouseWriter, Row
from tests.support.alerts import alert
from tests.support.samples import BASE_MS, window

MIN = 60_000


def test_list_and_timeline(chdb_client, database):
    writer = ClickHouseWriter(chdb_client, database)
    writer.ensure_tables()
    rows = []
    for m in range(3):
        rows.append(Row(0, m, window(workflow_id="wf-1", window_start=BASE_MS + m * MIN,
                                     window_end=BASE_MS + (m + 1) * MIN, utilization_mean_pct=10.0 + m,
                                     gpu_seconds=120.0, wasted_gpu_seconds=100.0, startup_gpu_seconds=40.0,
                                     low_util_gpu_seconds=60.0, productive_gpu_seconds=20.0)))
        rows.append(Row(0, 10 + m, window(workflow_id="wf-2", owner="bo", window_start=BASE_MS + m * MIN,
                                          window_end=BASE_MS + (m + 1) * MIN, utilization_mean_pct=90.0,
                                          gpu_seconds=60.0, wasted_gpu_seconds=6.0, low_util_gpu_seconds=0.0,
                                          productive_gpu_seconds=60.0)))
    assert writer.insert(WORKFLOW_WINDOWS_TABLE, rows) == []
    fired = {**alert("a1", "FIRING", True, "nlp", "alice@example.com"), "window_end": BASE_MS + 2 * MIN}
    assert writer.insert(ALERTS_TABLE, [Row(0, 0, fired)]) == []

    columns, listed = list_workflows(chdb_client, database)
    by = {r[0]: dict(zip(columns, r)) for r in listed}
    assert [r[0] for r in listed] == ["wf-1", "wf-2"]  # most waste first
    assert by["wf-1"]["util_now_pct"] == 12.0 and by["wf-1"]["util_pct"] == 11.0
    # wasted: the waste buckets (schemas.vocabulary), not the unused share (wasted_gpu_seconds on the wire)
    assert by["wf-1"]["gpu_hours"] == round(360 / 3600, 3) and by["wf-1"]["wasted_gpu_hours"] == round(300 / 3600, 3)
    assert by["wf-2"]["wasted_gpu_hours"] == 0 and by["wf-1"]["firing_alerts"] == "low_utilization"
    assert by["wf-2"]["firing_alerts"] == "" and by["wf-2"]["owner"] == "bo"

    columns, timeline = workflow_timeline(chdb_client, database, "wf-1")
    assert [r[columns.index("util_pct")] for r in timeline] == [10.0, 11.0, 12.0]
    assert [r[columns.index("wasted_gpu_hours")] for r in timeline] == [round(100 / 3600, 3)] * 3
    assert [r[columns.index("alerts")] for r in timeline] == ["", "low_utilization FIRING", ""]
    assert workflow_timeline(chdb_client, database, "x' OR 1=1 --")[1] == []


def test_a_profiled_jobs_productive_hours_are_split_by_what_its_profile_shows(chdb_client, database, tmp_path):
    """Goodput (issue 18): where a profile of the workflow exists, the report splits its
    productive GPU-hours into kernel compute, exposed communication, other GPU work and the
    host's launch overhead, in the shares its complete trace analyses measured."""
    from gpufleet.analyze import analyze_file
    from gpufleet.reports.workflows import workflow_summary
    from sinks.clickhouse_ddl import TRACE_ANALYSES_TABLE
    from sinks.job_report import job_report
    from tests.support.traces import kernel, runtime, write_trace

    writer = ClickHouseWriter(chdb_client, database)
    writer.ensure_tables()
    assert writer.insert(WORKFLOW_WINDOWS_TABLE, [Row(0, 0, window(workflow_id="wf-p", gpu_seconds=3600.0,
                                                                   productive_gpu_seconds=3600.0))]) == []
    # 60 us of compute, 20 of NCCL (10 of it under compute), 20 idle: a 100 us span
    path = write_trace(tmp_path / "t.json", [
        runtime("cudaLaunchKernel", 0, 1, corr=1), kernel("sm80_xmma_gemm", 0, 60, corr=1),
        runtime("cudaLaunchKernel", 1, 1, corr=2), kernel("ncclKernel_AllReduce_RING", 50, 20, corr=2, stream=8),
        runtime("cudaLaunchKernel", 2, 1, corr=3), kernel("sm80_xmma_gemm", 90, 10, corr=3)])
    assert writer.insert(TRACE_ANALYSES_TABLE, [Row(0, 0, analyze_file(path, workflow_id="wf-p"))]) == []

    summary, _ = workflow_summary(chdb_client, database, "wf-p")
    split = summary["profile_split"]
    assert split == {"traces": 1, "compute": pytest.approx(0.7), "exposed_communication": pytest.approx(0.1),
                     "other": pytest.approx(0.0), "launch_overhead": pytest.approx(0.2)}
    text, _ = job_report(summary)
    assert "The productive 1.00 GPU-hours, split as its profiles (1 trace(s)) spent the GPU's time:" in text
    assert "kernel compute" in text and "0.70 GPU-h   70.0%" in text
    assert "host launch overhead (GPU idle)" in text and "0.20 GPU-h   20.0%" in text
    # A workflow never profiled: no split, and the report says nothing of one.
    assert writer.insert(WORKFLOW_WINDOWS_TABLE, [Row(0, 1, window(workflow_id="wf-q"))]) == []
    plain, _ = workflow_summary(chdb_client, database, "wf-q")
    assert plain["profile_split"] is None and "split as its profiles" not in job_report(plain)[0]


def test_a_slurm_job_an_array_task_and_an_array_by_their_own_ids(chdb_client, database):
    """`gpufleet job 6_0` is the array task's (its workflow slurm-6_0), so is its raw id 7;
    `gpufleet job 6` lists the array's tasks (6 is also the last task's raw id, as Slurm numbers them)."""
    from gpufleet.reports.workflows import slurm_job
    from sinks.clickhouse_ddl import WORKFLOW_EVENTS_TABLE

    writer = ClickHouseWriter(chdb_client, database)
    writer.ensure_tables()
    jobs = {"slurm-6_0": "7", "slurm-6_1": "6", "slurm-9": "9"}
    events = [{"workflow_id": wf, "event": "STARTED", "event_time": BASE_MS, "host": "h", "owner": "ana",
               "team": "nlp", "gpu_uuids": [], "pids": [], "attribution": "allocation:slurm", "scheduler_job_id": raw}
              for wf, raw in jobs.items()]
    assert writer.insert(WORKFLOW_EVENTS_TABLE, [Row(0, i, e) for i, e in enumerate(events)]) == []
    half = {"gpu_seconds": 3600.0, "productive_gpu_seconds": 1800.0, "low_util_gpu_seconds": 1800.0}
    windows = [Row(0, i, window(workflow_id=wf, **half)) for i, wf in enumerate(jobs)]
    assert writer.insert(WORKFLOW_WINDOWS_TABLE, windows) == []
    assert slurm_job(chdb_client, database, "6_0") == ("slurm-6_0", [])
    assert slurm_job(chdb_client, database, "7") == ("slurm-6_0", [])  # a task's raw id
    assert slurm_job(chdb_client, database, "9") == ("slurm-9", [])
    workflow, tasks = slurm_job(chdb_client, database, "6")
    assert workflow is None and [(t[0], t[1], t[2], t[3]) for t in tasks] == [
        ("slurm-6_0", "7", 1.0, 50.0), ("slurm-6_1", "6", 1.0, 50.0)]
    assert slurm_job(chdb_client, database, "12") == ("slurm-12", [])  # nothing known: the report says so
