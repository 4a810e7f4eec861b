"""Simulated GPU fleet: hosts x GPUs running workflows with owners; emits ``GpuSample`` dicts.

Everything is deterministic from the seed: the fleet's layout, which workflows waste
their GPUs, and every sample value (each tick has its own random stream, so the samples
of a tick do not depend on how fast or in which order ticks are generated).

``build_fleet(planted=True)`` also plants what goodput accounting must find (start-up
phases, jobs starved by I/O, GPUs under a thermal limit, an XID), and ``Fleet.planted``
says where each GPU-second went by construction: the truth the waterfall is checked against.

``build_fleet(scheduler=True)`` lays the fleet out as a scheduler would and the agents report
it when they read its allocations: some GPUs are given to no job (the ``unallocated``
capacity), one job asked for GPUs and runs on the CPU only (it never opens them), and one opens
only half of the GPUs it was given; every sample says how many processes the GPU has
(``process_count``: 0 on a GPU no process opened). ``Fleet.untouched`` is the planted truth of
the GPU-seconds held and never touched.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from schemas.validate_sample import UNALLOCATED

GIB = 1024**3

GPU_MODELS = (
    # name, memory bytes, max power W, max SM clock MHz
    ("NVIDIA A100-SXM4-80GB", 80 * GIB, 400.0, 1410),
    ("NVIDIA H100 80GB HBM3", 80 * GIB, 700.0, 1980),
    ("Tesla V100-SXM2-32GB", 32 * GIB, 300.0, 1530),
)


@dataclass(frozen=True)
class Profile:
    """How a workflow uses its GPUs: utilisation = mean +/- spread (uniform), clipped to 0..100."""

    name: str
    utilization_mean: float
    utilization_spread: float
    memory_fraction: float


HEALTHY = Profile("healthy", 85.0, 10.0, 0.70)
MODERATE = Profile("moderate", 55.0, 15.0, 0.45)
UNDERUTILIZED = Profile("underutilized", 12.0, 8.0, 0.30)
IDLE = Profile("idle", 0.0, 0.0, 0.25)  # holds memory, runs nothing: a zombie allocation
UNTOUCHED = Profile("untouched", 0.0, 0.0, 0.0)  # asked for GPUs, runs on the CPU: never opens them
INPUT_BOUND = Profile("input-bound", 26.0, 8.0, 0.40)  # waits on its hosts' I/O
SERVING = Profile("serving", 35.0, 5.0, 0.60)  # a serving replica with traffic: light, and doing its job

# Where a planted GPU-second goes (streams.windows.goodput's buckets), by profile once started.
_PLANTED_BUCKET = {HEALTHY: "productive", MODERATE: "productive", UNDERUTILIZED: "low_util",
                   INPUT_BOUND: "input_bound", SERVING: "productive"}
THROTTLED = 0x20  # nvmlClocksEventReasonSwThermalSlowdown


@dataclass(frozen=True)
class Gpu:
    host: str
    index: int
    uuid: str
    model: str
    memory_total: int
    max_power: float
    max_sm_clock: int


@dataclass(frozen=True)
class Workflow:
    workflow_id: str
    owner: str
    team: str
    profile: Profile
    gpus: tuple[Gpu, ...]
    planted: bool = False  # reports host CPU and I/O wait, clock events and XIDs
    startup_ticks: int = 0  # at 0 % before its first busy tick
    throttled: tuple[int, int] | None = None  # ticks [from, to) under a thermal limit
    xid_tick: int | None = None  # its first GPU reports an XID at this tick
    untouched_gpus: int = 0  # its last GPUs that no process of it ever opens (the scheduler gave them)
    service: str | None = None  # a serving replica of this service (``producers.simulate.serving``)

    def opens(self, rank: int) -> bool:
        """Whether the job's processes open its GPU of this rank."""
        return self.profile is not UNTOUCHED and rank < len(self.gpus) - self.untouched_gpus


