"""Each definition of the trace analysis on hand-built traces; answers worked out by hand."""

import pytest

from producers.traces.read import read_trace
from streams.traces.analyze import analyze_events
from streams.traces.kernel_type import KernelType, kernel_type
from tests.support.traces import kernel, memcpy, runtime, step, write_trace


def analyze(tmp_path, events, **kw):
    trace = read_trace(write_trace(tmp_path / "t.json", events, **kw))
    return trace, analyze_events(trace.events)


@pytest.mark.parametrize("name, expected", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", KernelType.COMMUNICATION),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", KernelType.COMMUNICATION),
    ("Memcpy HtoD (Pageable -> Device)", KernelType.MEMORY),
    ("Memset (Device)", KernelType.MEMORY),
    ("dma_copy", KernelType.MEMORY),
    ("volta_sgemm_128x64_nn", KernelType.COMPUTATION),
    ("Stream Sync", KernelType.OTHER),
    ("void at::native::copyMemcpy_kernel()", KernelType.OTHER),  # contains Memcpy: not computation
])
def test_kernel_types_follow_hta(name, expected):
    assert kernel_type(name) is expected


def test_touching_intervals_merge_across_streams(tmp_path):
    _, r = analyze(tmp_path, [
        kernel("gemm", 0, 10, stream=7), kernel("gemm", 10, 10, stream=7),  # touching: one interval
        kernel("gemm", 15, 15, stream=8),                                    # overlaps into [0, 30)
        kernel("gemm", 40, 10, stream=7),                                    # [40, 50)
        memcpy(55, 5, stream=9),                                             # [55, 60), not compute
    ])
    t = r["temporal"]
    assert t["kernel_time_us"] == 60          # 60 - 0
    assert t["idle_time_us"] == 15            # 60 - (30 + 10 + 5)
    assert t["compute_time_us"] == 40
    assert t["non_compute_time_us"] == 5
    assert t["idle_pct"] == pytest.approx(25.0)
    assert t["compute_pct"] == pytest.approx(200 / 3)


def test_communication_computation_overlap(tmp_path):
    _, r = analyze(tmp_path, [
        kernel("gemm", 0, 10), kernel("ncclKernel_AllReduce", 5, 15, stream=20), kernel("gemm", 18, 7),
    ])
    o = r["overlap"]
    assert o["communication_time_us"] == 15
    assert o["comp_comm_overlap_us"] == 7     # [5, 10) and [18, 20)
    assert o["comp_comm_overlap_pct"] == pytest.approx(700 / 15)


def test_no_communication_means_no_overlap_figure(tmp_path):
    _, r = analyze(tmp_path, [kernel("gemm", 0, 10)])
    assert r["overlap"]["comp_comm_overlap_pct"] is None


def test_float_timestamps_round_every_event(tmp_path):
    trace, r = analyze(tmp_path, [kernel("gemm", 1.5, 2.2), kernel("gemm", 3.2, 1.0), kernel("gemm", 10, 2)])
    assert trace.rounded
    # [ceil 1.5, floor 3.7) = [2, 3); [4, 4); [10, 12)
    assert [(e["ts"], e["end"]) for e in trace.events] == [(2, 3), (4, 4), (10, 12)]
    assert all(type(e["ts"]) is int and type(e["dur"]) is int for e in trace.events)
    assert r["temporal"]["kernel_time_us"] == 10
    assert r["temporal"]["idle_time_us"] == 7  # 10 - (1 + 0 + 2)


def test_integer_timestamps_are_left_alone(tmp_path):
    trace, _ = analyze(tmp_path, [kernel("gemm", 1, 2)])
    assert not trace.rounded and trace.events[0]["end"] == 3
    assert type(trace.events[0]["ts"]) is int and type(trace.events[0]["dur"]) is int


def test_a_fractional_duration_with_integer_timestamps_is_kept(tmp_path):
    """HTA rounds only where a timestamp is fractional; a duration alone is kept as it is."""
    trace, _ = analyze(tmp_path, [kernel("gemm", 1, 2.5), kernel("gemm", 10, 2)])
    assert not trace.rounded
    assert [(e["ts"], e["dur"], e["end"]) for e in trace.events] == [(1, 2.5, 3.5), (10, 2.0, 12.0)]
    assert all(type(e["ts"]) is int for e in trace.events)


