"""What the agent must remember across a restart (a crash, ``kill -9``, an upgrade), written
beside its spool after every tick: the workflows it has told the pipeline are running here (so a
restart continues them: no second STARTED), and for each job a scheduler allocated here, up to
when its spooled samples stand for its GPUs.

From that, on its first tick, the agent knows which of a job's GPU time no sample will ever
stand for: from where its samples stopped to where the new ones begin (or to the job's end,
where it ended meanwhile), and, for a job it never charged, from the scheduler's start of the
job to its first sample. That time is sent as ``UnobservedTime``: the job's, as the scheduler
says, in a bucket of its own (``streams.windows``), never judged as used or idle.

The file is replaced whole (written aside, then renamed), so a crash leaves the previous tick's.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec

from producers.agent.allocations.allocation import Allocation
from producers.agent.gpus.attribute_process import ProcessInfo

log = logging.getLogger(__name__)

FILE = "agent-state.json"
VERSION = 1


class Active(msgspec.Struct, kw_only=True):
    """A workflow the pipeline was told runs here (``host_agent._Active``)."""

    info: ProcessInfo | None = None
    gpus: list[str] = []
    pids: list[int] = []
    last_heartbeat_ms: int = 0
    allocation: Allocation | None = None


class Charged(msgspec.Struct, kw_only=True):
    """A scheduler's job charged here: its samples in the spool stand for its GPUs up to ``until``."""

    job_id: str
    until: int  # the end of the newest spooled sample of it (epoch ms)
    gpus: float  # its GPUs, each by its share (what a second of it is in GPU-seconds)
    gpu_uuids: list[str] = []
    owner: str | None = None
    team: str | None = None


class Checkpoint(msgspec.Struct, kw_only=True):
    v: int = VERSION
    host: str
    tick_ms: int  # the agent's last tick
    active: dict[str, Active] = {}
    charged: dict[str, Charged] = {}  # workflow id -> what its spooled samples cover


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Checkpoint)


def load(directory: Path, host: str) -> Checkpoint | None:
    """The checkpoint the agent of ``host`` left in ``directory``; None where there is none (a
    first start) or it cannot be used (said once, in the log: the jobs are then charged from
    their first sample, as a new agent would)."""
    path = Path(directory) / FILE
    try:
        checkpoint = _decoder.decode(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.warning("%s is no agent checkpoint (%s): starting without it", path, exc)
        return None
    if checkpoint.host != host:
        log.warning("%s was written by the agent of host %s, not %s: starting without it", path, checkpoint.host, host)
        return None
    return checkpoint


def save(directory: Path, checkpoint: Checkpoint) -> None:
    path = Path(directory) / FILE
    tmp = path.with_name(f".{FILE}.{os.getpid()}.tmp")
    tmp.write_bytes(_encoder.encode(checkpoint))
    os.replace(tmp, path)


def unobserved(workflow_id: str, host: str, job: Allocation, gpus: float, gpu_uuids: list[str], since: int,
               until: int, reason: str, now_ms: int) -> dict | None:
    """The ``UnobservedTime`` record of a job's GPUs from ``since`` to ``until`` (None: no time)."""
    if until <= since or gpus <= 0:
        return None
    return {"workflow_id": workflow_id, "host": host, "owner": job.owner, "team": job.team,
            "scheduler_job_id": job.job_id, "from_time": since, "to_time": until, "gpus": gpus,
            "gpu_uuids": sorted(gpu_uuids), "reason": reason, "event_time": now_ms}


class Coverage:
    """Up to when each allocated job's spooled samples stand for its GPUs, and the time they do
    not: the agent's bookkeeping for ``UnobservedTime`` and its checkpoint."""

    def __init__(self, host: str, restored: Checkpoint | None) -> None:
        self.host = host
        self.restored = restored  # the run before's, until the first tick has used it
        self.charged: dict[str, Charged] = dict(restored.charged) if restored else {}
        self.observing_since: int | None = None  # from when this run's samples stand for the GPUs

    def gaps(self, current: tuple[Allocation, ...], ended: tuple[Allocation, ...], samples: list[dict],
             charging: set[str], now: int) -> list[dict]:
        """``UnobservedTime`` of this tick: on the first tick after a restart, each job charged
        before it from where its spooled samples stopped to where this run's begin (or to its
        end, where it ended meanwhile); and each job charged for the first time, from the
        scheduler's start of it to when any agent here began sampling it."""
        first: dict[str, int] = {}
        for s in samples:
            begin = s["event_time"] - s["interval_ms"]
            if begin < first.get(s["workflow_id"], 2**62):
                first[s["workflow_id"]] = begin
        out = []
        restored = self.restored
        if restored is not None:
            ended_jobs = {a.workflow_id: a for a in ended}
            for wf, before in restored.charged.items():
                job = next((a for a in current if a.workflow_id == wf), None) or ended_jobs.get(wf)
                if job is None:
                    log.warning("%s: charged before the agent restarted, and neither allocated nor ended now: its "
                                "time since %d is not known", wf, before.until)
                    continue
                until = first.get(wf) if job.ended_ms is None else job.ended_ms
                record = unobserved(wf, self.host, job, before.gpus, before.gpu_uuids, before.until,
                                    until if until is not None else now, f"the agent on {self.host} was not running",
                                    now)
                if record is not None:
                    out.append(record)
        before = restored.charged if restored else {}
        for job in (*current, *ended):
            wf = job.workflow_id
            if job.job_id in charging or wf in self.charged or wf in before or job.started_ms is None:
                continue  # charged already, or no start to count from
            observing = self.observing_since if self.observing_since is not None else now
            if job.ended_ms is None:  # running: to where this run's samples of it begin, if it began before
                if wf not in first:
                    continue
                until = min(first[wf], observing)
                weight = sum(s["share"] for s in samples if s["workflow_id"] == wf)
                uuids = [s["gpu_uuid"] for s in samples if s["workflow_id"] == wf]
            else:  # begun and ended with no agent sampling it: all of it
                until, weight, uuids = min(job.ended_ms, observing), float(len(job.gpus)), list(job.gpus)
            record = unobserved(wf, self.host, job, weight, uuids, job.started_ms, until,
                                f"no agent sampled {self.host} since the job began", now)
            if record is not None:
                out.append(record)
        self.restored = None
        return out

    def cover(self, spooled: list[dict], jobs: dict[str, Allocation]) -> None:
        """Samples spooled: their jobs' samples stand for their GPUs up to the newest's end."""
        newest: dict[str, list[dict]] = {}  # workflow -> its samples of the newest time
        for s in spooled:
            wf = s["workflow_id"]
            if wf not in jobs:
                continue
            group = newest.get(wf)
            if group is None or group[0]["event_time"] < s["event_time"]:
                newest[wf] = [s]
            elif group[0]["event_time"] == s["event_time"]:
                group.append(s)
        for wf, group in newest.items():
            seen, job = self.charged.get(wf), jobs[wf]
            if seen is None or seen.until < group[0]["event_time"]:
                self.charged[wf] = Charged(job_id=job.job_id, until=group[0]["event_time"],
                                           gpus=sum(x["share"] for x in group),
                                           gpu_uuids=sorted({x["gpu_uuid"] for x in group}), owner=job.owner,
                                           team=job.team)

    def forget(self, workflow_id: str) -> None:
        self.charged.pop(workflow_id, None)
