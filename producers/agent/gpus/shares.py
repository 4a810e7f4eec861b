"""Whose a GPU's processes are, and each workflow's share of the GPU: the host agent's
attribution of one GPU reading (``producers.agent.host_agent``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from producers.agent.allocations.allocation import KUBERNETES, Allocation
from producers.agent.gpus.attribute_process import UNATTRIBUTED, ProcessInfo


@dataclass
class ProcessGroups:
    """A GPU's processes by the workflow they count for, with the first process's information,
    the lowest rank, and a foreign workflow's id, per workflow."""

    processes: dict[str, list] = field(default_factory=dict)
    infos: dict[str, ProcessInfo] = field(default_factory=dict)
    ranks: dict[str, int] = field(default_factory=dict)
    foreign: str | None = None

    def add(self, wf: str, process, info: ProcessInfo) -> None:
        self.processes.setdefault(wf, []).append(process)
        self.infos.setdefault(wf, info)
        if info.rank is not None:
            self.ranks[wf] = min(info.rank, self.ranks.get(wf, info.rank))



def job_of(info: ProcessInfo, jobs: list[Allocation]) -> Allocation | None:
    """The job among those allocated a GPU that a process on it belongs to: the one its
    environment or cgroup names (by workflow or scheduler job id); a process that names no
    workflow belongs to the GPU's only job. On Kubernetes, where the pod's UID could not be
    learnt, a process in a pod's cgroup is the pod's: the device plugin shows a GPU to the
    containers it was given to alone. None: a foreign process."""
    for a in jobs:
        if info.workflow_id == a.workflow_id or (
            info.scheduler_job_id is not None and info.scheduler_job_id == a.job_id
        ):
            return a
    if len(jobs) == 1 and (info.workflow_id == UNATTRIBUTED or (
            jobs[0].scheduler == KUBERNETES and info.source == "k8s-cgroup" and "/" in jobs[0].job_id)):
        return jobs[0]
    return None


# Memory the driver itself keeps on an idle GPU; above it, some process holds memory we cannot see.
DRIVER_RESERVED = 1 << 30


def shares_of(groups: dict[str, list]) -> dict[str, float]:
    def total(key) -> dict[str, float]:
        return {wf: sum(key(p) or 0 for p in procs) for wf, procs in groups.items()}

    for key in (lambda p: p.sm_util_pct, lambda p: p.used_memory_bytes):
        weights = total(key)
        whole = sum(weights.values())
        if whole > 0 and all(w > 0 for w in weights.values()):
            return {wf: w / whole for wf, w in weights.items()}
    return {wf: 1.0 / len(groups) for wf in groups}


def int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)


def sum_or_none(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(sum(values)) if values else None