LAST_STEP_EVENTS = [
    runtime("cudaLaunchKernel", 10, 5, corr=1), kernel("gemm", 20, 10, corr=1),
    runtime("cudaLaunchKernel", 150, 5, corr=2), kernel("gemm", 160, 10, corr=2),
    kernel("orphan", 50, 5, corr=3),  # no launch event
]


def test_last_profiler_step_is_dropped(tmp_path):
    trace, r = analyze(tmp_path, [step(1, 0, 100), step(2, 100, 100), *LAST_STEP_EVENTS])
    assert trace.last_step_dropped
    # Kept: the launch at 10 and its kernel; dropped: step 2's launch and kernel, and the
    # kernel no kept CPU event launched.
    assert r["gpu_events"] == 1 and r["temporal"]["kernel_time_us"] == 10
    assert r["launch"]["launches"] == 1


def test_one_profiler_step_keeps_everything(tmp_path):
    trace, r = analyze(tmp_path, [step(1, 0, 200), *LAST_STEP_EVENTS])
    assert not trace.last_step_dropped
    assert r["gpu_events"] == 3
    assert r["gpu_events_without_launch"] == 1  # the orphan still counts in the GPU time
    assert r["temporal"]["kernel_time_us"] == 150  # 170 - 20


def test_idle_time_breakdown_per_stream(tmp_path):
    _, r = analyze(
        tmp_path,
        [
            runtime("cudaLaunchKernel", 0, 1, corr=1),
            kernel("k1", 0, 10, corr=1),
            runtime("cudaLaunchKernel", 12, 1, corr=2),
            kernel("k2", 15, 5, corr=2),  # launched after k1 ended: host wait 5
            runtime("cudaLaunchKernel", 5, 1, corr=3),
            kernel("k3", 25, 5, corr=3),  # queued early, gap 5 < 30: kernel wait
            runtime("cudaLaunchKernel", 10, 1, corr=4),
            kernel("k4", 100, 10, corr=4),  # gap 70: other
            kernel("Memset (Device)", 120, 1, corr=9, cat="gpu_memset"),  # no launch event, gap 10: kernel wait
            kernel("Stream Sync", 130, 5, corr=10, cat="cuda_sync"),  # not a kernel: ignored here
            kernel("k5", 0, 50, stream=8),  # first on its stream: no gap
        ],
    )
    s7, s8 = r["idle_by_stream"][7], r["idle_by_stream"][8]
    assert (s7["host_wait_us"], s7["kernel_wait_us"], s7["other_us"]) == (5, 15, 70)
    assert s7["other_ratio"] == pytest.approx(70 / 90)
    assert s8["host_wait_us"] == s8["kernel_wait_us"] == s8["other_us"] == 0


def test_launch_statistics(tmp_path):
    _, r = analyze(tmp_path, [
        runtime("cudaLaunchKernel", 0, 10, corr=1), kernel("k", 5, 3, corr=1),          # delay 0, short kernel
        runtime("cudaMemcpyAsync", 100, 60, corr=2), memcpy(300, 100, corr=2),         # delay 140, both outliers
        runtime("cudaStreamSynchronize", 500, 5, corr=3), kernel("Stream Sync", 501, 4, corr=3, cat="cuda_sync"),
    ])
    launch = r["launch"]
    assert launch["launches"] == 2  # the synchronize call is not a launch
    assert launch["launch_delay_mean_us"] == 70 and launch["launch_delay_max_us"] == 140
    assert launch["short_kernels"] == 1 and launch["short_kernel_gpu_us"] == 3
    assert launch["runtime_outliers"] == 1 and launch["launch_delay_outliers"] == 1


