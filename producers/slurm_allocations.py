"""Slurm's allocations on this node, as gpufleet's prolog and epilog record them for the agent.

Slurm runs the prolog (``gpufleet slurm prolog``) as root when it gives a job resources on a
node, and the epilog (``gpufleet slurm epilog``) when it takes them back. Both read the job
from their environment (``SLURM_JOB_ID``, ``SLURM_JOB_USER``, ``SLURM_JOB_ACCOUNT``,
``SLURM_JOB_PARTITION``, ``SLURM_JOB_GPUS``: the node's indexes of the job's GPUs) and ask
``squeue`` for what the environment lacks (name, QoS, time limit, start and end times). They
write into one directory, which the agent reads every tick (``SlurmAllocations``)::

    <dir>/0, <dir>/1, ...      one file per GPU index holding the ids of the jobs on it, one a
                               line: dcgm-exporter's HPC job mapping (--hpc-job-mapping-dir)
    <dir>/.jobs/<id>.json      the job's allocation on this node (the prolog)
    <dir>/.ended/<id>.json     the same with its end time (the epilog), until the agent has
                               spooled the job's end

A prolog that fails drains the node in Slurm, so neither ever fails the job: what goes wrong is
written to standard error (slurmd's log) and the script exits 0.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import msgspec

from producers.allocations import SLURM, Allocation, Allocations
from schemas.validate_ids import SLURM_JOB_ID

log = logging.getLogger(__name__)

JOBS, ENDED = ".jobs", ".ended"
_SEP = "\x1f"  # between squeue's fields: no job name or account holds it
_FIELDS = ("name", "qos", "time_limit", "start", "end", "nodes", "state")
_FORMAT = _SEP.join(("%j", "%q", "%l", "%S", "%e", "%N", "%T"))

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Allocation)

Squeue = Callable[[str], dict[str, str] | None]


def run_squeue(job_id: str, timeout_s: float = 5.0) -> dict[str, str] | None:
    """What ``squeue`` says of the job (name, QoS, time limit, start, end, nodes, state); None
    where it cannot say (no squeue here, the controller away: the record keeps what the
    environment gave)."""
    try:
        out = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", _FORMAT], capture_output=True,
                             text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("squeue for job %s: %s", job_id, exc)
        return None
    line = out.stdout.strip().splitlines()[:1]
    if out.returncode != 0 or not line:
        log.warning("squeue for job %s: %s", job_id, out.stderr.strip() or "no such job")
        return None
    values = line[0].split(_SEP)
    return dict(zip(_FIELDS, values)) if len(values) == len(_FIELDS) else None


def slurm_time_ms(text: str | None) -> int | None:
    """A time as Slurm prints it (``2026-12-02T03:11:10``, local time), in epoch milliseconds;
    None for ``Unknown``, ``N/A`` and the like."""
    if not text:
        return None
    try:
        return int(time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")) * 1000)
    except ValueError:
        return None


def time_limit_s(text: str | None) -> int | None:
    """A time limit as ``squeue`` prints it (``UNLIMITED``, ``5:00``, ``1:00:00``,
    ``2-00:00:00``), in seconds; None where there is none."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+(?::\d+){0,2})", (text or "").strip())
    if not m:
        return None
    seconds = 0
    for part in m.group(2).split(":"):
        seconds = seconds * 60 + int(part)
    return int(m.group(1) or 0) * 86400 + seconds


def allocation_from_environment(env: Mapping[str, str], squeue: Squeue | None = run_squeue) -> Allocation:
    """The job a prolog or epilog runs for, from its environment and ``squeue``. ValueError
    where the environment names no job."""
    job = env.get("SLURM_JOB_ID", "")
    if not SLURM_JOB_ID.fullmatch(job):
        raise ValueError(f"SLURM_JOB_ID {job!r} is not a Slurm job id")
    gpus = env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or ""
    known = (squeue(job) if squeue else None) or {}
    return Allocation(
        scheduler=SLURM, job_id=job, workflow_id=f"slurm-{job}",
        gpus=tuple(g.strip() for g in gpus.split(",") if g.strip()),
        owner=env.get("SLURM_JOB_USER") or None, team=env.get("SLURM_JOB_ACCOUNT") or None,
        partition=env.get("SLURM_JOB_PARTITION") or None,
        qos=env.get("SLURM_JOB_QOS") or _known(known.get("qos")),
        name=env.get("SLURM_JOB_NAME") or _known(known.get("name")),
        time_limit_s=time_limit_s(known.get("time_limit")),
        nodes=env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or _known(known.get("nodes")),
        cluster=env.get("SLURM_CLUSTER_NAME") or None,
        started_ms=slurm_time_ms(known.get("start")),
        ended_ms=slurm_time_ms(known.get("end")) if known.get("state") not in (None, "RUNNING", "CONFIGURING",
                                                                                  "PENDING") else None,
    )


