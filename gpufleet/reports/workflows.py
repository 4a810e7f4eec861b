"""``gpufleet workflows`` and ``gpufleet workflow ID``: what a job owner asks, from ClickHouse.

The list: every workflow seen in the last ``--since`` with its owner, GPUs, utilisation in
its latest window and over the period, the GPU-hours it was allocated and wasted
(``schemas.vocabulary``), and its alerts still firing.
One workflow: its job report (``gpufleet.reports.goodput``: from its ``WorkflowSummary``, or
from its windows so far while it runs) and its timeline of windows and the alerts raised
along it.
"""

from __future__ import annotations

from clickhouse_connect.driver.client import Client

from gpufleet.sql import run_query
from schemas.vocabulary import ALLOCATED, JOBS, WASTED


def list_workflows(client: Client, database: str, since_minutes: float = 1440) -> tuple[list[str], list[tuple]]:
    return run_query(
        client,
        f"""
        WITH windows AS (
            SELECT * FROM {database}.judged_windows
            WHERE window_end >= (SELECT max(window_end) FROM {database}.workflow_windows)
                                - INTERVAL {int(since_minutes)} MINUTE
                  AND {JOBS}
        ),
        firing AS (
            SELECT workflow_id, groupArray(detector) AS detectors
            FROM {database}.alerts FINAL WHERE status = 'FIRING' GROUP BY workflow_id
        )
        SELECT w.workflow_id AS workflow, any(w.owner) AS owner, any(w.team) AS team,
               max(w.gpu_count) AS gpus,
               round(argMax(w.utilization_mean_pct, w.window_end), 1) AS util_now_pct,
               round(sum(w.utilization_mean_pct * (w.gpu_seconds - w.unobserved_gpu_seconds))
                     / sum(w.gpu_seconds - w.unobserved_gpu_seconds), 1) AS util_pct,
               round({ALLOCATED.sql} / 3600, 3) AS gpu_hours,
               round({WASTED.sql} / 3600, 3) AS wasted_gpu_hours,
               arrayStringConcat(arraySort(any(f.detectors)), ', ') AS firing_alerts
        FROM windows AS w LEFT JOIN firing AS f ON f.workflow_id = w.workflow_id
        GROUP BY w.workflow_id
        ORDER BY wasted_gpu_hours DESC, workflow
    """,
    )


def workflow_timeline(client: Client, database: str, workflow_id: str) -> tuple[list[str], list[tuple]]:
    """The workflow's windows, each with the alert transitions that fall in it (every one the
    alerts topic holds: ``alert_transitions``), and a last row for transitions after its last
    window (alerts resolved when it ended)."""
    columns, rows = run_query(client, f"""
        SELECT formatDateTime(w.window_start, '%%Y-%%m-%%d %%H:%%i') AS window, w.gpu_count AS gpus,
               round(w.utilization_mean_pct, 1) AS util_pct, round(w.utilization_p95_pct, 1) AS p95_pct,
               round(w.memory_peak_fraction * 100, 1) AS mem_peak_pct,
               round(({WASTED.sql.removeprefix("sum(")[:-1]}) / 3600, 3) AS wasted_gpu_hours,
               round(w.unobserved_gpu_seconds / 3600, 3) AS unobserved_gpu_hours,
               toUnixTimestamp64Milli(w.window_start) AS _start, toUnixTimestamp64Milli(w.window_end) AS _end
        FROM {database}.judged_windows AS w
        WHERE w.workflow_id = %(wf)s
        ORDER BY w.window_start
    """, {"wf": workflow_id})
    transitions = client.query(f"""
        SELECT toUnixTimestamp64Milli(window_end), detector, status
        FROM {database}.alert_transitions FINAL WHERE workflow_id = %(wf)s
        ORDER BY window_end, detector, status""", parameters={"wf": workflow_id}).result_rows
    if not rows:
        return columns[:-2] + ["alerts"], []
    start_at, end_at = columns.index("_start"), columns.index("_end")
    out, i = [], 0
    for row in rows:
        mine = []
        while i < len(transitions) and transitions[i][0] <= row[end_at]:
            mine.append(f"{transitions[i][1]} {transitions[i][2]}")
            i += 1
        out.append((*row[:start_at], ", ".join(mine)))
    if i < len(transitions):  # after its last window: resolved when it ended
        out.append(("(after)", *[None] * (start_at - 1), ", ".join(f"{d} {s}" for _, d, s in transitions[i:])))
    return columns[:start_at] + ["alerts"], out


