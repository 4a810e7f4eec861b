"""The host's view of a capture: time-weighted means over the agent's ticks, of the profiled
rank's GPUs (or the workflow's on the host when samples carry no rank)."""

import pytest

from producers.profiling.context import ProfileContext
from schemas.codec import Codec


def gpu(workflow="wf-a", uuid="GPU-0", util=50.0, interval=100, rank=None, **kw):
    return {"workflow_id": workflow, "gpu_uuid": uuid, "utilization_pct": util, "interval_ms": interval,
            "rank": rank, "share": None, "sm_active_pct": None, "power_watts": 100.0,
            "memory_used_bytes": 10, "memory_total_bytes": 100, **kw}


def host(interval=100, cpu=50.0, iowait=1.0, workflows=()):
    return {"interval_ms": interval, "cpu_pct": cpu, "iowait_pct": iowait,
            "workflows": [{"workflow_id": w, "cpu_pct": c} for w, c in workflows]}


def test_means_weight_each_tick_by_the_time_it_covers():
    c = ProfileContext("wf-a", rank=None)
    c.add(
        [gpu(util=0.0, interval=100), gpu(workflow="wf-b", util=100.0)], host(100, cpu=90.0, workflows=[("wf-a", 80.0)])
    )
    c.add([gpu(util=60.0, interval=300, memory_used_bytes=70)], host(300, cpu=50.0, iowait=10.0,
                                                                      workflows=[("wf-a", 120.0)]))
    s = c.summary()
    assert s["ticks"] == 2 and s["span_ms"] == 400 and s["interval_ms_mean"] == 200
    assert s["gpus"] == 1
    assert s["gpu_utilization_mean_pct"] == pytest.approx((0 * 100 + 60 * 300) / 400)  # wf-b's GPU left out
    assert s["gpu_zero_utilization_share"] == pytest.approx(0.25)
    assert s["memory_peak_fraction"] == pytest.approx(0.7)
    assert s["host_cpu_mean_pct"] == pytest.approx((90 * 100 + 50 * 300) / 400)
    assert s["host_iowait_mean_pct"] == pytest.approx((1 * 100 + 10 * 300) / 400)
    assert s["workflow_cpu_mean_pct"] == pytest.approx((80 * 100 + 120 * 300) / 400)
    assert s["sm_active_mean_pct"] is None  # no GPM on these GPUs
    # It fits the schema it travels in.
    end = {"trace_id": "t", "workflow_id": "wf-a", "rank": 0, "events": 0, "events_read": 0, "source": "f",
           "partial": False, "error": None, "last_step_dropped": False, "memory_peak_bytes": None,
           "memory_total_bytes": None, "flops": None, "gpu_name": None, "published_at": 1, "system": s}
    assert Codec().decode(Codec().encode("TraceEnd", end))[1] == end


def test_the_profiled_ranks_gpus_alone_when_samples_carry_ranks():
    c = ProfileContext("wf-a", rank=1)
    c.add([gpu(uuid="GPU-0", util=90.0, rank=0), gpu(uuid="GPU-1", util=10.0, rank=1)], host())
    s = c.summary()
    assert s["gpus"] == 1 and s["gpu_utilization_mean_pct"] == pytest.approx(10.0)


def test_a_shared_gpu_counts_for_the_workflows_share_and_nothing_seen_is_none():
    c = ProfileContext("wf-a")
    c.add([gpu(util=0.0, share=0.25), gpu(uuid="GPU-1", util=80.0)], host())
    assert c.summary()["gpu_utilization_mean_pct"] == pytest.approx(80 * 100 / 125)
    empty = ProfileContext("wf-z")
    empty.add([gpu()], host(cpu=None, iowait=None))
    s = empty.summary()
    assert s["ticks"] == 1 and s["gpus"] == 0
    assert s["gpu_utilization_mean_pct"] is None and s["host_cpu_mean_pct"] is None
