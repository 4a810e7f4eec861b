"""The host agent's tick: GPU readings -> per-workflow ``GpuSample``s, a ``HostSample`` and
``WorkflowEvent``s, all written to the spool (the forwarder sends them to Kafka).

A GPU used by several workflows yields one sample per workflow, with its share (by the
processes' SM utilisation, else by their memory, else equal parts). A GPU whose processes
cannot be attributed reports as ``unattributed``; a GPU with no process as ``idle``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from producers.attribute_process import IDLE, UNATTRIBUTED, ProcessAttributor, ProcessInfo
from producers.sample_host import HostSampler
from producers.sample_nvml import GpuReading, NvmlSampler
from producers.simulate_fleet import Fleet
from producers.spool import Spool
from schemas.codec import Codec
from schemas.sample_columns import columns_of
from schemas.topics import GPU_SAMPLES, HOST_SAMPLES, WORKFLOW_EVENTS, TopicSpec, key_of

log = logging.getLogger(__name__)

_READING_FIELDS = (
    "utilization_pct", "memory_utilization_pct", "memory_used_bytes", "memory_total_bytes", "power_watts",
    "temperature_c", "sm_clock_mhz", "power_limit_watts", "energy_joules_total", "sm_clock_max_mhz",
    "mem_clock_mhz", "mem_clock_max_mhz", "clock_event_reasons", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
    "ecc_uncorrected_volatile", "remapped_rows_uncorrectable", "remapped_rows_pending", "sm_active_pct",
    "sm_occupancy_pct", "tensor_active_pct", "dram_bw_pct", "mig_gi_id", "mig_ci_id",
)


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


@dataclass
class _Active:
    info: ProcessInfo
    gpus: set[str] = field(default_factory=set)
    pids: set[int] = field(default_factory=set)
    missing: int = 0
    last_heartbeat_ms: int = 0


class SimulatedGpus:
    """``--source sim``: this host's GPUs of a simulated fleet, ticking in real time."""

    def __init__(self, fleet: Fleet, host: str, start_ms: int) -> None:
        self.fleet, self.host, self.start_ms, self.ticks = fleet, host, start_ms, 0
        if not any(g.host == host for w in fleet.workflows for g in w.gpus):
            raise ValueError(f"the simulated fleet has no host {host!r}")

    def samples(self, interval_ms: int) -> list[dict]:
        out = [s for s in self.fleet.samples_at(self.ticks, self.start_ms, interval_ms) if s["host"] == self.host]
        self.ticks += 1
        return out