@dataclass(frozen=True)
class Fleet:
    seed: int
    workflows: tuple[Workflow, ...]
    free: tuple[Gpu, ...] = ()  # GPUs the scheduler gave no job (scheduler=True)
    scheduler: bool = False  # samples say how many processes each GPU has, free GPUs report too

    @property
    def gpu_count(self) -> int:
        return sum(len(w.gpus) for w in self.workflows) + len(self.free)

    def workflow(self, workflow_id: str) -> Workflow:
        for w in self.workflows:
            if w.workflow_id == workflow_id:
                return w
        raise KeyError(workflow_id)

    def samples_at(self, tick: int, start_ms: int, interval_ms: int) -> Iterator[dict]:
        """All GPU samples of tick ``tick`` (event time ``start_ms + tick * interval_ms``)."""
        rng = random.Random(self.seed * 1_000_003 + tick)
        event_time = start_ms + tick * interval_ms
        for w in self.workflows:
            p = w.profile
            for rank, gpu in enumerate(w.gpus):
                util = p.utilization_mean + rng.uniform(-p.utilization_spread, p.utilization_spread)
                util = min(100.0, max(0.0, util))
                busy = util / 100.0
                mem_used = int(gpu.memory_total * min(1.0, p.memory_fraction * rng.uniform(0.95, 1.05)))
                if tick < w.startup_ticks:
                    util = busy = 0.0
                sample = {
                    "event_time": event_time,
                    "interval_ms": interval_ms,
                    "host": gpu.host,
                    "gpu_index": gpu.index,
                    "gpu_uuid": gpu.uuid,
                    "gpu_model": gpu.model,
                    "workflow_id": w.workflow_id,
                    "owner": w.owner,
                    "team": w.team,
                    "utilization_pct": round(util, 2),
                    "memory_utilization_pct": round(util * 0.6, 2),
                    "memory_used_bytes": mem_used,
                    "memory_total_bytes": gpu.memory_total,
                    "power_watts": round(gpu.max_power * (0.15 + 0.8 * busy), 1),
                    "temperature_c": round(35.0 + 40.0 * busy + rng.uniform(-1, 1), 1),
                    "sm_clock_mhz": gpu.max_sm_clock if busy > 0 else 210,
                    "rank": rank,  # one rank per GPU, in the order the job holds them
                }
                opened = w.opens(rank)
                if not opened:  # the scheduler gave it, no process opened it: nothing on it at all
                    sample.update(utilization_pct=0.0, memory_utilization_pct=0.0, memory_used_bytes=0,
                                  power_watts=round(gpu.max_power * 0.15, 1), sm_clock_mhz=210)
                if self.scheduler:
                    sample["process_count"] = 1 if opened else 0
                if w.planted:
                    sample["host_iowait_pct"] = 45.0 if p is INPUT_BOUND else 2.0
                    sample["workflow_cpu_pct"] = 50.0
                    sample["clock_event_reasons"] = THROTTLED if opened and self._throttled(w, tick) else 0
                    sample["xids"] = [79] if tick == w.xid_tick and rank == 0 and opened else []
                    if gpu.model.startswith("NVIDIA H100"):  # Hopper: GPM reports SM and tensor activity
                        sample["sm_active_pct"] = round(sample["utilization_pct"] * 0.9, 2)
                        sample["tensor_active_pct"] = round(sample["utilization_pct"] * 0.45, 2)
                yield sample
        for gpu in self.free:  # capacity no job holds, as an agent that reads the allocations reports it
            yield {"event_time": event_time, "interval_ms": interval_ms, "host": gpu.host, "gpu_index": gpu.index,
                   "gpu_uuid": gpu.uuid, "gpu_model": gpu.model, "workflow_id": UNALLOCATED, "owner": None,
                   "team": None, "utilization_pct": 0.0, "memory_utilization_pct": 0.0, "memory_used_bytes": 0,
                   "memory_total_bytes": gpu.memory_total, "power_watts": round(gpu.max_power * 0.15, 1),
                   "temperature_c": round(30.0 + rng.uniform(-1, 1), 1), "sm_clock_mhz": 210, "process_count": 0}

    @staticmethod
    def _throttled(w: Workflow, tick: int) -> bool:
        return w.throttled is not None and w.throttled[0] <= tick < w.throttled[1]

    def planted(self, ticks: int, start_ms: int, interval_ms: int, startup_max_s: float) -> dict[str, dict]:
        """Per workflow, per goodput bucket, the GPU-seconds and joules that ticks ``0 ..
        ticks-1`` put there by construction: ``{workflow: {bucket: [gpu_seconds, joules]}}``.
        ``startup_max_s``: how long a workflow that never gets busy counts as starting."""
        out = {w.workflow_id: {} for w in self.workflows}
        by_id = {w.workflow_id: w for w in self.workflows}
        never_busy = (IDLE, UNTOUCHED)
        for tick in range(ticks):
            for s in self.samples_at(tick, start_ms, interval_ms):
                w = by_id.get(s["workflow_id"])
                if w is None:
                    continue  # capacity no job holds: no bucket (``unallocated``)
                opened = w.opens(s["rank"])
                if s.get("clock_event_reasons") or s.get("xids"):
                    bucket = "unhealthy"
                elif tick < w.startup_ticks or (w.profile in never_busy and tick * interval_ms < startup_max_s * 1000):
                    bucket = "startup"
                elif not opened or w.profile in never_busy:
                    bucket = "idle"  # held at 0 %: a zombie, a GPU its job never opens
                else:
                    bucket = _PLANTED_BUCKET[w.profile]
                entry = out[w.workflow_id].setdefault(bucket, [0.0, 0.0])
                entry[0] += interval_ms / 1000
                entry[1] += s["power_watts"] * interval_ms / 1000
        return out


    def untouched(self, ticks: int, interval_ms: int) -> float:
        """GPU-seconds of ticks ``0 .. ticks-1`` on GPUs a job held and never opened."""
        return ticks * interval_ms / 1000 * sum(not w.opens(r) for w in self.workflows for r in range(len(w.gpus)))

    def unallocated(self, ticks: int, interval_ms: int) -> float:
        """GPU-seconds of ticks ``0 .. ticks-1`` on GPUs no job held."""
        return ticks * interval_ms / 1000 * len(self.free)