_BUCKET_SUMS = ", ".join(f"sum(w.{b}_{unit}) AS {b}_{unit}" for b in (
    "unhealthy", "startup", "idle", "input_bound", "low_util", "productive") for unit in ("gpu_seconds", "joules"))


def workflow_summary(client: Client, database: str, workflow_id: str) -> tuple[dict, str]:
    """The workflow's ``WorkflowSummary`` as stored, or one made from its windows so far (a
    workflow that still runs: ``end_reason`` says so), and its cluster ('' if unknown)."""
    result = client.query(f"SELECT * FROM {database}.workflow_summaries FINAL WHERE workflow_id = %(wf)s",
                          parameters={"wf": workflow_id})
    if result.result_rows:
        summary = dict(zip(result.column_names, result.result_rows[0]))
    else:
        result = client.query(f"""
            SELECT %(wf)s AS workflow_id, any(w.owner) AS owner, any(w.team) AS team,
                   min(w.window_start) AS first_window_start, max(w.window_end) AS last_window_end,
                   'still running' AS end_reason, count() AS windows, max(w.gpu_count) AS max_gpus,
                   sum(w.gpu_seconds) AS gpu_seconds,
                   sum(w.utilization_mean_pct * (w.gpu_seconds - w.unobserved_gpu_seconds))
                       / sum(w.gpu_seconds - w.unobserved_gpu_seconds) AS utilization_mean_pct,
                   max(w.memory_peak_fraction) AS memory_peak_fraction, sum(w.energy_joules) AS energy_joules,
                   any(w.gpu_model) AS gpu_model, CAST([], 'Array(String)') AS alerts_fired,
                   sum(w.tensor_active_mean_pct * w.gpu_seconds) / sum(w.gpu_seconds) AS tensor_active_mean_pct,
                   sum(w.model_mfu_pct * w.gpu_seconds) / sum(w.gpu_seconds) AS model_mfu_pct,
                   {_BUCKET_SUMS}
            FROM {database}.judged_windows AS w WHERE w.workflow_id = %(wf)s""", parameters={"wf": workflow_id})
        summary = dict(zip(result.column_names, result.result_rows[0]))
    for k in ("first_window_start", "last_window_end"):
        summary[k] = int(summary[k].timestamp() * 1000)
    cluster = client.query(f"SELECT argMax(cluster, event_time) FROM {database}.workflows WHERE workflow_id = %(wf)s",
                           parameters={"wf": workflow_id}).result_rows
    summary["profile_split"] = profile_split(client, database, workflow_id)
    if not summary.get("service"):  # a replica: the service of its judged windows, else the one its events declare
        (served, declared), = client.query(f"""
            SELECT (SELECT argMax(service, window_start) FROM {database}.serving_windows FINAL
                    WHERE workflow_id = %(wf)s),
                   (SELECT argMax(service, event_time) FROM {database}.workflow_events
                    WHERE workflow_id = %(wf)s AND ifNull(service, '') != '')""",
            parameters={"wf": workflow_id}).result_rows
        summary["service"] = served or declared or None
    if summary.get("untouched_gpus") is None:  # still running, or summarised before WorkflowSummary v5
        summary["untouched_gpus"] = untouched_gpus(client, database, workflow_id)
    return summary, (cluster[0][0] or "") if cluster else ""


