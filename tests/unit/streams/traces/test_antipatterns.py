"""Each antipattern rule firing and not firing, on hand-built traces read from files."""

from pathlib import Path

import pytest

from gpufleet.analyze import analyze_file_with_findings
from streams.alerts.detectors import DEFAULTS
from tests.support.traces import cpu_op, kernel, memcpy, memory, runtime, write_trace

MS = 1000


def rules(tmp_path, events, **kw):
    _, findings = analyze_file_with_findings(write_trace(tmp_path / "t.json", events, **kw), "wf")
    return {f["rule"]: f for f in findings}


def _op(name, ts, flops, dims, dtype="c10::BFloat16"):
    """A CPU operator that counted its FLOPs, open for 20 us on the launching thread."""
    return {**cpu_op(name, ts, 20), "args": {"flops": flops, "Input Dims": dims, "Input type": [dtype] * len(dims)}}


def launched(name, ts, dur, corr, call="cudaLaunchKernel", call_ts=None, call_dur=5, **kw):
    """A runtime call and the GPU event it launched."""
    call_ts = ts - call_dur - 1 if call_ts is None else call_ts
    gpu = kernel(name, ts, dur, corr=corr, **kw)
    return [runtime(call, call_ts, call_dur, corr=corr), gpu]



CASES = {
    "gpu_gaps": (
        [kernel("gemm", 0, 10), kernel("gemm", 600_010, 10)],
        [kernel("gemm", 0, 10), kernel("gemm", 400_010, 10)],
    ),
    "low_utilization_chunks": (
        [kernel("gemm", 0, 150 * MS), kernel("gemm", 290 * MS, 10 * MS)],
        [kernel("gemm", 0, 300 * MS)],
    ),
    "synchronization": (
        [kernel("gemm", 0, 100 * MS), runtime("cudaStreamSynchronize", 10, 5 * MS, corr=50)],
        [kernel("gemm", 0, 100 * MS), runtime("cudaStreamSynchronize", 10, 500, corr=50)],
    ),
    "synchronous_memcpy": (
        [runtime("cudaMemcpy", 0, 2 * MS, corr=1),
         {**memcpy(10, 1500, corr=1, nbytes=10**6), "name": "Memcpy DtoH (Device -> Pageable)"}],
        [runtime("cudaMemcpy", 0, 2 * MS, corr=1), memcpy(10, 1500, corr=1, nbytes=1000)],  # a small upload
    ),
    "pageable_async_memcpy": (
        [runtime("cudaMemcpyAsync", 0, 10, corr=1), memcpy(20, 2 * MS, corr=1, nbytes=10**7)],
        [runtime("cudaMemcpyAsync", 0, 10, corr=1),
         {**memcpy(20, 2 * MS, corr=1, nbytes=10**7), "name": "Memcpy HtoD (Pinned -> Device)"}],
    ),
    "synchronous_memset": (
        [runtime("cudaMemset", 0, 2 * MS, corr=1), kernel("Memset (Device)", 10, 50, corr=1, cat="gpu_memset")],
        [runtime("cudaMemsetAsync", 0, 2 * MS, corr=1), kernel("Memset (Device)", 10, 50, corr=1, cat="gpu_memset")],
    ),
    "launch_bound": (
        [e for i in range(12) for e in launched("add", 100 + i * 20, 2, corr=i, call_dur=10)],
        [e for i in range(9) for e in launched("add", 100 + i * 20, 2, corr=i, call_dur=10)],
    ),
    "high_launch_delay": (
        [e for i in range(5) for e in launched("gemm", 1000 + i * 2000, 100, corr=i, call_ts=i * 2000 + 400)],
        [e for i in range(5) for e in launched("gemm", 1000 + i * 2000, 100, corr=i)],
    ),
    "low_comm_overlap": (
        [kernel("ncclKernel_AllReduce", 0, 100 * MS, stream=20), kernel("gemm", 90 * MS, 110 * MS)],
        [kernel("ncclKernel_AllReduce", 0, 100 * MS, stream=20), kernel("gemm", 0, 100 * MS)],
    ),
    "input_pipeline_stall": (
        [cpu_op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 50 * MS),
         kernel("gemm", 50 * MS, 50 * MS)],
        [cpu_op("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 50 * MS, 1 * MS),
         kernel("gemm", 0, 100 * MS)],
    ),
    "operators_below_roof": (  # a bf16 4096-cube matmul on an A100 (312 TFLOP/s): 4 % of its roof, then 73 %
        [_op("aten::mm", 0, 2 * 4096 ** 3, [[4096, 4096], [4096, 4096]]), *launched("gemm", 20, 10 * MS, corr=1)],
        [_op("aten::mm", 0, 2 * 4096 ** 3, [[4096, 4096], [4096, 4096]]), *launched("gemm", 20, 600, corr=1)],
    ),
    "no_tensor_cores": (
        [kernel("volta_sgemm_128x64_nn", 0, 10 * MS)],
        [kernel("volta_h884gemm_128x128_ldg8_nn", 0, 10 * MS)],
    ),
}


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_fires_on_the_antipattern_and_not_on_its_fix(tmp_path, rule):
    bad, good = CASES[rule]
    kw = {"device_memory": 80 * 2**30} if rule == "operators_below_roof" else {}  # names the GPU (its peaks)
    found = rules(tmp_path, bad, **kw)
    assert rule in found, f"{rule} should fire; found {sorted(found)}"
    f = found[rule]
    assert f["evidence"] and f["recommendation"] and f["severity"] in ("INFO", "WARNING", "CRITICAL")
    assert f["finding_id"] == f"wf/t.json:{rule}"
    assert rule not in rules(tmp_path, good, **kw)



