"""What the scheduler allocated on this host: which job holds which GPU, from the scheduler
itself rather than from the processes on the GPU.

A GPU a job was given and never opened has no process: without the scheduler's word it looks
like free capacity, and it is the largest loss in the clusters our users run. An
``AllocationSource`` (Slurm's prolog and epilog records, ``producers.agent.allocations.slurm``; the
kubelet's pod resources, ``producers.agent.allocations.kubelet``) says each tick which jobs hold which
GPUs, and which have ended since; ``gpus_of`` maps the scheduler's names of GPUs (Slurm's
indexes, device plugins' UUIDs, MIG UUIDs) to the GPUs NVML reports.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import msgspec

SLURM, KUBERNETES = "slurm", "kubernetes"


class Allocation(msgspec.Struct, frozen=True, kw_only=True):
    """One job's resources on this host, as its scheduler gave them."""

    scheduler: str  # SLURM or KUBERNETES
    job_id: str  # the scheduler's id: Slurm's job id, the pod's UID
    workflow_id: str  # slurm-<id>, k8s-pod-<uid>: as processes of the job are attributed
    gpus: tuple[str, ...]  # as the scheduler names them here: indexes ("0"), or UUIDs ("GPU-…", "MIG-…")
    owner: str | None = None
    team: str | None = None
    partition: str | None = None
    qos: str | None = None
    name: str | None = None
    time_limit_s: int | None = None
    nodes: str | None = None
    cluster: str | None = None
    started_ms: int | None = None  # when the scheduler gave it its resources
    # The service it is a replica of, where its labels declare it a serving replica (a pod's:
    # ``KubeletAllocations.serving_labels``): judged by its traffic from its first window.
    service: str | None = None
    ended_ms: int | None = None  # when it gave them back (set on the allocations that ended)
    # The facts the scheduler could not be asked (``producers.agent.allocations.slurm_facts.FACTS``: "qos", "end", ...),
    # and why: the enforcement ladders hold a job whose exemptions depend on one of them.
    unknown: tuple[str, ...] = ()
    problem: str | None = None
    # How it ended (the epilog's): COMPLETED, CANCELLED (by whom), TIMEOUT, FAILED (exit code),
    # PREEMPTED, NODE_FAIL, OUT_OF_MEMORY, ...
    end_state: str | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    cancelled_by: str | None = None


class Allocations(msgspec.Struct, frozen=True):
    """A source's answer for one tick: the jobs holding resources now, and the jobs that
    released them since the last answer (each told once, with its end time)."""

    current: tuple[Allocation, ...] = ()
    ended: tuple[Allocation, ...] = ()


class AllocationSource(Protocol):
    scheduler: str

    def read(self, now_ms: int) -> Allocations: ...

    def forget(self, ended: Iterable[Allocation]) -> None:
        """The ends in ``ended`` are spooled: they need not be told again (after a restart)."""


class GpuRef(Protocol):
    index: int
    uuid: str
    parent_uuid: str | None
    minor_number: int | None


def gpus_of(allocation: Allocation, gpus: list[GpuRef]) -> list[str]:
    """The UUIDs of the GPUs (as NVML reports them, MIG instances included) that ``allocation``
    names. A UUID names that GPU or MIG instance; a whole GPU's UUID also names its MIG
    instances. An index names the GPU whose device file is ``/dev/nvidia<minor>`` with the
    index-th smallest minor number (how Slurm numbers the GPUs of its ``gres.conf``, in the
    order of their device files), or NVML's index where NVML gives no minor number."""
    physical = sorted({(g.minor_number if g.minor_number is not None else g.index, g.index) for g in gpus})
    out: list[str] = []
    for ref in allocation.gpus:
        named = [g.uuid for g in gpus if ref in (g.uuid, g.parent_uuid)]
        if named:
            out += named
        elif ref.isdigit() and int(ref) < len(physical):
            index = physical[int(ref)][1]
            out += [g.uuid for g in gpus if g.index == index]
    return list(dict.fromkeys(out))


def holders(allocations: Iterable[Allocation], gpus: list[GpuRef]) -> dict[str, list[Allocation]]:
    """GPU UUID -> the jobs allocated it (several where the scheduler shares a GPU)."""
    out: dict[str, list[Allocation]] = {}
    for a in allocations:
        for uuid in gpus_of(a, gpus):
            out.setdefault(uuid, []).append(a)
    return out
