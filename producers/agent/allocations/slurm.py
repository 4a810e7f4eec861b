"""Slurm's allocations on this node, as gpufleet's prolog and epilog record them for the agent.

Slurm runs the prolog (``gpufleet slurm prolog``) as root when it gives a job resources on a
node, and the epilog (``gpufleet slurm epilog``) when it takes them back. Both read the job
from their environment (``SLURM_JOB_ID``, ``SLURM_JOB_USER``, ``SLURM_JOB_ACCOUNT``,
``SLURM_JOB_PARTITION``, ``SLURM_JOB_GPUS``: the node's indexes of the job's GPUs) and ask the
controller for what the environment lacks (``producers.agent.allocations.slurm_facts``: QoS, name, time limit,
the array it belongs to, start and end times; in the epilog, how it ended), in a form no job
name can break. What they could not learn is named in the record (``Allocation.unknown``) and
written to standard error (slurmd's log). They write into one directory, which the agent reads
every tick (``SlurmAllocations``)::

    <dir>/0, <dir>/1, ...      one file per GPU index holding the ids of the jobs on it, one a
                               line: dcgm-exporter's HPC job mapping (--hpc-job-mapping-dir)
    <dir>/.jobs/<id>.json      the job's allocation on this node (the prolog)
    <dir>/.ended/<id>.json     the same with its end (the epilog), until the agent has spooled
                               the job's end

Times are the scheduler's (its StartTime and EndTime), never the script's clock: a time it
could not give stays unknown. An array task is the workflow ``slurm-<array>_<task>`` (as
``squeue`` shows it), its raw id the ``job_id``.

A prolog that fails drains the node in Slurm, so neither ever fails the job: what goes wrong is
written to standard error and the script exits 0.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import msgspec

from producers.agent.allocations.allocation import SLURM, Allocation, Allocations
from producers.agent.allocations.slurm_facts import JobFacts, SlurmReader
from schemas.validate_ids import SLURM_JOB_ID

log = logging.getLogger(__name__)

JOBS, ENDED = ".jobs", ".ended"
# An end the scheduler gives this far past the node's clock is taken as it is (the controller's
# and the node's clocks differ by a little); further, it cannot be an end and is unknown.
END_SKEW_MS = 5_000

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Allocation)


def slurm_time_ms(text: str | None) -> int | None:
    """A time as Slurm prints it by default (``2026-12-02T03:11:10``, local time), in epoch
    milliseconds; None for ``Unknown``, ``N/A`` and the like."""
    if not text:
        return None
    try:
        return int(time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")) * 1000)
    except ValueError:
        return None


def allocation_from_environment(env: Mapping[str, str], reader: SlurmReader | None = None,
                                ended: bool = False) -> Allocation:
    """The job a prolog (or, ``ended``, an epilog) runs for, from its environment and the
    scheduler. ValueError where the environment names no job."""
    job = env.get("SLURM_JOB_ID", "")
    if not SLURM_JOB_ID.fullmatch(job) or "_" in job:
        raise ValueError(f"SLURM_JOB_ID {job!r} is not a Slurm job id")
    gpus = env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or ""
    facts = (reader or SlurmReader()).read(job, ended=ended)
    unknown = list(facts.unknown)
    # The environment slurmd gives is the job's own: it wins, and makes a fact squeue lost known.
    owner = env.get("SLURM_JOB_USER") or facts.user
    team = env.get("SLURM_JOB_ACCOUNT") or facts.account
    partition = env.get("SLURM_JOB_PARTITION") or facts.partition
    for fact, value in (("user", owner), ("account", team), ("partition", partition)):
        if value is not None and fact in unknown:
            unknown.remove(fact)
    _disagree(facts, env)
    for why in facts.problems:
        log.warning("job %s: %s", job, why)
    display = facts.display_id or job
    return Allocation(
        scheduler=SLURM, job_id=job, workflow_id=f"slurm-{display}",
        gpus=tuple(g.strip() for g in gpus.split(",") if g.strip()),
        owner=owner, team=team, partition=partition, qos=env.get("SLURM_JOB_QOS") or facts.qos,
        name=env.get("SLURM_JOB_NAME") or facts.name, time_limit_s=facts.time_limit_s,
        nodes=env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or facts.nodes,
        cluster=env.get("SLURM_CLUSTER_NAME") or None,
        started_ms=facts.started_ms, ended_ms=facts.ended_ms if ended else None,
        unknown=tuple(f for f in unknown if ended or f not in ("end", "end_state")),
        problem="; ".join(facts.problems)[:1000] or None,
        end_state=facts.end_state if ended else None, exit_code=facts.exit_code if ended else None,
        exit_signal=facts.exit_signal if ended else None, cancelled_by=facts.cancelled_by if ended else None,
    )


def _disagree(facts: JobFacts, env: Mapping[str, str]) -> None:
    """The environment and the controller should agree; where they do not, say so."""
    for fact, key in (("user", "SLURM_JOB_USER"), ("account", "SLURM_JOB_ACCOUNT"),
                      ("partition", "SLURM_JOB_PARTITION")):
        said, known = env.get(key), getattr(facts, fact)
        if said and known and said != known:
            facts.problems.append(f"{key} is {said!r} but squeue says {known!r}: the environment's is kept")


class SlurmDirectory:
    """The directory the prolog and epilog write and the agent reads."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    # -- written by the prolog and the epilog (as root, one job at a time per call) ----------

    def started(self, allocation: Allocation, now_ms: int) -> None:
        """The prolog's record: the job's allocation, and its id in each of its GPUs' files.
        A start the scheduler did not give stays unknown (the agent then charges the job from
        its first sample, and says so)."""
        self._write(JOBS, allocation)
        for gpu in allocation.gpus:
            self._map(gpu, allocation.job_id, add=True)

    def ended(self, allocation: Allocation, now_ms: int) -> Allocation:
        """The epilog's record: the job's end as the scheduler gave it (unknown where it gave
        none, or one no end can be: in the future, or before the start), kept until the agent
        has spooled it; its GPUs' files no longer name it."""
        recorded = self._read(self.path / JOBS / f"{allocation.job_id}.json")
        if recorded is not None:
            allocation = merged(recorded, allocation)
        end = allocation.ended_ms
        why = None
        if end is not None and end > now_ms + END_SKEW_MS:
            why = f"the scheduler's end of job {allocation.job_id} is {(end - now_ms) / 1000:g} s in the future"
        elif end is not None and allocation.started_ms is not None and end < allocation.started_ms:
            why = f"the scheduler's end of job {allocation.job_id} is before its start"
        if why is not None:
            log.warning("%s: its end is unknown", why)
            allocation = msgspec.structs.replace(
                allocation, ended_ms=None, unknown=tuple(dict.fromkeys((*allocation.unknown, "end"))),
                problem="; ".join(p for p in (allocation.problem, why) if p))
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


def merged(prolog: Allocation, epilog: Allocation) -> Allocation:
    """The prolog's record with what the epilog knows better (the end, how it ended) and what
    the epilog learnt that the prolog could not: a fact is unknown only if neither knew it."""
    known = {f: getattr(epilog, f) for f in ("owner", "team", "partition", "qos", "name", "time_limit_s",
                                              "started_ms", "nodes") if getattr(prolog, f) is None}
    unknown = [f for f in prolog.unknown if f in epilog.unknown]
    unknown += [f for f in epilog.unknown if f in ("end", "end_state")]
    problem = "; ".join(dict.fromkeys(p for p in (prolog.problem, epilog.problem) if p)) or None
    return msgspec.structs.replace(
        prolog, **{f: v for f, v in known.items() if v is not None}, gpus=epilog.gpus or prolog.gpus,
        ended_ms=epilog.ended_ms, end_state=epilog.end_state, exit_code=epilog.exit_code,
        exit_signal=epilog.exit_signal, cancelled_by=epilog.cancelled_by,
        unknown=tuple(dict.fromkeys(unknown)), problem=problem[:1000] if problem else None)


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

