"""The host agent's tick: GPU readings -> per-workflow ``GpuSample``s, a ``HostSample`` and
``WorkflowEvent``s, all written to the spool (the forwarder sends them to Kafka).

A GPU used by several workflows yields one sample per workflow, with its share (by the
processes' SM utilisation, else by their memory, else equal parts). A GPU whose processes
cannot be attributed reports as ``unattributed``; a GPU with no process as ``idle``.

With an allocation source (``producers.agent.allocations.allocation``: Slurm's prolog records, the kubelet's pod
resources) the scheduler decides whose a GPU is: a GPU allocated to a job is that job's, with
or without a process on it (a job that never opens it is still charged for it, at 0 %); a
process of another workflow there is named on the job's samples (``foreign_workflow_id``); a
GPU no job holds and no process uses is the fleet's ``unallocated`` capacity. A job's samples
cover its allocation from the scheduler's start to its end: the first sample reaches back to
the start, and when the epilog says it ended the last one runs to the end time; its ENDED
event goes out at once, also on the samples topic after those samples, so that the worker can
close the job's windows without waiting for the fleet's clock.

Exact to the scheduler's word: the samples of allocated GPUs are held ``hold_s`` before they are
spooled, so that an end or a start the scheduler tells a moment late still cuts them
(``producers.agent.hold_samples``: each GPU-millisecond charged to one holder); and what the agent must
remember across a restart is written beside its spool every tick (``producers.agent.checkpoint``),
so a restarted agent continues its jobs (no second STARTED) and sends the GPU time it did not
see as ``UnobservedTime``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from producers.agent import checkpoint as agent_checkpoint
from producers.agent.allocated_samples import READING_FIELDS, final_samples, first_interval
from producers.agent.allocations.allocation import Allocation, Allocations, AllocationSource, holders
from producers.agent.checkpoint import Active, Checkpoint, Coverage
from producers.agent.clocks import tick_interval
from producers.agent.gpus.attribute_process import IDLE, UNATTRIBUTED, ProcessAttributor, ProcessInfo
from producers.agent.gpus.reading import GpuReading
from producers.agent.gpus.sample_nvml import NvmlSampler
from producers.agent.gpus.shares import (
    DRIVER_RESERVED,
    ProcessGroups,
    int_or_none,
    job_of,
    shares_of,
    sum_or_none,
)
from producers.agent.hold_samples import HeldSamples
from producers.agent.links import AgentLinks
from producers.agent.sample_host import HostSampler
from producers.agent.spool.disk import Spool
from producers.agent.workflow_event import declared_service, workflow_event
from producers.simulate.fleet import SimulatedGpus
from schemas.codec import Codec
from schemas.sample_columns import columns_of
from schemas.topics import GPU_SAMPLES, HOST_SAMPLES, WORKFLOW_EVENTS, TopicSpec, key_of

UNOBSERVED = "UnobservedTime"
from schemas.validate_sample import UNALLOCATED

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class AgentSettings:
    host: str
    interval_s: float = 1.0
    heartbeat_s: float = 60.0
    ended_after_ticks: int = 3  # a workflow absent this many ticks in a row has ended on this host
    topic_prefix: str = ""
    cluster: str | None = None  # reported on every workflow event
    # While a profile is captured on this host: the trace's whole-system context, at this rate.
    profile_interval_s: float = 0.1
    # Allocated GPUs' samples are held this long before they are spooled, so that the scheduler's
    # end or start, told a moment late (Slurm's epilog runs after the end), still trims them.
    hold_s: float = 5.0
    # Remember the jobs across a restart (a file beside the spool), and send what was not seen.
    checkpoint: bool = True


@dataclass
class _Active:
    info: ProcessInfo | None  # its processes' (the first seen), None while a job has none
    gpus: set[str] = field(default_factory=set)
    pids: set[int] = field(default_factory=set)
    missing: int = 0
    last_heartbeat_ms: int = 0
    allocation: Allocation | None = None  # what the scheduler gave it here


@dataclass
class _Seen:
    """A workflow's tick on this host: what its processes say of it, the scheduler's
    allocation, its GPUs and processes."""

    info: ProcessInfo | None = None
    allocation: Allocation | None = None
    gpus: set[str] = field(default_factory=set)
    pids: set[int] = field(default_factory=set)


class HostAgent:
    def __init__(
        self, settings: AgentSettings, spool: Spool, codec: Codec,
        nvml: NvmlSampler | None = None, simulated: SimulatedGpus | None = None,
        attributor: ProcessAttributor | None = None, host_sampler: HostSampler | None = None,
        clock: Callable[[], float] = time.time, allocations: AllocationSource | None = None,
        links: AgentLinks | None = None,
    ) -> None:
        if (nvml is None) == (simulated is None):
            raise ValueError("give the agent exactly one GPU source: nvml or simulated")
        self.settings, self.spool, self.codec = settings, spool, codec
        self.nvml, self.simulated = nvml, simulated
        self.attributor = attributor or ProcessAttributor()
        self.host_sampler = host_sampler or HostSampler()
        self.clock = clock
        self.allocations = allocations  # the scheduler's word on whose each GPU is; None: processes only
        self.active: dict[str, _Active] = {}
        self._last_tick_ms: int | None = None
        self._charging: set[str] = set()  # the jobs whose GPUs the last tick charged them for
        self._held: tuple | None = None  # (jobs and GPUs, which jobs hold which GPU) of the last tick
        self.ticks = 0
        self.samples = 0
        self.links = links or AgentLinks()  # what it is told and tells besides its GPUs and spool
        self.readings: list = []  # the GPUs as the last tick read them (their processes: serving discovery)
        self.held = HeldSamples(round(settings.hold_s * 1000) if allocations is not None else 0)
        restored = agent_checkpoint.load(spool.dir, settings.host) if settings.checkpoint else None
        self.coverage = Coverage(settings.host, restored)
        for wf, a in (restored.active if restored else {}).items():  # they run on: no second STARTED
            self.active[wf] = _Active(a.info, set(a.gpus), set(a.pids), last_heartbeat_ms=a.last_heartbeat_ms,
                                      allocation=a.allocation)

    def _put(self, spec: TopicSpec, record: dict, schema: str | None = None) -> None:
        self.spool.append(self.settings.topic_prefix + spec.name, key_of(spec, record),
                          self.codec.encode(schema or spec.schema, record))

    def tick(self, interval_s: float | None = None) -> int:
        """Sample once and spool the records; returns how many GPU samples this tick made.
        ``interval_s``: the time this tick stands for (the settings' interval by default)."""
        started = time.perf_counter()
        now = int(self.clock() * 1000)
        interval = tick_interval(self._last_tick_ms, now, round((interval_s or self.settings.interval_s) * 1000))
        if self.coverage.observing_since is None:
            self.coverage.observing_since = now - interval
        allocated = self.allocations.read(now) if self.allocations is not None else None
        ended: list[tuple[Allocation, list[dict]]] = []
        if self.simulated is not None:
            samples = self.simulated.samples(interval)
            seen: dict[str, _Seen] = {}
        else:
            readings = self.readings = self.nvml.tick()
            samples, seen = self._from_readings(readings, now, interval, allocated)
            if allocated is not None:
                ended = final_samples(readings, allocated, self._last_tick_ms, now, self.settings.host, self.active)
        host = self.host_sampler.sample(
            now, interval, self.settings.host, {wf: x.pids for wf, x in seen.items()},
            spool_dropped_total=self.spool.dropped)
        cpu = {w["workflow_id"]: w["cpu_pct"] for w in host["workflows"]}
        rss = {w["workflow_id"]: w["rss_bytes"] for w in host["workflows"]}
        for s in samples:
            # On every GPU sample of the workflow: the stream sees GPU and CPU side by side.
            s.setdefault("workflow_cpu_pct", cpu.get(s["workflow_id"]))
            s.setdefault("workflow_memory_bytes", rss.get(s["workflow_id"]))
            s.setdefault("host_iowait_pct", host["iowait_pct"])
        for observe in self.links.observers:
            observe(samples, host)
        unobserved = [] if allocated is None else self.coverage.gaps(allocated.current, allocated.ended, samples,
                                                                      self._charging, now)
        # The scheduler's ends and starts cut what is held (each GPU-ms charged to one holder),
        # then what has been held long enough is spooled.
        finals = [(a, self.held.ended(a.workflow_id, a.ended_ms if a.ended_ms is not None else now) + last)
                  for a, last in ended]
        for a, _ in ended:
            self._past_end(a, now)
        for job, uuids in self._starting(allocated, seen):
            self.held.started(job.workflow_id, uuids, job.started_ms)
        self.held.add(now, samples)
        released = self.held.release(now)
        self._spool(released, unobserved, host, self._lifecycle(seen, now), finals)
        self.spool.flush()
        self._cover(released, finals, allocated)
        if ended:
            self.allocations.forget(a for a, _ in ended)  # spooled: the epilog's record has done its work
            self.links.hurry()
        self._last_tick_ms = now
        self._charging = {a.job_id for a in allocated.current} if allocated is not None else set()
        if self.settings.checkpoint:
            self._save(now)
        self.ticks += 1
        self.samples += len(samples)
        if self.links.metrics is not None:
            self.links.metrics.ticked(samples, time.perf_counter() - started)
        return len(samples)

    def _spool(self, released: list[dict], unobserved: list[dict], host: dict, events: list[dict],
               finals: list[tuple[Allocation, list[dict]]]) -> None:
        # One record per workflow and tick in the spool; the forwarder merges a send's worth of
        # them into one message per workflow (benchmarks/bench_stream.py: the worker's cost is per message).
        for block in columns_of(released):
            self._put(GPU_SAMPLES, block, schema="GpuSampleColumns")
        for record in unobserved:
            self._put(GPU_SAMPLES, record, schema=UNOBSERVED)
        self._put(HOST_SAMPLES, host)
        for event in events:
            self._put(WORKFLOW_EVENTS, event)
        for allocation, last in finals:
            for block in columns_of(last):
                self._put(GPU_SAMPLES, block, schema="GpuSampleColumns")
            event = self._ended(allocation)
            self._put(WORKFLOW_EVENTS, event)
            self._put(GPU_SAMPLES, event, schema=WORKFLOW_EVENTS.schema)  # after its last samples, in order

    def stop(self) -> None:
        """Spool what is held (the agent stops: its samples stand for the time they were taken)."""
        released = self.held.release_all()
        for block in columns_of(released):
            self._put(GPU_SAMPLES, block, schema="GpuSampleColumns")
        self.spool.flush()
        self._cover(released, [], None)
        if self.settings.checkpoint and self._last_tick_ms is not None:
            self._save(self._last_tick_ms)

    def _starting(self, allocated: Allocations | None, seen: dict[str, _Seen]) -> list[tuple[Allocation, set[str]]]:
        """The jobs charged for the first time this tick whose start the scheduler gave, with
        their GPUs: what was held as nobody's there since their start is theirs."""
        if allocated is None:
            return []
        return [(a, seen[a.workflow_id].gpus) for a in allocated.current
                if a.job_id not in self._charging and a.started_ms is not None and a.workflow_id in seen]

    def _past_end(self, job: Allocation, now: int) -> None:
        """Say what an end told later than the hold could not trim: samples already spooled past it."""
        charged, end = self.coverage.charged.get(job.workflow_id), job.ended_ms
        if charged is not None and end is not None and charged.until > end:
            past = (charged.until - end) * charged.gpus
            self.held.charged_past_end_ms += past
            log.warning("%s: its end (%d) was read %.1f s after it, past the %g s the agent holds samples: %.0f "
                        "GPU-ms were charged past it", job.workflow_id, end, (now - end) / 1000, self.settings.hold_s,
                        past)

    def _cover(self, released: list[dict], finals: list[tuple[Allocation, list[dict]]],
               allocated: Allocations | None) -> None:
        jobs = {a.workflow_id: a for a in allocated.current} if allocated is not None else {
            wf: x.allocation for wf, x in self.active.items() if x.allocation is not None}
        self.coverage.cover(released, jobs)
        for allocation, _ in finals:
            self.coverage.forget(allocation.workflow_id)

    def _save(self, now: int) -> None:
        active = {wf: Active(info=x.info, gpus=sorted(x.gpus), pids=sorted(x.pids),
                             last_heartbeat_ms=x.last_heartbeat_ms, allocation=x.allocation)
                  for wf, x in self.active.items()}
        agent_checkpoint.save(self.spool.dir, Checkpoint(host=self.settings.host, tick_ms=now, active=active,
                                                         charged=self.coverage.charged))

    def _from_readings(self, readings: list[GpuReading], now: int, interval: int,
                       allocated: Allocations | None) -> tuple[list[dict], dict[str, _Seen]]:
        samples: list[dict] = []
        seen: dict[str, _Seen] = {}
        live = set()
        reported = self.links.throughputs(now / 1000)
        allocators = self.links.memory_peaks(now / 1000)
        gpus_of = Counter(p.pid for r in readings for p in r.processes if p.pid in reported or p.pid in allocators)
        held = self._holders(allocated.current, readings) if allocated is not None else {}
        for r in readings:
            live.update(p.pid for p in r.processes)
            jobs = held.get(r.uuid)
            g = self._groups(r, jobs) if jobs else self._process_groups(r)
            groups, infos, ranks, foreign = g.processes, g.infos, g.ranks, g.foreign
            shares = shares_of(groups)
            allocation_of = {a.workflow_id: a for a in jobs or ()}
            for wf, procs in groups.items():
                info, job = infos.get(wf), allocation_of.get(wf)
                owner = job.owner if job is not None else info.owner if info else None
                team = job.team if job is not None else info.team if info else None
                samples.append({
                    **{f: getattr(r, f) for f in READING_FIELDS},
                    "event_time": now, "host": self.settings.host,
                    "interval_ms": interval if job is None or job.job_id in self._charging
                    else first_interval(job, self._last_tick_ms, now, interval),
                    "gpu_index": r.index, "gpu_uuid": r.uuid, "gpu_model": r.name, "workflow_id": wf,
                    "owner": owner, "team": team,
                    "utilization_pct": r.utilization_pct if r.utilization_pct is not None else 0.0,
                    "share": shares[wf], "process_count": len(procs),
                    "process_memory_bytes": sum(p.used_memory_bytes or 0 for p in procs),
                    "process_sm_util_pct": sum_or_none(p.sm_util_pct for p in procs),
                    "parent_gpu_uuid": r.parent_uuid, "xids": list(r.xids), "rank": ranks.get(wf),
                    "foreign_workflow_id": foreign if job is not None else None,
                    # a process's reported model work, shared among the GPUs it uses
                    "model_tflops": sum_or_none(reported[p.pid] / gpus_of[p.pid] for p in procs if p.pid in reported),
                    # the framework allocator's peaks, likewise (what the job needs, where NVML sees the reserve)
                    "allocator_peak_bytes": int_or_none(sum_or_none(
                        allocators[p.pid][0] / gpus_of[p.pid] for p in procs if p.pid in allocators)),
                    "allocator_reserved_bytes": int_or_none(sum_or_none(
                        allocators[p.pid][1] / gpus_of[p.pid] for p in procs if p.pid in allocators)),
                })
                if job is not None or (info is not None and wf not in (IDLE, UNATTRIBUTED)):
                    entry = seen.setdefault(wf, _Seen())
                    entry.info = entry.info or info
                    entry.allocation = entry.allocation or job
                    entry.gpus.add(r.uuid)
                    entry.pids.update(p.pid for p in procs)
        self.attributor.forget_except(live)
        return samples, seen

    def _holders(self, current: tuple[Allocation, ...], readings: list[GpuReading]) -> dict[str, list[Allocation]]:
        """GPU UUID -> the jobs holding it; worked out again only when the jobs or the GPUs change."""
        key = (current, tuple((r.uuid, r.index, r.minor_number, r.parent_uuid) for r in readings))
        if self._held is None or self._held[0] != key:
            self._held = (key, holders(current, readings))
        return self._held[1]

    def _process_groups(self, r: GpuReading) -> ProcessGroups:
        """A GPU no job was allocated: its processes by the workflow each names; none: the
        fleet's free capacity, or ``unattributed`` where memory is held by no process we see."""
        g = ProcessGroups()
        for p in r.processes:
            info = self.attributor.attribute(p.pid)
            g.add(info.workflow_id, p, info)
        if not g.processes:
            free = UNALLOCATED if self.allocations is not None else IDLE
            g.processes[UNATTRIBUTED if (r.memory_used_bytes or 0) > DRIVER_RESERVED else free] = []
        return g

    def _groups(self, r: GpuReading, jobs: list[Allocation]) -> ProcessGroups:
        """A GPU the scheduler allocated: one group per job holding it (processes or not), each
        process in its job's group; a process of no job holding the GPU is foreign, and the
        workflow of the first (by pid) is kept."""
        g = ProcessGroups({a.workflow_id: [] for a in jobs})
        foreign = []
        for p in r.processes:
            info = self.attributor.attribute(p.pid)
            job = job_of(info, jobs)
            if job is None:
                foreign.append((p.pid, info.workflow_id))
            else:
                g.add(job.workflow_id, p, info)
        g.foreign = min(foreign)[1] if foreign else None
        return g

    def _lifecycle(self, seen: dict[str, _Seen], now: int) -> list[dict]:
        events = []
        for wf, x in seen.items():
            entry = self.active.get(wf)
            if entry is None:
                entry = self.active[wf] = _Active(x.info, x.gpus, x.pids, last_heartbeat_ms=now,
                                                  allocation=x.allocation)
                events.append(self._event(wf, "STARTED", entry, now))
            else:
                news = x.allocation is not None and entry.allocation is None  # the scheduler's word, at once
                entry.gpus, entry.pids, entry.missing = x.gpus, x.pids, 0
                entry.info, entry.allocation = x.info or entry.info, x.allocation or entry.allocation
                if news or now - entry.last_heartbeat_ms >= self.settings.heartbeat_s * 1000:
                    entry.last_heartbeat_ms = now
                    events.append(self._event(wf, "HEARTBEAT", entry, now))
        for wf in [wf for wf in self.active if wf not in seen]:
            entry = self.active[wf]
            entry.missing += 1
            if entry.missing >= self.settings.ended_after_ticks:
                ended = self._event(wf, "ENDED", entry, now)
                ended["scheduler"] = None  # the agent saw it go, the scheduler did not say: no scheduler's end
                events.append(ended)
                del self.active[wf]
        return events

    def declared_service(self, workflow_id: str) -> str | None:
        """The service ``workflow_id``'s labels (its allocation's) or its processes' environment
        declare it a replica of, as its events say; None where nothing does."""
        entry = self.active.get(workflow_id)
        return None if entry is None else declared_service(entry.info, entry.allocation)

    def _ended(self, allocation: Allocation) -> dict:
        """The scheduler's end of a job here: at its end time, with what the scheduler and the
        job's processes said of it; the job is no longer active on this host."""
        entry = self.active.pop(allocation.workflow_id, None) or _Active(None)
        entry.allocation = allocation
        now = allocation.ended_ms if allocation.ended_ms is not None else int(self.clock() * 1000)
        return self._event(allocation.workflow_id, "ENDED", entry, now)

    def _event(self, wf: str, kind: str, entry: _Active, now: int) -> dict:
        return workflow_event(wf, kind, now, self.settings.host, self.settings.cluster, entry.info, entry.allocation,
                              entry.gpus, entry.pids)
