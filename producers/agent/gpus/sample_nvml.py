"""Samples every NVIDIA GPU (and MIG instance) of the host through NVML -> ``GpuReading``s.

The only module that touches ``pynvml`` (package ``nvidia-ml-py``); tests hand it a fake
module with the same functions. A call that fails for one GPU is logged once per GPU and
kind, its field is None, and the loop goes on. Per tick and device: utilisation, memory,
power and its limit, the energy counter, temperature, SM and memory clocks and their
maxima, clock-event (throttle) reasons, PCIe throughput, ECC and remapped-row counters,
XID events (from an NVML event set, polled without blocking), running compute processes
with their memory and SM/memory utilisation, and on GPM-capable GPUs (Hopper and newer)
SM activity, SM occupancy, tensor activity and DRAM bandwidth from two GPM samples.

What it costs: on a real H200 a tick took 9.6 ms of NVML calls per GPU, and
``nvmlDeviceGetPcieThroughput`` alone blocks about 20 ms a call while NVML counts bytes. So the
fast-changing counters (power, the energy counter, and the PCIe byte counters from which the
rates are the difference between two ticks) come in one ``nvmlDeviceGetFieldValues`` call per
device, and what changes rarely (power limit, ECC and remapped-row counters; maximum clocks
never) is read every ``slow_every`` ticks and carried in between. A driver without field values
(or without one of the fields) gets the single calls, as before. ``calls_per_tick`` in
``benchmarks/bench_agent.py`` counts them with the fake.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from producers.agent.gpus.reading import GpuProcess, GpuReading

log = logging.getLogger(__name__)

NO_DRIVER = "no NVIDIA driver found; use --source sim"


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this host (no library, no driver)."""


@dataclass
class _Device:
    handle: Any
    index: int
    uuid: str
    name: str
    parent_uuid: str | None = None
    mig_gi_id: int | None = None
    mig_ci_id: int | None = None
    minor_number: int | None = None
    gpm_samples: list[Any] | None = None  # [previous, current] when GPM is supported
    gpm_primed: bool = False
    last_process_ts: int = 0
    max_clocks: tuple[int | None, int | None] | None = None  # (SM, memory): fixed, read once
    fields: bool = True  # whether nvmlDeviceGetFieldValues answers on this device
    pcie_counts: tuple[int, int, int] | None = None  # (timestamp us, TX bytes, RX bytes) at the last tick
    slow: tuple | None = None  # (power limit W, ECC uncorrected, remapped uncorrectable, pending)
    ticks: int = 0


