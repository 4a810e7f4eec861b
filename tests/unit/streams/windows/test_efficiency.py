"""Where a workflow window's GPU-seconds went, worked out by hand."""

import pytest

from tests.support.samples import BASE_MS, sample
from tests.support.windows import close_one


def test_active_wasted_and_zero_gpu_seconds_and_percentiles():
    # GPU-0 at 100 % for 30 s and 0 % for 30 s; GPU-1 at 50 % for 60 s.
    samples = [sample(event_time=BASE_MS + t * 1000, gpu_uuid="GPU-0", utilization_pct=100.0 if t < 30 else 0.0)
               for t in range(60)]
    samples += [sample(event_time=BASE_MS + t * 1000, gpu_uuid="GPU-1", utilization_pct=50.0) for t in range(60)]
    w = close_one(samples)
    assert w["gpu_seconds"] == 120.0
    assert w["active_gpu_seconds"] == 90.0 and w["zero_util_gpu_seconds"] == 30.0
    assert w["wasted_gpu_seconds"] == pytest.approx(30 + 30)  # 30 s at 0 % + 60 s at half
    assert w["utilization_p50_pct"] == 50.0 and w["utilization_p95_pct"] == 100.0
    assert w["gpu_imbalance_pct"] == 0.0  # both GPUs average 50 % over the window
    assert w["idle_gpus"] == 0


def test_idle_gpu_imbalance_memory_power_and_health():
    samples = []
    for t in range(60):
        samples.append(sample(event_time=BASE_MS + t * 1000, gpu_uuid="GPU-0", utilization_pct=90.0,
                              memory_used_bytes=40 << 30, memory_total_bytes=80 << 30, power_watts=300.0,
                              sm_active_pct=70.0, tensor_active_pct=20.0,
                              clock_event_reasons=0x20 if t < 15 else 0, xids=[79] if t == 3 else []))
        samples.append(sample(event_time=BASE_MS + t * 1000, gpu_uuid="GPU-1", utilization_pct=0.0,
                              memory_used_bytes=8 << 30, memory_total_bytes=80 << 30, power_watts=100.0))
    w = close_one(samples)
    assert w["idle_gpus"] == 1 and w["gpu_imbalance_pct"] == 90.0
    assert w["memory_peak_fraction"] == 0.5 and w["memory_mean_fraction"] == pytest.approx(0.3)
    assert w["power_mean_watts"] == pytest.approx(200.0)
    assert w["sm_active_mean_pct"] == 70.0 and w["tensor_active_mean_pct"] == 20.0  # only GPU-0 reports GPM
    assert w["throttled_gpu_seconds"] == 15.0 and w["xid_count"] == 1


def test_shares_weight_the_efficiency_too():
    samples = [sample(event_time=BASE_MS + t * 1000, utilization_pct=0.0, share=0.5) for t in range(60)]
    w = close_one(samples)
    assert w["gpu_seconds"] == 30.0 and w["wasted_gpu_seconds"] == 30.0 and w["zero_util_gpu_seconds"] == 30.0


def test_workflow_cpu_and_host_iowait_are_averaged():
    samples = [sample(event_time=BASE_MS + t * 1000, workflow_cpu_pct=150.0 if t < 30 else 50.0,
                      host_iowait_pct=10.0) for t in range(60)]
    w = close_one(samples)
    assert w["workflow_cpu_mean_pct"] == 100.0 and w["host_iowait_mean_pct"] == 10.0
    assert close_one([sample(event_time=BASE_MS + t * 1000) for t in range(60)])["workflow_cpu_mean_pct"] is None


def test_imbalance_names_the_straggling_gpu():
    samples = []
    for t in range(60):
        for index, util in enumerate((80.0, 82.0, 20.0, 79.0)):
            samples.append(sample(event_time=BASE_MS + t * 1000, host="gpu-host-007", gpu_index=index,
                                  gpu_uuid=f"GPU-{index}", utilization_pct=util))
    w = close_one(samples)
    assert w["gpu_imbalance_pct"] == 62.0
    assert w["slowest_gpu"] == "gpu-host-007/gpu2" and w["slowest_gpu_pct"] == 20.0
    from streams.alerts.detectors import DetectorConfig, imbalance
    violation = imbalance(w, DetectorConfig())
    assert "the straggler is gpu-host-007/gpu2 at 20% against 82% on the busiest" in violation.message



def test_the_straggler_is_named_by_its_rank_when_the_agent_knows_it():
    samples = [sample(event_time=BASE_MS + t * 1000, host=f"node-{index // 2}", gpu_index=index % 2,
                      gpu_uuid=f"GPU-{index}", utilization_pct=util, rank=8 + index)
               for t in range(60) for index, util in enumerate((80.0, 81.0, 79.0, 15.0))]
    w = close_one(samples)
    assert w["slowest_gpu"] == "node-1/gpu1 (rank 11)" and w["slowest_gpu_pct"] == 15.0
    from streams.alerts.detectors import DetectorConfig, imbalance
    assert "the straggler is node-1/gpu1 (rank 11) at 15%" in imbalance(w, DetectorConfig()).message


def test_partial_use_names_the_gpus_that_sat_at_zero():
    """Issue 20, tried as a new user: "1 of the job's 4 GPUs sat at 0 %" without naming which
    (the window kept only a count); an alert that leads to action names host, GPU and rank."""
    samples = [sample(event_time=BASE_MS + t * 1000, host=f"node-{index // 2}", gpu_index=index % 2,
                      gpu_uuid=f"GPU-{index}", utilization_pct=util, rank=index)
               for t in range(60) for index, util in enumerate((80.0, 0.0, 79.0, 0.0))]
    w = close_one(samples)
    assert w["idle_gpus"] == 2 and w["idle_gpu_names"] == ["node-0/gpu1 (rank 1)", "node-1/gpu1 (rank 3)"]
    from streams.alerts.detectors import DetectorConfig, partial_use
    message = partial_use(w, DetectorConfig()).message
    assert "2 of the job's 4 GPUs sat at 0 %" in message
    assert message.endswith(": node-0/gpu1 (rank 1), node-1/gpu1 (rank 3).")


def test_a_long_list_of_idle_gpus_is_cut_with_a_count():
    samples = [sample(event_time=BASE_MS + t * 1000, host="big-node", gpu_index=index, gpu_uuid=f"GPU-{index}",
                      utilization_pct=0.0 if index else 50.0)
               for t in range(60) for index in range(16)]
    from streams.alerts.detectors import DetectorConfig, partial_use
    message = partial_use(close_one(samples), DetectorConfig()).message
    assert "big-node/gpu1, big-node/gpu2" in message and message.endswith("and 7 more.")