class HostAgent:
    def __init__(
        self, settings: AgentSettings, spool: Spool, codec: Codec,
        nvml: NvmlSampler | None = None, simulated: SimulatedGpus | None = None,
        attributor: ProcessAttributor | None = None, host_sampler: HostSampler | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if (nvml is None) == (simulated is None):
            raise ValueError("give the agent exactly one GPU source: nvml or simulated")
        self.settings, self.spool, self.codec = settings, spool, codec
        self.nvml, self.simulated = nvml, simulated
        self.attributor = attributor or ProcessAttributor()
        self.host_sampler = host_sampler or HostSampler()
        self.clock = clock
        self.active: dict[str, _Active] = {}
        self.ticks = 0
        self.samples = 0
        # Called with each tick's GPU samples and host sample (the profile coordinator's context).
        self.observers: list[Callable[[list[dict], dict], None]] = []
        # pid -> TFLOPS of model work a job reports for that process (``profile_hook.report_throughput``)
        self.throughputs: Callable[[float], dict[int, float]] = lambda now: {}
        # pid -> (allocator peak, reserved peak) bytes a job reports (``profile_hook.report_memory``)
        self.memory_peaks: Callable[[float], dict[int, tuple[int, int]]] = lambda now: {}
        self.metrics = None  # a producers.agent_metrics.AgentMetrics, told of each tick

    def _put(self, spec: TopicSpec, record: dict, schema: str | None = None) -> None:
        self.spool.append(self.settings.topic_prefix + spec.name, key_of(spec, record),
                          self.codec.encode(schema or spec.schema, record))

    def tick(self, interval_s: float | None = None) -> int:
        """Sample once and spool the records; returns how many GPU samples were spooled.
        ``interval_s``: the time this tick stands for (the settings' interval by default)."""
        started = time.perf_counter()
        now = int(self.clock() * 1000)
        interval = round((interval_s or self.settings.interval_s) * 1000)
        if self.simulated is not None:
            samples = self.simulated.samples(interval)
            seen: dict[str, tuple[ProcessInfo, set[str], set[int]]] = {}
        else:
            samples, seen = self._from_readings(self.nvml.tick(), now, interval)
        host = self.host_sampler.sample(
            now, interval, self.settings.host, {wf: pids for wf, (_, _, pids) in seen.items()},
            spool_dropped_total=self.spool.dropped)
        cpu = {w["workflow_id"]: w["cpu_pct"] for w in host["workflows"]}
        rss = {w["workflow_id"]: w["rss_bytes"] for w in host["workflows"]}
        for s in samples:
            # On every GPU sample of the workflow: the stream sees GPU and CPU side by side.
            s.setdefault("workflow_cpu_pct", cpu.get(s["workflow_id"]))
            s.setdefault("workflow_memory_bytes", rss.get(s["workflow_id"]))
            s.setdefault("host_iowait_pct", host["iowait_pct"])
        for observe in self.observers:
            observe(samples, host)
        # One record per workflow and tick in the spool; the forwarder merges a send's worth of
        # them into one message per workflow (benchmarks/bench_stream.py: the worker's cost is per message).
        for block in columns_of(samples):
            self._put(GPU_SAMPLES, block, schema="GpuSampleColumns")
        self._put(HOST_SAMPLES, host)
        for event in self._lifecycle(seen, now):
            self._put(WORKFLOW_EVENTS, event)
        self.spool.flush()
        self.ticks += 1
        self.samples += len(samples)
        if self.metrics is not None:
            self.metrics.ticked(samples, time.perf_counter() - started)
        return len(samples)

    def _from_readings(self, readings: list[GpuReading], now: int, interval: int):
        samples: list[dict] = []
        seen: dict[str, tuple[ProcessInfo, set[str], set[int]]] = {}
        live = set()
        reported = self.throughputs(now / 1000)
        allocators = self.memory_peaks(now / 1000)
        gpus_of = Counter(p.pid for r in readings for p in r.processes if p.pid in reported or p.pid in allocators)
        for r in readings:
            groups: dict[str, list] = {}
            infos: dict[str, ProcessInfo] = {}
            ranks: dict[str, int] = {}
            for p in r.processes:
                live.add(p.pid)
                info = self.attributor.attribute(p.pid)
                groups.setdefault(info.workflow_id, []).append(p)
                infos.setdefault(info.workflow_id, info)
                if info.rank is not None:
                    ranks[info.workflow_id] = min(info.rank, ranks.get(info.workflow_id, info.rank))
            if not groups:
                groups = {UNATTRIBUTED if (r.memory_used_bytes or 0) > _DRIVER_RESERVED else IDLE: []}
            shares = _shares(groups)
            for wf, procs in groups.items():
                info = infos.get(wf)
                base = {f: getattr(r, f) for f in _READING_FIELDS}
                samples.append({
                    **base,
                    "event_time": now, "interval_ms": interval, "host": self.settings.host,
                    "gpu_index": r.index, "gpu_uuid": r.uuid, "gpu_model": r.name, "workflow_id": wf,
                    "owner": info.owner if info else None, "team": info.team if info else None,
                    "utilization_pct": r.utilization_pct if r.utilization_pct is not None else 0.0,
                    "share": shares[wf], "process_count": len(procs),
                    "process_memory_bytes": sum(p.used_memory_bytes or 0 for p in procs),
                    "process_sm_util_pct": _sum_or_none(p.sm_util_pct for p in procs),
                    "parent_gpu_uuid": r.parent_uuid, "xids": list(r.xids), "rank": ranks.get(wf),
                    # a process's reported model work, shared among the GPUs it uses
                    "model_tflops": _sum_or_none(reported[p.pid] / gpus_of[p.pid] for p in procs if p.pid in reported),
                    # the framework allocator's peaks, likewise (what the job needs, where NVML sees the reserve)
                    "allocator_peak_bytes": _int_or_none(_sum_or_none(
                        allocators[p.pid][0] / gpus_of[p.pid] for p in procs if p.pid in allocators)),
                    "allocator_reserved_bytes": _int_or_none(_sum_or_none(
                        allocators[p.pid][1] / gpus_of[p.pid] for p in procs if p.pid in allocators)),
                })
                if info is not None and wf not in (IDLE, UNATTRIBUTED):
                    entry = seen.setdefault(wf, (info, set(), set()))
                    entry[1].add(r.uuid)
                    entry[2].update(p.pid for p in procs)
        self.attributor.forget_except(live)
        return samples, seen

    def _lifecycle(self, seen: dict[str, tuple[ProcessInfo, set[str], set[int]]], now: int) -> list[dict]:
        events = []
        for wf, (info, gpus, pids) in seen.items():
            entry = self.active.get(wf)
            if entry is None:
                entry = self.active[wf] = _Active(info, gpus, pids, last_heartbeat_ms=now)
                events.append(self._event(wf, "STARTED", entry, now))
            else:
                entry.info, entry.gpus, entry.pids, entry.missing = info, gpus, pids, 0
                if now - entry.last_heartbeat_ms >= self.settings.heartbeat_s * 1000:
                    entry.last_heartbeat_ms = now
                    events.append(self._event(wf, "HEARTBEAT", entry, now))
        for wf in [wf for wf in self.active if wf not in seen]:
            entry = self.active[wf]
            entry.missing += 1
            if entry.missing >= self.settings.ended_after_ticks:
                events.append(self._event(wf, "ENDED", entry, now))
                del self.active[wf]
        return events

    def _event(self, wf: str, kind: str, entry: _Active, now: int) -> dict:
        info = entry.info
        return {
            "workflow_id": wf, "event": kind, "event_time": now, "host": self.settings.host,
            "owner": info.owner, "team": info.team, "gpu_uuids": sorted(entry.gpus), "pids": sorted(entry.pids),
            "cmdline": info.cmdline, "framework": info.framework, "framework_version": info.framework_version,
            "scheduler_job_id": info.scheduler_job_id, "attribution": info.source,
            "model": info.model, "cluster": self.settings.cluster, "scheduler_qos": info.qos,
            "scheduler_partition": info.partition,
        }


# Memory the driver itself keeps on an idle GPU; above it, some process holds memory we cannot see.
_DRIVER_RESERVED = 1 << 30


def _shares(groups: dict[str, list]) -> dict[str, float]:
    def total(key) -> dict[str, float]:
        return {wf: sum(key(p) or 0 for p in procs) for wf, procs in groups.items()}

    for key in (lambda p: p.sm_util_pct, lambda p: p.used_memory_bytes):
        weights = total(key)
        whole = sum(weights.values())
        if whole > 0 and all(w > 0 for w in weights.values()):
            return {wf: w / whole for wf, w in weights.items()}
    return {wf: 1.0 / len(groups) for wf in groups}


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)


