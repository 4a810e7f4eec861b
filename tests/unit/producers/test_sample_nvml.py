import logging

import pynvml
import pytest

from producers.agent.gpus.sample_nvml import NO_DRIVER, NvmlSampler, NvmlUnavailable
from tests.support.fake_nvml import FakeGpu, FakeNvml, FakeProcess


def sampler(gpus, **kw):
    s = NvmlSampler(FakeNvml(gpus, **kw))
    s.open()
    return s


def test_every_field_of_a_gpu():
    gpu = FakeGpu("GPU-a", processes=[FakeProcess(100, used_memory=2 << 30, sm_util=70, mem_util=30)])
    s = sampler([gpu])
    (first,) = s.tick()
    assert first.pcie_tx_bytes_per_s is None  # a rate needs two readings of the byte counters
    assert [(p.pid, p.used_memory_bytes, p.sm_util_pct) for p in first.processes] == [(100, 2 << 30, 70.0)]
    (r,) = s.tick()
    assert (r.uuid, r.name, r.index) == ("GPU-a", "NVIDIA A100-SXM4-80GB", 0)
    assert (r.utilization_pct, r.memory_utilization_pct) == (50.0, 20.0)
    assert (r.memory_used_bytes, r.memory_total_bytes) == (10 << 30, 80 << 30)
    assert (r.power_watts, r.power_limit_watts, r.energy_joules_total) == (250.0, 400.0, 1000.0)
    assert (r.temperature_c, r.sm_clock_mhz, r.sm_clock_max_mhz, r.mem_clock_mhz) == (60.0, 1410, 1410, 1593)
    assert (r.pcie_tx_bytes_per_s, r.pcie_rx_bytes_per_s) == (1_024_000, 2_048_000)
    assert (r.ecc_uncorrected_volatile, r.remapped_rows_uncorrectable, r.remapped_rows_pending) == (0, 0, False)
    assert r.clock_event_reasons == 0 and r.xids == []
    assert r.sm_active_pct is None  # no GPM on this GPU


def test_no_new_process_samples_is_not_an_error(caplog):
    nvml = FakeNvml([FakeGpu("GPU-a", processes=[FakeProcess(7, sm_util=40)])])
    s = NvmlSampler(nvml)
    s.open()
    assert s.tick()[0].processes[0].sm_util_pct == 40.0
    with caplog.at_level(logging.WARNING):
        again = s.tick()[0]  # same timestamp: NVML answers NotFound
    assert again.processes[0].pid == 7 and again.processes[0].sm_util_pct is None
    assert "process_utilization" not in caplog.text


def test_gpm_metrics_need_two_samples():
    gpu = FakeGpu(
        "GPU-h", name="NVIDIA H100 80GB HBM3", gpm={"sm": 91.0, "occupancy": 40.0, "tensor": 55.0, "dram": 30.0}
    )
    s = sampler([gpu])
    first = s.tick()[0]
    assert first.sm_active_pct is None
    second = s.tick()[0]
    assert (second.sm_active_pct, second.sm_occupancy_pct, second.tensor_active_pct, second.dram_bw_pct) == (
        91.0, 40.0, 55.0, 30.0)


def test_pcie_rates_come_from_gpm_or_the_byte_counters_not_from_the_blocking_call():
    """nvmlDeviceGetPcieThroughput counts bytes for ~20 ms per call: GPM has the rates for free,
    and so do the PCIe byte counters (two readings a tick apart); only a driver without either
    pays for the call."""
    gpu = FakeGpu("GPU-h", name="NVIDIA H200", gpm={"sm": 1.0, "occupancy": 1.0, "tensor": 1.0, "dram": 1.0,
                                                   "pcie_tx_mib": 1.5, "pcie_rx_mib": 3.0})
    old = FakeGpu("GPU-old", unsupported_fields={pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
                                                 pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES})
    nvml = FakeNvml([gpu, FakeGpu("GPU-a100"), old])
    s = NvmlSampler(nvml)
    s.open()
    s.tick()
    h200, a100, older = s.tick()
    assert (h200.pcie_tx_bytes_per_s, h200.pcie_rx_bytes_per_s) == (int(1.5 * 2**20), 3 * 2**20)
    assert (a100.pcie_tx_bytes_per_s, a100.pcie_rx_bytes_per_s) == (1_024_000, 2_048_000)
    assert (older.pcie_tx_bytes_per_s, older.pcie_rx_bytes_per_s) == (1000 * 1024, 2000 * 1024)
    assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 2 * 2  # the old driver's GPU: two per tick
    assert (a100.sm_clock_max_mhz, a100.mem_clock_max_mhz) == (1410, 1593)
    assert nvml.calls["nvmlDeviceGetMaxClockInfo"] == 3 * 2  # once per device: maxima do not change