def test_numbers_behind_the_findings(tmp_path):
    gaps = rules(tmp_path, CASES["gpu_gaps"][0])["gpu_gaps"]
    assert gaps["gpu_seconds_at_stake"] == pytest.approx(0.6)
    chunks = rules(tmp_path, CASES["low_utilization_chunks"][0])["low_utilization_chunks"]
    assert "14 of 30 time chunks (10.0 ms each)" in chunks["evidence"]
    assert chunks["gpu_seconds_at_stake"] == pytest.approx(0.14)
    stall = rules(tmp_path, CASES["input_pipeline_stall"][0])["input_pipeline_stall"]
    assert stall["severity"] == "CRITICAL" and stall["gpu_seconds_at_stake"] == pytest.approx(0.05)
    overlap = rules(tmp_path, CASES["low_comm_overlap"][0])["low_comm_overlap"]
    assert "only 10.0 %" in overlap["evidence"] and overlap["gpu_seconds_at_stake"] == pytest.approx(0.09)
    train = rules(tmp_path, CASES["launch_bound"][0])["launch_bound"]
    assert "1 runs of 10+ kernels" in train["evidence"] and "12 kernels" in train["evidence"]


def test_memory_pressure_from_the_profilers_memory_events(tmp_path):
    total = 80 * 2**30
    busy = [kernel("gemm", 0, 10), memory(1, int(0.5 * total)), memory(2, int(0.95 * total)), memory(3, 0)]
    found = rules(tmp_path, busy, device_memory=total)
    assert "95%" in found["memory_pressure"]["evidence"]
    calm = [kernel("gemm", 0, 10), memory(1, int(0.5 * total))]
    assert "memory_pressure" not in rules(tmp_path, calm, device_memory=total)


def context(**kw):
    """A ``ProfileSystemContext`` as the agent attaches it to a requested profile's trace."""
    return {"ticks": 50, "span_ms": 5000, "interval_ms_mean": 100.0, "gpus": 1, "gpu_utilization_mean_pct": 20.0,
            "gpu_zero_utilization_share": 0.5, "sm_active_mean_pct": None, "power_mean_watts": 90.0,
            "memory_peak_fraction": 0.3, "workflow_cpu_mean_pct": 40.0, "host_cpu_mean_pct": 40.0,
            "host_iowait_mean_pct": 1.0, **kw}


def with_context(tmp_path, events, system):
    from producers.traces.read import read_trace
    from streams.traces.analyze import analyze_events, findings_records

    result = analyze_events(read_trace(write_trace(tmp_path / "t.json", events)).events)
    record, _ = analyze_file_with_findings(tmp_path / "t.json", "wf")
    return {f["rule"]: f for f in findings_records(result, {**record, "system": system}, None, 0, DEFAULTS.default)}


# Kernels of 3 ms at 7, 17 and 27 ms, each launched just before it starts: over the 23 ms of
# kernel time the GPU idles 14 ms (61 %), all of it waiting on the host. And a busy GPU.
STARVED = [e for i in range(3) for e in launched("gemm", 10 * MS * i + 7 * MS, 3 * MS, corr=i,
                                                  call_ts=10 * MS * i + 7 * MS - 10)]
BUSY = [e for i in range(3) for e in launched("gemm", 10 * MS * i, 10 * MS, corr=i, call_ts=10 * MS * i - 20)]


def test_a_starved_gpu_on_a_saturated_host_is_a_cpu_bound_input_pipeline(tmp_path):
    found = with_context(tmp_path, STARVED, context(host_cpu_mean_pct=97.0))
    cpu = found["cpu_bound_input"]
    assert cpu["severity"] == "CRITICAL"  # idle over half the trace
    assert "the GPU idle 61 % of the trace, the host's CPUs 97 % busy" in cpu["evidence"]
    assert "50 samples over 5.0 s" in cpu["evidence"] and "no cores to spare" in cpu["recommendation"]
    # At stake: the GPU's host wait (the two gaps of 7 ms before the 2nd and 3rd kernel).
    assert cpu["gpu_seconds_at_stake"] == pytest.approx(0.014)
    # The job saturates its own cores while the host has idle ones: more loader workers.
    job = with_context(tmp_path, STARVED, context(workflow_cpu_mean_pct=190.0, gpus=2))["cpu_bound_input"]
    assert "95 % of a core per GPU" in job["evidence"] and "num_workers" in job["recommendation"]
    # Not when the CPUs have room, nor when the GPU was busy.
    assert "cpu_bound_input" not in with_context(tmp_path, STARVED, context())
    assert "cpu_bound_input" not in with_context(tmp_path, BUSY, context(host_cpu_mean_pct=99.0))
    assert "cpu_bound_input" not in with_context(tmp_path, STARVED, None)  # a trace without the host's view


