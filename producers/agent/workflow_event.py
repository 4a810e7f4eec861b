"""A workflow's event on this host (``WorkflowEvent``: started, heartbeat, ended), from what its
processes' environment said of it (``ProcessInfo``) and what the scheduler gave it here
(``Allocation``): where both say, the scheduler's word wins."""

from __future__ import annotations

from collections.abc import Iterable

from producers.agent.allocations.allocation import Allocation
from producers.agent.gpus.attribute_process import ProcessInfo


def declared_service(info: ProcessInfo | None, job: Allocation | None) -> str | None:
    """The service a workflow is declared a replica of: by its allocation's labels, else by its
    processes' environment; None where neither says."""
    return (job.service if job is not None else None) or (info.service if info is not None else None)


def workflow_event(wf: str, kind: str, now: int, host: str, cluster: str | None, info: ProcessInfo | None,
                   job: Allocation | None, gpus: Iterable[str], pids: Iterable[int]) -> dict:
    """The ``WorkflowEvent`` record of ``wf`` on ``host`` at ``now``."""
    info = info or ProcessInfo(0, wf)
    event = {
        "workflow_id": wf, "event": kind, "event_time": now, "host": host,
        "owner": info.owner, "team": info.team, "gpu_uuids": sorted(gpus), "pids": sorted(pids),
        "cmdline": info.cmdline, "framework": info.framework, "framework_version": info.framework_version,
        "scheduler_job_id": info.scheduler_job_id, "attribution": info.source,
        "model": info.model, "service": info.service, "cluster": cluster, "scheduler_qos": info.qos,
        "scheduler_partition": info.partition, "scheduler": None, "job_name": None, "time_limit_s": None,
        "nodes": None, "allocated_at": None, "scheduler_unknown": [], "scheduler_problem": None,
        "end_state": None, "exit_code": None, "exit_signal": None, "cancelled_by": None,
    }
    if job is not None:
        event.update(owner=job.owner or info.owner, team=job.team or info.team, scheduler_job_id=job.job_id,
                     scheduler_qos=job.qos or info.qos, scheduler_partition=job.partition or info.partition,
                     cluster=cluster or job.cluster, scheduler=job.scheduler, job_name=job.name,
                     time_limit_s=job.time_limit_s, nodes=job.nodes, allocated_at=job.started_ms,
                     attribution=f"allocation:{job.scheduler}", scheduler_unknown=list(job.unknown),
                     scheduler_problem=job.problem, service=declared_service(info, job))
        if kind == "ENDED":
            event.update(end_state=job.end_state, exit_code=job.exit_code, exit_signal=job.exit_signal,
                         cancelled_by=job.cancelled_by)
    return event
