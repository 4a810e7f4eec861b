"""What the host saw while a rank was profiled: its GPUs through NVML and the host's CPU and
I/O, at the profile's sampling rate (10 Hz by default), summarised onto the trace's end marker.

A trace shows *that* the GPU waited on the host; the context says *why*: a GPU idle in the
trace while the host's CPUs are saturated is a CPU-bound input pipeline, while its I/O wait is
high a storage-bound one. The analysis turns these into findings and the root cause of the
owner's alert (``streams/traces/rules.py``, ``streams/profiling/root_cause.py``).

Every mean is weighted by the time each sample stands for (its ``interval_ms``), so a slow
tick counts for what it covered.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Mean:
    total: float = 0.0
    weight: float = 0.0

    def add(self, value: float | None, weight: float) -> None:
        if value is not None and weight > 0:
            self.total += value * weight
            self.weight += weight

    def value(self) -> float | None:
        return self.total / self.weight if self.weight > 0 else None


@dataclass
class ProfileContext:
    """Accumulates one capture's context: the samples of ``workflow_id`` on this host, and of
    the profiled ``rank``'s GPUs alone when the samples carry ranks."""

    workflow_id: str
    rank: int | None = None
    ticks: int = 0
    span_ms: int = 0
    gpus: set[str] = field(default_factory=set)
    _util: _Mean = field(default_factory=_Mean)
    _zero_ms: float = 0.0
    _sm_active: _Mean = field(default_factory=_Mean)
    _power: _Mean = field(default_factory=_Mean)
    _memory_peak: float | None = None
    _workflow_cpu: _Mean = field(default_factory=_Mean)
    _host_cpu: _Mean = field(default_factory=_Mean)
    _iowait: _Mean = field(default_factory=_Mean)

    def add(self, samples: list[dict], host: dict) -> None:
        """One agent tick: its ``GpuSample`` dicts (any workflow) and its ``HostSample``."""
        interval = host["interval_ms"]
        self.ticks += 1
        self.span_ms += interval
        self._host_cpu.add(host.get("cpu_pct"), interval)
        self._iowait.add(host.get("iowait_pct"), interval)
        for w in host.get("workflows") or ():
            if w["workflow_id"] == self.workflow_id:
                self._workflow_cpu.add(w["cpu_pct"], interval)
        mine = [s for s in samples if s["workflow_id"] == self.workflow_id]
        if self.rank is not None and any(s.get("rank") == self.rank for s in mine):
            mine = [s for s in mine if s.get("rank") == self.rank]
        for s in mine:
            dt = s["interval_ms"] * (s.get("share") or 1.0)
            self.gpus.add(s["gpu_uuid"])
            self._util.add(s["utilization_pct"], dt)
            if s["utilization_pct"] == 0:
                self._zero_ms += dt
            self._sm_active.add(s.get("sm_active_pct"), dt)
            self._power.add(s.get("power_watts"), s["interval_ms"])
            used, total = s.get("memory_used_bytes"), s.get("memory_total_bytes")
            if used is not None and total:
                self._memory_peak = max(self._memory_peak or 0.0, used / total)

    def summary(self) -> dict:
        """The ``ProfileSystemContext`` record of the capture so far."""
        return {
            "ticks": self.ticks,
            "span_ms": self.span_ms,
            "interval_ms_mean": self.span_ms / self.ticks if self.ticks else None,
            "gpus": len(self.gpus),
            "gpu_utilization_mean_pct": self._util.value(),
            "gpu_zero_utilization_share": self._zero_ms / self._util.weight if self._util.weight else None,
            "sm_active_mean_pct": self._sm_active.value(),
            "power_mean_watts": self._power.value(),
            "memory_peak_fraction": self._memory_peak,
            "workflow_cpu_mean_pct": self._workflow_cpu.value(),
            "host_cpu_mean_pct": self._host_cpu.value(),
            "host_iowait_mean_pct": self._iowait.value(),
        }