TEAMS = ("vision", "ranking", "speech", "llm")


def build_fleet(seed: int = 7, hosts: int = 4, gpus_per_host: int = 8, workflows: int = 8,
                planted: bool = False, scheduler: bool = False) -> Fleet:
    """Lay ``workflows`` out over ``hosts`` x ``gpus_per_host`` GPUs.

    Workflow 0 holds its GPUs at 0 % (idle); about a quarter of the rest are underutilised;
    the others are healthy or moderate. Every GPU belongs to exactly one workflow.

    ``planted``: every workflow but the idle one starts after 30 s to 4 min at 0 %; one in
    six of the others waits on I/O (input-bound); one in five runs under a thermal limit
    from minute 6 to 8; one reports an XID at minute 3. The layout and the profiles of the
    others are as without it.

    ``scheduler``: an eighth of the GPUs (as many as the workflows leave) are given to no job;
    the last workflow (of four or more) runs on the CPU only and never opens its GPUs; the
    first busy workflow with two GPUs or more opens only the first half of them.
    """
    if workflows < 1 or hosts < 1 or gpus_per_host < 1:
        raise ValueError("hosts, gpus_per_host and workflows must be >= 1")
    total = hosts * gpus_per_host
    if workflows > total:
        raise ValueError(f"{workflows} workflows need at least as many GPUs; the fleet has {total}")
    rng = random.Random(seed)
    gpus: list[Gpu] = []
    for h in range(hosts):
        model, mem, power, clock = GPU_MODELS[rng.randrange(len(GPU_MODELS))]
        host = f"gpu-host-{h:03d}"
        for i in range(gpus_per_host):
            uuid = f"GPU-{seed:04x}{h:04x}-{i:04x}-{rng.getrandbits(32):08x}"
            gpus.append(Gpu(host, i, uuid, model, mem, power, clock))
    free = min(total // 8, total - workflows) if scheduler else 0
    allocated = total - free
    # Split the allocated GPUs into contiguous runs, one per workflow, at least one GPU each.
    cuts = sorted(rng.sample(range(1, allocated), workflows - 1))
    bounds = [0, *cuts, allocated]
    under = max(1, workflows // 4) if workflows > 1 else 0
    plant = random.Random(seed + 1)  # its own stream: the layout is the same either way
    fleet = []
    for n in range(workflows):
        if n == 0:
            profile = IDLE
        elif n <= under:
            profile = UNDERUTILIZED
        else:
            profile = HEALTHY if rng.random() < 0.6 else MODERATE
        extra = {}
        if planted:
            if n > under and n % 6 == 5:
                profile = INPUT_BOUND
            extra = {"planted": True, "startup_ticks": 0 if n == 0 else plant.randrange(30, 240),
                     "throttled": (360, 480) if n % 5 == 2 else None, "xid_tick": 180 if n == 1 else None}
        held = tuple(gpus[bounds[n]:bounds[n + 1]])
        if scheduler and workflows >= 4 and n == workflows - 1:
            profile = UNTOUCHED
            extra.update(startup_ticks=0)
        elif scheduler and profile in (HEALTHY, MODERATE) and len(held) >= 2 and not any(
                w.untouched_gpus for w in fleet):
            extra["untouched_gpus"] = len(held) // 2
        fleet.append(Workflow(
            workflow_id=f"wf-{seed}-{n:04d}",
            owner=f"user{rng.randrange(100):02d}@example.com",
            team=TEAMS[n % len(TEAMS)],
            profile=profile,
            gpus=held,
            **extra,
        ))
    return Fleet(seed, tuple(fleet), free=tuple(gpus[allocated:]), scheduler=scheduler)


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