class NvmlSampler:
    def __init__(self, nvml: ModuleType | None = None, gpm: bool = True, slow_every: int = 60,
                 batched: bool = True) -> None:
        self.nvml = nvml
        self.gpm = gpm
        self.slow_every = max(1, slow_every)  # ticks between reads of what changes rarely
        self.batched = batched  # field values in one call; False: a call per field (the baseline)
        self.devices: list[_Device] = []
        self._events: Any = None
        self._failed: set[tuple[str, str]] = set()
        self._by_handle: dict[int, _Device] = {}

    # -- life cycle ------------------------------------------------------------------------
    def open(self) -> list[_Device]:
        if self.nvml is None:
            try:
                self.nvml = importlib.import_module("pynvml")
            except ImportError as exc:
                raise NvmlUnavailable(f"{NO_DRIVER} (nvidia-ml-py is not installed)") from exc
        n = self.nvml
        try:
            n.nvmlInit()
        except n.NVMLError as exc:
            raise NvmlUnavailable(f"{NO_DRIVER} ({exc})") from exc
        for i in range(n.nvmlDeviceGetCount()):
            handle = n.nvmlDeviceGetHandleByIndex(i)
            device = _Device(handle, i, _text(n.nvmlDeviceGetUUID(handle)), _text(n.nvmlDeviceGetName(handle)),
                             minor_number=self._try(None, "minor", lambda h=handle: n.nvmlDeviceGetMinorNumber(h),
                                                    quiet=True))
            migs = self._mig_devices(device)
            self.devices.extend(migs or [device])
        for d in self.devices:
            self._by_handle[_key(d.handle)] = d
            if self.gpm:
                self._open_gpm(d)
        self._open_events()
        return self.devices

    def close(self) -> None:
        n = self.nvml
        if n is None:
            return
        for d in self.devices:
            for s in d.gpm_samples or []:
                self._try(d, "gpm", lambda s=s: n.nvmlGpmSampleFree(s))
        if self._events is not None:
            self._try(None, "events", lambda: n.nvmlEventSetFree(self._events))
        try:
            n.nvmlShutdown()
        except n.NVMLError as exc:
            log.warning("NVML shutdown failed: %s", exc)

    def _mig_devices(self, parent: _Device) -> list[_Device]:
        n = self.nvml
        mode = self._try(parent, "mig", lambda: n.nvmlDeviceGetMigMode(parent.handle))
        if not mode or not mode[0]:
            return []
        count = self._try(parent, "mig", lambda: n.nvmlDeviceGetMaxMigDeviceCount(parent.handle)) or 0
        out = []
        for j in range(count):
            try:
                h = n.nvmlDeviceGetMigDeviceHandleByIndex(parent.handle, j)
            except n.NVMLError_NotFound:
                continue
            except n.NVMLError as exc:
                self._fail(parent, "mig", exc)
                continue
            out.append(_Device(
                h, parent.index, _text(n.nvmlDeviceGetUUID(h)), _text(n.nvmlDeviceGetName(h)),
                parent_uuid=parent.uuid, minor_number=parent.minor_number,
                mig_gi_id=self._try(parent, "mig", lambda h=h: n.nvmlDeviceGetGpuInstanceId(h)),
                mig_ci_id=self._try(parent, "mig", lambda h=h: n.nvmlDeviceGetComputeInstanceId(h)),
            ))
        return out

    def _open_gpm(self, d: _Device) -> None:
        n = self.nvml
        support = self._try(d, "gpm", lambda: n.nvmlGpmQueryDeviceSupport(d.handle), quiet=True)
        if support is not None and getattr(support, "isSupportedDevice", 0):
            d.gpm_samples = [n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()]

    def _open_events(self) -> None:
        n = self.nvml
        events = self._try(None, "events", n.nvmlEventSetCreate)
        if events is None:
            return
        registered = False
        for d in self.devices:
            if d.parent_uuid is not None:
                continue  # XIDs are reported on the physical GPU
            try:
                n.nvmlDeviceRegisterEvents(d.handle, n.nvmlEventTypeXidCriticalError, events)
                registered = True
            except n.NVMLError as exc:
                self._fail(d, "xid", exc)
        self._events = events if registered else None

    # -- sampling ----------------------------------------------------------------------------
    def tick(self) -> list[GpuReading]:
        """One reading per device (MIG instances are devices of their own)."""
        xids = self._drain_xids()
        return [self._read(d, xids.get(d.uuid, [])) for d in self.devices]

    def _read(self, d: _Device, xids: list[int]) -> GpuReading:
        n, h = self.nvml, d.handle
        r = GpuReading(d.index, d.uuid, d.name, d.parent_uuid, d.mig_gi_id, d.mig_ci_id, xids=xids,
                       minor_number=d.minor_number)
        util = self._try(d, "utilization", lambda: n.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            r.utilization_pct, r.memory_utilization_pct = float(util.gpu), float(util.memory)
        mem = self._try(d, "memory", lambda: n.nvmlDeviceGetMemoryInfo(h))
        if mem is not None:
            r.memory_used_bytes, r.memory_total_bytes = int(mem.used), int(mem.total)
        fields = self._fields(d, not d.gpm_samples)
        power, energy = fields.get(n.NVML_FI_DEV_POWER_INSTANT), fields.get(n.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION)
        if power is None:
            power = self._try(d, "power", lambda: n.nvmlDeviceGetPowerUsage(h))
        if energy is None:
            energy = self._try(d, "energy", lambda: n.nvmlDeviceGetTotalEnergyConsumption(h))
        r.power_watts, r.energy_joules_total = _scale(power, 1e-3), _scale(energy, 1e-3)
        temp = self._try(d, "temperature", lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
        r.temperature_c = None if temp is None else float(temp)
        r.sm_clock_mhz = self._try(d, "clocks", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))
        r.mem_clock_mhz = self._try(d, "clocks", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM))
        if d.max_clocks is None:  # about 1.6 ms a call on an H200, and they never change
            d.max_clocks = (self._try(d, "max_clocks", lambda: n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM)),
                            self._try(d, "max_clocks", lambda: n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_MEM)))
        r.sm_clock_max_mhz, r.mem_clock_max_mhz = d.max_clocks
        r.clock_event_reasons = self._try(d, "clock_events", lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h))
        if not d.gpm_samples:  # GPM devices report the PCIe rates from their two samples (``_gpm``)
            self._pcie(d, r, fields)
        if d.slow is None or d.ticks % self.slow_every == 0:
            d.slow = self._slow(d)
        d.ticks += 1
        (r.power_limit_watts, r.ecc_uncorrected_volatile, r.remapped_rows_uncorrectable,
         r.remapped_rows_pending) = d.slow
        r.processes = self._processes(d)
        self._gpm(d, r)
        return r

    def _fields(self, d: _Device, pcie: bool) -> dict[int, Any]:
        """The fast-changing counters of ``d`` in one call: field id -> value (PCIe counters:
        (value, timestamp in us)); a field the device does not answer is left out."""
        n = self.nvml
        if not (self.batched and d.fields):
            return {}
        ids = [n.NVML_FI_DEV_POWER_INSTANT, n.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]
        if pcie:
            ids += [n.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, n.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]
        try:
            values = n.nvmlDeviceGetFieldValues(d.handle, ids)
        except n.NVMLError as exc:  # an older driver: a call per value from now on
            d.fields = False
            log.info("NVML field values not available on %s (%s): reading each value on its own", d.uuid, exc)
            return {}
        out = {}
        for v in list(values)[:len(ids)]:
            if v.nvmlReturn == 0:
                value = _field_value(n, v)
                out[v.fieldId] = (value, int(v.timestamp)) if v.fieldId in ids[2:] else value
        return out

    def _pcie(self, d: _Device, r: GpuReading, fields: dict[int, Any]) -> None:
        """PCIe rates: the byte counters' rise since the previous tick where the driver has
        them (free), else NVML's own throughput (about 20 ms a call while it counts)."""
        n, h = self.nvml, d.handle
        tx, rx = fields.get(n.NVML_FI_DEV_PCIE_COUNT_TX_BYTES), fields.get(n.NVML_FI_DEV_PCIE_COUNT_RX_BYTES)
        if tx is not None and rx is not None:
            now = (tx[1], tx[0], rx[0])
            before, d.pcie_counts = d.pcie_counts, now
            if before is not None and now[0] > before[0] and now[1] >= before[1] and now[2] >= before[2]:
                seconds = (now[0] - before[0]) / 1e6
                r.pcie_tx_bytes_per_s = int((now[1] - before[1]) / seconds)
                r.pcie_rx_bytes_per_s = int((now[2] - before[2]) / seconds)
            return
        r.pcie_tx_bytes_per_s = _scale(self._try(d, "pcie", lambda: n.nvmlDeviceGetPcieThroughput(
            h, n.NVML_PCIE_UTIL_TX_BYTES)), 1024, int)
        r.pcie_rx_bytes_per_s = _scale(self._try(d, "pcie", lambda: n.nvmlDeviceGetPcieThroughput(
            h, n.NVML_PCIE_UTIL_RX_BYTES)), 1024, int)

    def _slow(self, d: _Device) -> tuple:
        """What changes rarely: power limit (W), uncorrected ECC errors, remapped rows
        (uncorrectable, pending)."""
        n, h = self.nvml, d.handle
        limit = _scale(self._try(d, "power_limit", lambda: n.nvmlDeviceGetEnforcedPowerLimit(h)), 1e-3)
        ecc = self._try(d, "ecc", lambda: n.nvmlDeviceGetTotalEccErrors(
            h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC))
        rows = self._try(d, "remapped_rows", lambda: n.nvmlDeviceGetRemappedRows(h))
        # (correctable, uncorrectable, pending, failure)
        return (limit, ecc, *((None, None) if rows is None else (int(rows[1]), bool(rows[2]))))

    def _processes(self, d: _Device) -> list[GpuProcess]:
        n, h = self.nvml, d.handle
        running = self._try(d, "processes", lambda: n.nvmlDeviceGetComputeRunningProcesses(h)) or []
        procs = {p.pid: GpuProcess(p.pid, _memory(p.usedGpuMemory)) for p in running}
        try:
            samples = n.nvmlDeviceGetProcessUtilization(h, d.last_process_ts)
        except n.NVMLError_NotFound:
            samples = []  # no new samples since the last call: not an error
        except n.NVMLError as exc:
            self._fail(d, "process_utilization", exc)
            samples = []
        for s in samples:
            d.last_process_ts = max(d.last_process_ts, int(s.timeStamp))
            p = procs.setdefault(s.pid, GpuProcess(s.pid))
            p.sm_util_pct, p.mem_util_pct = float(s.smUtil), float(s.memUtil)
        return sorted(procs.values(), key=lambda p: p.pid)

    def _gpm(self, d: _Device, r: GpuReading) -> None:
        if not d.gpm_samples:
            return
        n = self.nvml
        previous, current = d.gpm_samples
        if self._try(d, "gpm", lambda: n.nvmlGpmSampleGet(d.handle, current)) is None:
            return
        if d.gpm_primed:
            get = n.c_nvmlGpmMetricsGet_t()
            get.version = n.NVML_GPM_METRICS_GET_VERSION
            get.sample1, get.sample2 = previous, current
            ids = (n.NVML_GPM_METRIC_SM_UTIL, n.NVML_GPM_METRIC_SM_OCCUPANCY,
                   n.NVML_GPM_METRIC_ANY_TENSOR_UTIL, n.NVML_GPM_METRIC_DRAM_BW_UTIL,
                   n.NVML_GPM_METRIC_PCIE_TX_PER_SEC, n.NVML_GPM_METRIC_PCIE_RX_PER_SEC)
            get.numMetrics = len(ids)
            for i, metric in enumerate(ids):
                get.metrics[i].metricId = metric
            got = self._try(d, "gpm", lambda: n.nvmlGpmMetricsGet(get))
            if got is not None:
                values = [m.value if m.nvmlReturn == 0 else None for m in list(got.metrics)[:len(ids)]]
                r.sm_active_pct, r.sm_occupancy_pct, r.tensor_active_pct, r.dram_bw_pct = values[:4]
                # GPM counts PCIe traffic in MiB/s.
                r.pcie_tx_bytes_per_s, r.pcie_rx_bytes_per_s = (
                    None if v is None else int(v * (1 << 20)) for v in values[4:])
        d.gpm_samples = [current, previous]
        d.gpm_primed = True

    def _drain_xids(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        if self._events is None:
            return out
        n = self.nvml
        while True:
            try:
                data = n.nvmlEventSetWait_v2(self._events, 0)
            except n.NVMLError_Timeout:
                return out
            except n.NVMLError as exc:
                self._fail(None, "xid", exc)
                return out
            device = self._by_handle.get(_key(data.device))
            uuid = device.uuid if device else "unknown"
            out.setdefault(uuid, []).append(int(data.eventData))

    # -- errors ---------------------------------------------------------------------------------
    def _try(self, d: _Device | None, kind: str, fn: Callable[[], Any], quiet: bool = False) -> Any:
        try:
            return fn()
        except self.nvml.NVMLError as exc:
            if not quiet:
                self._fail(d, kind, exc)
            return None

    def _fail(self, d: _Device | None, kind: str, exc: Exception) -> None:
        key = (d.uuid if d else "-", kind)
        if key not in self._failed:
            self._failed.add(key)
            log.warning("NVML %s failed on %s: %s (the field is left empty from now on)",
                        kind, d.uuid if d else "the host", exc)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _key(handle: Any) -> Any:
    """Identity of a device handle: its address for NVML's ctypes pointers (each call returns a
    new pointer object), the handle itself otherwise."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


def _scale(value: Any, factor: float, cast: Callable = float) -> Any:
    return None if value is None else cast(value * factor)


def _field_value(n: Any, v: Any) -> Any:
    """The value of an ``nvmlFieldValue_t``, from the member of its union its type names."""
    member = {n.NVML_VALUE_TYPE_DOUBLE: "dVal", n.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
              n.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal", n.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
              n.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal", n.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
              n.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal"}.get(v.valueType, "ullVal")
    return getattr(v.value, member)


def _memory(value: Any) -> int | None:
    # NVML reports "not available" (e.g. under some MIG or WDDM setups) as None or a huge sentinel.
    if value is None or value >= 2**63:
        return None
    return int(value)