def test_rank_comes_from_distributed_info(tmp_path):
    trace, _ = analyze(tmp_path, [kernel("gemm", 0, 1)], rank=3)
    assert trace.rank == 3
    trace, _ = analyze(tmp_path, [kernel("gemm", 0, 1)], rank=None)
    assert trace.rank == 0


@pytest.mark.parametrize("trace", ["resnet50", "synthetic", "operators"])
def test_checkpointed_state_resumes_to_the_same_result(tmp_path, trace):
    import json

    from streams.traces.analyze import TraceAnalyzer
    from tests.support.traces import SHARED_TRACES, synthetic_job_trace, synthetic_operator_trace

    if trace == "synthetic":  # several streams, NCCL overlapping computation
        path = synthetic_job_trace(tmp_path / "t.json")
    elif trace == "operators":  # operators open on two threads, every cut (the roofline's state)
        path = synthetic_operator_trace(tmp_path / "t.json")
    else:
        path = SHARED_TRACES / "resnet50_num_workers_4__worker0.1623212756351.pt.trace.json.gz"
        if not path.exists():
            pytest.skip(f"{path} is not here")
    events = read_trace(path).events
    whole = analyze_events(events)
    assert whole["top_kernels"] and whole["kernel_types"]
    if trace == "operators":
        assert whole["operators"]
    events = list(events)
    for cut in range(1, len(events)) if trace == "operators" else [len(events) * 2 // 3]:
        first = TraceAnalyzer()
        for e in events[:cut]:
            first.add(e)
        resumed = TraceAnalyzer.from_state(json.loads(json.dumps(first.to_state())))
        for e in events[cut:]:
            resumed.add(e)
        assert resumed.result("NVIDIA H100 80GB HBM3") == analyze_trace_result(events), cut


def test_a_session_checkpointed_before_the_kernel_breakdown_keeps_its_temporal_breakdown(tmp_path):
    """Checkpoints of that time hold the unions of computation and communication kernels with
    the temporal breakdown's (now the kernel breakdown's): a session resumed from one still
    reports the whole trace's temporal breakdown and overlap."""
    import json

    from streams.traces.analyze import TraceAnalyzer
    from streams.traces.kernel_breakdown import COMMUNICATION_BIT, COMPUTATION_BIT
    from tests.support.traces import synthetic_job_trace

    events = list(read_trace(synthetic_job_trace(tmp_path / "t.json")).events)
    cut = len(events) * 2 // 3
    first = TraceAnalyzer()
    for e in events[:cut]:
        first.add(e)
    state = json.loads(json.dumps(first.to_state()))
    comp, comm = COMPUTATION_BIT, COMMUNICATION_BIT
    for mask, name in ((comp, "compute"), (comm, "communication"), (comp | comm, "either")):
        state["coverage"][name] = state["kernels"]["unions"][str(mask)]
    for later in ("kernels", "copies", "collectives", "roofline", "annotations", "queues", "per_step", "steps"):
        del state[later]
    resumed = TraceAnalyzer.from_state(state)
    for e in events[cut:]:
        resumed.add(e)
    whole = analyze_trace_result(events)
    assert whole["overlap"]["communication_time_us"] > 0 and whole["temporal"]["compute_time_us"] > 0
    got = resumed.result("NVIDIA H100 80GB HBM3")
    assert (got["temporal"], got["overlap"]) == (whole["temporal"], whole["overlap"])


def analyze_trace_result(events: list[dict]) -> dict:
    from streams.traces.analyze import TraceAnalyzer

    whole = TraceAnalyzer()
    for e in events:
        whole.add(e)
    return whole.result("NVIDIA H100 80GB HBM3")


def test_analysis_record_fits_its_schema(tmp_path):
    from schemas.codec import Codec
    from streams.traces.analyze import trace_analysis_record

    _, r = analyze(tmp_path, [runtime("cudaLaunchKernel", 0, 10, corr=1), kernel("k", 5, 3, corr=1)])
    record = trace_analysis_record(r, trace_id="t", workflow_id="wf", rank=0, source="x",
                                   partial=False, error=None, analyzed_at=1)
    codec = Codec()
    assert codec.decode(codec.encode("TraceAnalysis", record))[1] == record