def _sum_or_none(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(sum(values)) if values else None


def run_agent(agent: HostAgent, forwarder, stop, drain_timeout_s: float = 30.0,
              profiling: Callable[[], bool] | None = None, clock: Callable[[], float] = time.monotonic,
              wake=None) -> None:
    """Tick every interval until ``stop`` is set, with the forwarder sending in a thread;
    then send everything spooled (up to ``drain_timeout_s``). While ``profiling()`` says a
    profile is being captured here, tick at the settings' ``profile_interval_s`` instead, so
    the analysis sees GPU and host metrics at the trace's time scale.

    Each tick's samples stand for the time since the previous tick, measured: a host whose
    tick takes longer than the interval (eight pre-Hopper GPUs spend ~0.4 s in NVML's PCIe
    counters alone, too slow for 10 Hz) samples less often instead of under-counting its
    GPU-seconds, and a late tick is not followed by a burst of catch-up ticks.

    ``wake`` (a ``threading.Event``): set when a capture starts, it ends the wait for the next
    tick at once, so a capture shorter than the normal interval is still sampled at 10 Hz."""
    import threading

    sending = threading.Event()
    thread = threading.Thread(target=forwarder.run, args=(sending,), name="forwarder", daemon=True)
    thread.start()
    next_tick = clock()
    last = None
    fast = False
    try:
        while not stop.is_set():
            was_fast, fast = fast, bool(profiling and profiling())
            if fast != was_fast:
                log.info("profile %s: sampling every %gs", "started" if fast else "ended",
                         agent.settings.profile_interval_s if fast else agent.settings.interval_s)
            interval = agent.settings.profile_interval_s if fast else agent.settings.interval_s
            now = clock()
            agent.tick(interval if last is None else now - last)
            last = now
            next_tick = max(next_tick + interval, clock())
            delay = max(0.0, next_tick - clock())
            if wake is None:
                stop.wait(delay)
            elif wake.wait(delay):
                wake.clear()
                next_tick = clock()  # a capture started: sample it from now on
    finally:
        sending.set()
        thread.join(10)
        if not forwarder.drain(drain_timeout_s):
            log.warning("%d records are still spooled; they will be sent when the agent starts again",
                        agent.spool.pending())
        agent.spool.close()
