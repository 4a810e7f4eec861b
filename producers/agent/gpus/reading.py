"""What the host agent reads of one GPU (or MIG instance) per tick, from NVML or the simulated
fleet: the readings and the processes on it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GpuProcess:
    pid: int
    used_memory_bytes: int | None = None
    sm_util_pct: float | None = None
    mem_util_pct: float | None = None


@dataclass
class GpuReading:
    index: int
    uuid: str
    name: str
    parent_uuid: str | None = None  # set for MIG instances
    mig_gi_id: int | None = None
    mig_ci_id: int | None = None
    utilization_pct: float | None = None
    memory_utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules_total: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    clock_event_reasons: int | None = None
    pcie_tx_bytes_per_s: int | None = None
    pcie_rx_bytes_per_s: int | None = None
    ecc_uncorrected_volatile: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    sm_active_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_active_pct: float | None = None
    dram_bw_pct: float | None = None
    xids: list[int] = field(default_factory=list)
    processes: list[GpuProcess] = field(default_factory=list)
    minor_number: int | None = None  # of /dev/nvidia<N>: how schedulers (Slurm's GRES files) name the GPU