def test_a_starved_gpu_on_a_host_waiting_for_io_is_storage_bound(tmp_path):
    found = with_context(tmp_path, STARVED, context(host_iowait_mean_pct=35.0))
    assert "35 % of its CPU time waiting for I/O" in found["storage_bound_input"]["evidence"]
    assert "cpu_bound_input" not in found
    assert "storage_bound_input" not in with_context(tmp_path, STARVED, context(host_iowait_mean_pct=5.0))
    assert "storage_bound_input" not in with_context(tmp_path, BUSY, context(host_iowait_mean_pct=35.0))


def critical_path_rules(tmp_path, events) -> dict:
    _, findings = analyze_file_with_findings(write_trace(tmp_path / "t.json", events), "wf", critical_path=True)
    return {f["rule"]: f for f in findings if f["rule"].startswith("critical_path")}


def test_critical_path_names_what_sets_the_pace_of_the_steps(tmp_path):
    """The ["critical_path_bound"] rule: one finding for what most of the steps' critical path
    ran on, where it is not the GPU's own computation (tested apart: it needs the CPU operators)."""
    cpu = [cpu_op("aten::slow_python", 0, 50 * MS), *launched("gemm", 49 * MS, 1 * MS, corr=1, call_ts=48 * MS)]
    found = critical_path_rules(tmp_path, cpu)
    assert set(found) == {"critical_path_cpu"}
    assert "aten::slow_python" in found["critical_path_cpu"]["evidence"]
    # the CPU's time on the path: 48 ms to the launch, and the rest of the operator or the kernel's wait
    assert 0.048 <= found["critical_path_cpu"]["gpu_seconds_at_stake"] <= 0.050

    nccl = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"
    communication = [cpu_op("aten::step", 0, 120 * MS), runtime("cudaLaunchKernel", 10, 5, corr=1),
                     kernel(nccl, 20, 100 * MS, corr=1), runtime("cudaDeviceSynchronize", 30, 110 * MS, corr=2)]
    assert set(critical_path_rules(tmp_path, communication)) == {"critical_path_communication"}

    gaps = [
        cpu_op("aten::step", 0, 6.2 * MS),
        runtime("cudaLaunchKernel", 10, 5, corr=1),
        runtime("cudaLaunchKernel", 20, 5, corr=2),
        kernel("a", 30, 1 * MS, corr=1),
        kernel("b", 5 * MS, 1 * MS, corr=2),
        runtime("cudaDeviceSynchronize", 40, 6.1 * MS, corr=3),
    ]
    assert set(critical_path_rules(tmp_path, gaps)) == {"critical_path_launch"}

    gpu_bound = [cpu_op("aten::step", 0, 101 * MS), runtime("cudaLaunchKernel", 10, 5, corr=1),
                 kernel("gemm", 20, 100 * MS, corr=1), runtime("cudaDeviceSynchronize", 30, 100 * MS, corr=2)]
    assert critical_path_rules(tmp_path, gpu_bound) == {}


def test_every_registered_rule_has_its_case_here():
    """A rule is a function in streams/traces/rules.py, in RULES, with a test here."""
    from streams.traces.rules import RULES

    tested_apart = {"memory_pressure", "cpu_bound_input", "storage_bound_input",
                    "critical_path_bound"}  # by the tests above
    assert {rule.__name__ for rule in RULES} == set(CASES) | tested_apart
    here = Path(__file__).read_text()
    assert all(f'["{name}"]' in here for name in tested_apart)


def test_a_kernel_rounded_to_end_before_it_starts_adds_no_busy_time():
    """HTA's rounding (start up, end down) can make a kernel shorter than 1 us end before it
    starts: its interval is empty, and the utilisation histogram takes nothing from it."""
    from streams.traces.analyze import TraceAnalyzer
    from streams.traces.antipatterns import AntipatternCollector

    def gpu(ts, dur):
        return {"kind": "kernel", "cat": "kernel", "name": "k", "ts": ts, "dur": dur, "stream": 7, "device": 0,
                "correlation": -1, "tid": -1}

    analyzer = TraceAnalyzer()
    analyzer.add_events([gpu(0, 5), gpu(100, 10), gpu(300, -1), gpu(500, 20), gpu(900, 1)])
    collector = analyzer.analyses[AntipatternCollector]
    assert sum(collector.buckets) == 5 + 10 + 20  # the groups closed so far; the -1 us one adds nothing