def test_a_failing_call_is_logged_once_and_leaves_the_field_empty(caplog):
    # A driver without field values on this GPU: its calls one by one, one of which fails.
    bad = FakeGpu("GPU-bad", failing={"nvmlDeviceGetFieldValues", "nvmlDeviceGetPowerUsage"})
    good = FakeGpu("GPU-good")
    s = sampler([bad, good])
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            readings = s.tick()
    assert readings[0].power_watts is None and readings[0].utilization_pct == 50.0
    assert readings[1].power_watts == 250.0
    assert caplog.text.count("NVML power failed on GPU-bad") == 1


def test_without_field_values_the_readings_are_the_same(caplog):
    batched, single = sampler([FakeGpu("GPU-a")]), NvmlSampler(FakeNvml([FakeGpu("GPU-a")]), batched=False)
    single.open()
    for _ in range(3):
        (a,), (b,) = batched.tick(), single.tick()
    assert (a.power_watts, a.energy_joules_total) == (b.power_watts, b.energy_joules_total) == (250.0, 1000.0)
    assert a.pcie_tx_bytes_per_s == 1_024_000 and b.pcie_tx_bytes_per_s == 1000 * 1024  # counters vs NVML's own


def test_what_changes_rarely_is_read_every_so_many_ticks_and_carried_between():
    gpu = FakeGpu("GPU-a")
    nvml = FakeNvml([gpu])
    s = NvmlSampler(nvml, slow_every=10)
    s.open()
    readings = [s.tick()[0] for _ in range(25)]
    assert nvml.calls["nvmlDeviceGetTotalEccErrors"] == nvml.calls["nvmlDeviceGetRemappedRows"] == 3  # ticks 0, 10, 20
    assert nvml.calls["nvmlDeviceGetEnforcedPowerLimit"] == 3
    assert all(r.power_limit_watts == 400.0 and r.ecc_uncorrected_volatile == 0 for r in readings)


def test_mig_instances_are_devices_of_their_own():
    parent = FakeGpu("GPU-p", mig=[FakeGpu("MIG-1", name="A100 1g.10gb", gi_id=1, ci_id=0, util=10),
                                  FakeGpu("MIG-2", name="A100 3g.40gb", gi_id=2, ci_id=0, util=90)])
    readings = sampler([parent, FakeGpu("GPU-plain")]).tick()
    assert [(r.uuid, r.parent_uuid, r.mig_gi_id, r.index) for r in readings] == [
        ("MIG-1", "GPU-p", 1, 0), ("MIG-2", "GPU-p", 2, 0), ("GPU-plain", None, None, 1)]
    assert [r.utilization_pct for r in readings] == [10.0, 90.0, 50.0]


def test_xid_events_are_attributed_to_their_gpu():
    a, b = FakeGpu("GPU-a"), FakeGpu("GPU-b")
    nvml = FakeNvml([a, b])
    s = NvmlSampler(nvml)
    s.open()
    nvml.xid_queue += [(b, 79), (b, 48)]
    readings = s.tick()
    assert readings[0].xids == [] and readings[1].xids == [79, 48]
    assert s.tick()[1].xids == []


def test_missing_driver_says_what_to_do():
    with pytest.raises(NvmlUnavailable, match=NO_DRIVER):
        NvmlSampler(FakeNvml([], driver=False)).open()
