"""A fake of the pynvml module for tests: the same functions, constants and exception classes,
answering from GPUs described in Python. Only ``producers.agent.gpus.sample_nvml`` talks to it."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml  # constants, error classes and ctypes structs only; the library is never loaded


@dataclass
class FakeProcess:
    pid: int
    used_memory: int | None = 1 << 30
    sm_util: int | None = None  # None: no utilisation sample for this process
    mem_util: int = 0


@dataclass(eq=False)  # a handle: compared and hashed by identity, as NVML's are by address
class FakeGpu:
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    util: int = 50
    mem_util: int = 20
    mem_used: int = 10 << 30
    mem_total: int = 80 << 30
    power_mw: int = 250_000
    power_limit_mw: int = 400_000
    energy_mj: int = 1_000_000
    temp: int = 60
    sm_clock: int = 1410
    mem_clock: int = 1593
    clock_events: int = 0
    processes: list[FakeProcess] = field(default_factory=list)
    gpm: dict | None = None  # {"sm": .., "occupancy": .., "tensor": .., "dram": ..} on GPM-capable GPUs
    mig: list[FakeGpu] = field(default_factory=list)  # MIG instances, when MIG mode is on
    gi_id: int | None = None
    ci_id: int | None = None
    failing: set[str] = field(default_factory=set)  # function names that raise NVMLError_Unknown
    pcie_tx_rate: int = 1_024_000  # bytes/s; the PCIe byte counters grow by this each second
    pcie_rx_rate: int = 2_048_000
    unsupported_fields: set[int] = field(default_factory=set)  # field ids answered NOT_SUPPORTED
    field_reads: int = 0  # nvmlDeviceGetFieldValues calls so far: one simulated second apart
    minor: int | None = None  # /dev/nvidia<minor>; None: NVML does not say


class FakeNvml:
    def __init__(self, gpus: list[FakeGpu], driver: bool = True) -> None:
        self.gpus = gpus
        self.driver = driver
        self.calls: dict[str, int] = {}
        self.xid_queue: list[tuple[FakeGpu, int]] = []
        self.process_ts = 1000
        self._gpm_samples: dict[int, dict] = {}
        self._keep = []
        for name in dir(pynvml):
            if name.startswith(("NVML_", "NVMLError", "nvmlEventType")) or name == "c_nvmlGpmMetricsGet_t":
                setattr(self, name, getattr(pynvml, name))

    # -- helpers ---------------------------------------------------------------------------------
    def _gpu(self, handle: FakeGpu, fn: str) -> FakeGpu:
        self.calls[fn] = self.calls.get(fn, 0) + 1
        if fn in handle.failing:
            raise pynvml.NVMLError_Unknown()
        return handle

    # -- library -------------------------------------------------------------------------------
    def nvmlInit(self):
        if not self.driver:
            raise pynvml.NVMLError_LibraryNotFound()

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h):
        return h.uuid

    def nvmlDeviceGetName(self, h):
        return h.name

    def nvmlDeviceGetMinorNumber(self, h):
        if h.minor is None:
            raise self.NVMLError_NotSupported()
        return h.minor

    # -- MIG -------------------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, h):
        if "nvmlDeviceGetMigMode" in h.failing or not h.mig and h.gi_id is None and h.name.startswith("Tesla"):
            raise pynvml.NVMLError_NotSupported()
        return [1 if h.mig else 0, 1 if h.mig else 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, j):
        if j >= len(h.mig):
            raise pynvml.NVMLError_NotFound()
        return h.mig[j]

    def nvmlDeviceGetGpuInstanceId(self, h):
        return h.gi_id

    def nvmlDeviceGetComputeInstanceId(self, h):
        return h.ci_id

    # -- readings ------------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, h):
        g = self._gpu(h, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=g.util, memory=g.mem_util)

    def nvmlDeviceGetMemoryInfo(self, h):
        g = self._gpu(h, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(used=g.mem_used, total=g.mem_total, free=g.mem_total - g.mem_used)

    def nvmlDeviceGetPowerUsage(self, h):
        return self._gpu(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._gpu(h, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return self._gpu(h, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._gpu(h, "nvmlDeviceGetTemperature").temp

    def nvmlDeviceGetClockInfo(self, h, clock):
        g = self._gpu(h, "nvmlDeviceGetClockInfo")
        return g.sm_clock if clock == pynvml.NVML_CLOCK_SM else g.mem_clock

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        self._gpu(h, "nvmlDeviceGetMaxClockInfo")
        return 1410 if clock == pynvml.NVML_CLOCK_SM else 1593

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._gpu(h, "nvmlDeviceGetCurrentClocksEventReasons").clock_events

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        self._gpu(h, "nvmlDeviceGetPcieThroughput")
        return 1000 if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 2000  # KB/s

    def nvmlDeviceGetFieldValues(self, h, field_ids):
        """As the driver answers: a value per field with its type and timestamp (us); the PCIe
        byte counters have grown by a second's worth since the previous call."""
        g = self._gpu(h, "nvmlDeviceGetFieldValues")
        g.field_reads += 1
        now_s = g.field_reads
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        answers = {
            pynvml.NVML_FI_DEV_POWER_INSTANT: (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", g.power_mw),
            pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal",
                                                          g.energy_mj),
            pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal",
                                                     g.pcie_tx_rate * now_s),
            pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal",
                                                     g.pcie_rx_rate * now_s),
        }
        for i, fid in enumerate(field_ids):
            values[i].fieldId, values[i].timestamp = fid, now_s * 1_000_000
            if fid in g.unsupported_fields or fid not in answers:
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            values[i].valueType, member, value = answers[fid]
            setattr(values[i].value, member, value)
            values[i].nvmlReturn = 0
        return values

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        self._gpu(h, "nvmlDeviceGetTotalEccErrors")
        return 0

    def nvmlDeviceGetRemappedRows(self, h):
        self._gpu(h, "nvmlDeviceGetRemappedRows")
        return (0, 0, 0, 0)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        g = self._gpu(h, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_memory) for p in g.processes]

    def nvmlDeviceGetProcessUtilization(self, h, last_seen):
        g = self._gpu(h, "nvmlDeviceGetProcessUtilization")
        samples = [SimpleNamespace(pid=p.pid, timeStamp=self.process_ts, smUtil=p.sm_util, memUtil=p.mem_util)
                   for p in g.processes if p.sm_util is not None and self.process_ts > last_seen]
        if not samples:
            raise pynvml.NVMLError_NotFound()
        return samples

    # -- GPM -------------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, h):
        return SimpleNamespace(isSupportedDevice=1 if h.gpm is not None else 0)

    def nvmlGpmSampleAlloc(self):
        struct = pynvml.struct_c_nvmlGpmSample_t()
        self._keep.append(struct)
        return ctypes.pointer(struct)

    def nvmlGpmSampleFree(self, sample):
        pass

    def nvmlGpmSampleGet(self, h, sample):
        self._gpu(h, "nvmlGpmSampleGet")
        self._gpm_samples[ctypes.addressof(sample.contents)] = dict(h.gpm)
        return sample

    def nvmlGpmMetricsGet(self, get):
        self.calls["nvmlGpmMetricsGet"] = self.calls.get("nvmlGpmMetricsGet", 0) + 1
        second = self._gpm_samples[ctypes.addressof(get.sample2.contents)]
        assert ctypes.addressof(get.sample1.contents) in self._gpm_samples, "GPM needs two samples"
        values = {
            pynvml.NVML_GPM_METRIC_SM_UTIL: second["sm"],
            pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: second["occupancy"],
            pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: second["tensor"],
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: second["dram"],
            pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: second.get("pcie_tx_mib", 0.0),
            pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: second.get("pcie_rx_mib", 0.0),
        }
        for i in range(get.numMetrics):
            get.metrics[i].value = values[get.metrics[i].metricId]
            get.metrics[i].nvmlReturn = 0
        return get

    # -- events ------------------------------------------------------------------------------
    def nvmlEventSetCreate(self):
        return "event-set"

    def nvmlEventSetFree(self, events):
        pass

    def nvmlDeviceRegisterEvents(self, h, types, events):
        if "nvmlDeviceRegisterEvents" in h.failing:
            raise pynvml.NVMLError_NotSupported()

    def nvmlEventSetWait_v2(self, events, timeout_ms):
        if not self.xid_queue:
            raise pynvml.NVMLError_Timeout()
        gpu, xid = self.xid_queue.pop(0)
        return SimpleNamespace(device=gpu, eventData=xid, eventType=pynvml.nvmlEventTypeXidCriticalError)