def _known(value: str | None) -> str | None:
    return None if value in (None, "", "(null)", "N/A", "n/a") else value


class SlurmDirectory:
    """The directory the prolog and epilog write and the agent reads."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    # -- written by the prolog and the epilog (as root, one job at a time per call) ----------

    def started(self, allocation: Allocation, now_ms: int) -> None:
        """The prolog's record: the job's allocation, and its id in each of its GPUs' files."""
        if allocation.started_ms is None:
            allocation = msgspec.structs.replace(allocation, started_ms=now_ms)
        self._write(JOBS, allocation)
        for gpu in allocation.gpus:
            self._map(gpu, allocation.job_id, add=True)

    def ended(self, allocation: Allocation, now_ms: int) -> Allocation:
        """The epilog's record: the job's end (the scheduler's end time where it gave one, else
        now), kept until the agent has spooled it; its GPUs' files no longer name it."""
        recorded = self._read(self.path / JOBS / f"{allocation.job_id}.json")
        if recorded is not None:  # what the prolog knew, with what the epilog knows better
            allocation = msgspec.structs.replace(recorded, ended_ms=allocation.ended_ms,
                                                 gpus=allocation.gpus or recorded.gpus)
        end = allocation.ended_ms if allocation.ended_ms is not None and allocation.ended_ms <= now_ms else now_ms
        if allocation.started_ms is not None:
            end = max(end, allocation.started_ms)
        allocation = msgspec.structs.replace(allocation, ended_ms=end)
        self._write(ENDED, allocation)
        (self.path / JOBS / f"{allocation.job_id}.json").unlink(missing_ok=True)
        for gpu in allocation.gpus:
            self._map(gpu, allocation.job_id, add=False)
        return allocation

    def _write(self, folder: str, allocation: Allocation) -> None:
        where = self.path / folder
        where.mkdir(parents=True, exist_ok=True)
        tmp = where / f".{allocation.job_id}.{os.getpid()}.tmp"
        tmp.write_bytes(_encoder.encode(allocation))
        os.replace(tmp, where / f"{allocation.job_id}.json")  # the agent never reads half a record

    def _map(self, gpu: str, job_id: str, add: bool) -> None:
        """Add or remove ``job_id`` in the GPU's file, under a lock: jobs that share a GPU start
        and end at the same time."""
        if not re.fullmatch(r"[0-9]{1,4}", gpu):
            return  # dcgm-exporter names GPUs by index
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.path / gpu, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            jobs = [j for j in f.read().split() if j != job_id] + ([job_id] if add else [])
            f.seek(0)
            f.truncate()
            f.write("".join(f"{j}\n" for j in jobs))
        if not jobs:
            (self.path / gpu).unlink(missing_ok=True)

    # -- read by the agent ------------------------------------------------------------------

    def _read(self, path: Path) -> Allocation | None:
        try:
            return _decoder.decode(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("%s is no allocation record (%s): skipped", path, exc)
            return None

    def records(self, folder: str) -> list[Allocation]:
        try:
            names = sorted(e.name for e in os.scandir(self.path / folder)
                           if e.name.endswith(".json") and not e.name.startswith("."))
        except FileNotFoundError:
            return []
        out = [self._read(self.path / folder / name) for name in names]
        return [a for a in out if a is not None and f"{a.job_id}.json" in names]


RACY_NS = 2_000_000_000


class SlurmAllocations:
    """The agent's view of the directory: the jobs on this node now, and those that ended.
    Records are written whole and renamed into place, so a folder whose modification time did
    not change holds the same records: most ticks read two folders' times and nothing else.
    A time within the last ``RACY_NS`` may not have moved for a change made since (file times
    are coarser than a prolog is quick), so such a folder is read again (as git does for its
    index)."""

    scheduler = SLURM

    def __init__(self, path: str | Path) -> None:
        self.directory = SlurmDirectory(path)
        self._paths = {folder: str(self.directory.path / folder) for folder in (JOBS, ENDED)}
        self._seen: dict[str, tuple[int, list[Allocation]]] = {}  # folder -> (its mtime, its records)

    def read(self, now_ms: int) -> Allocations:
        return Allocations(tuple(self._records(JOBS)), tuple(self._records(ENDED)))

    def _records(self, folder: str) -> list[Allocation]:
        try:
            stamp = os.stat(self._paths[folder]).st_mtime_ns
        except FileNotFoundError:
            self._seen.pop(folder, None)
            return []
        seen = self._seen.get(folder)
        if seen is None or seen[0] != stamp or time.time_ns() - stamp < RACY_NS:
            seen = self._seen[folder] = (stamp, self.directory.records(folder))
        return seen[1]

    def forget(self, ended: Iterable[Allocation]) -> None:
        for a in ended:
            (self.directory.path / ENDED / f"{a.job_id}.json").unlink(missing_ok=True)
        self._seen.pop(ENDED, None)  # (a folder's time can stay the same within its clock's resolution)