def untouched_gpus(client: Client, database: str, workflow_id: str) -> int | None:
    """The job's GPUs no process of it opened in any minute (``gpu_minutes``), None where no agent
    counted its processes."""
    (never, counted), = client.query(f"""
        SELECT countIf(most = 0), countIf(most >= 0) FROM (
            SELECT host, gpu_index, max(processes_max) AS most FROM {database}.gpu_minutes
            WHERE workflow_id = %(wf)s GROUP BY host, gpu_index)""", parameters={"wf": workflow_id}).result_rows
    return never if counted else None


def profile_split(client: Client, database: str, workflow_id: str) -> dict | None:
    """How the workflow's profiled GPU time divides (its complete trace analyses, every rank):
    shares of kernel compute, exposed communication (not overlapped with compute), other GPU
    work (copies, communication under compute), and the GPU idle between kernels while the host
    launched them; None where it was never profiled. The job report splits its productive
    GPU-hours by them (goodput, issue 18)."""
    (traces, span, idle, compute, non_compute, comm, overlap), = client.query(f"""
        SELECT count(), sum(kernel_time_us), sum(idle_time_us), sum(compute_time_us), sum(non_compute_time_us),
               sum(communication_time_us), sum(comp_comm_overlap_us)
        FROM {database}.trace_analyses FINAL WHERE workflow_id = %(wf)s AND NOT partial""",
        parameters={"wf": workflow_id}).result_rows
    if not traces or not span or span <= 0:  # (kernel time is the GPU's span: compute, non-compute and idle)
        return None
    exposed = min(non_compute, max(0.0, comm - overlap))  # communication not under compute
    return {"traces": traces, "compute": compute / span, "exposed_communication": exposed / span,
            "other": (non_compute - exposed) / span, "launch_overhead": idle / span}


def slurm_job(client: Client, database: str, job_id: str) -> tuple[str | None, list[tuple]]:
    """What ``gpufleet job JOB_ID`` shows: the workflow of a Slurm job or array task (``123`` or
    ``123_4``; a task's raw id names it too), or, where ``JOB_ID`` is an array's, None and its
    tasks: (workflow, raw job id, GPU-hours, goodput %, how it ended) each."""
    if "_" in job_id:
        return f"slurm-{job_id}", []
    rows = client.query(f"""
        SELECT workflow_id, argMax(scheduler_job_id, event_time) FROM {database}.workflow_events
        WHERE workflow_id = %(wf)s OR startsWith(workflow_id, %(tasks)s) OR scheduler_job_id = %(raw)s
        GROUP BY workflow_id ORDER BY workflow_id""",
        parameters={"wf": f"slurm-{job_id}", "tasks": f"slurm-{job_id}_", "raw": job_id}).result_rows
    tasks = [wf for wf, _ in rows if wf.startswith(f"slurm-{job_id}_")]
    if tasks:
        return None, array_tasks(client, database, tasks, dict(rows))
    if any(wf == f"slurm-{job_id}" for wf, _ in rows):
        return f"slurm-{job_id}", []
    alias = [wf for wf, raw in rows if raw == job_id]
    return (alias[0] if len(alias) == 1 else f"slurm-{job_id}"), []


def array_tasks(client: Client, database: str, tasks: list[str], raw: dict[str, str]) -> list[tuple]:
    totals = {r[0]: r[1:] for r in client.query(f"""
        SELECT workflow_id, round(sum(gpu_seconds) / 3600, 3),
               round(100 * sum(productive_gpu_seconds) / nullIf(sum(gpu_seconds - unobserved_gpu_seconds), 0), 1)
        FROM {database}.judged_windows WHERE workflow_id IN %(tasks)s GROUP BY workflow_id""",
        parameters={"tasks": tasks}).result_rows}
    ends = dict(client.query(f"""
        SELECT workflow_id, ifNull(end_state, end_reason) FROM {database}.workflow_summaries FINAL
        WHERE workflow_id IN %(tasks)s""", parameters={"tasks": tasks}).result_rows)
    return [(wf, raw.get(wf), *totals.get(wf, (0.0, None)), ends.get(wf, "running")) for wf in tasks]
