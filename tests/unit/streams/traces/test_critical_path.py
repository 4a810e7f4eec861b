"""The critical path of profiler steps (``streams.traces.critical_path``): against HTA's on the
traces it can analyse, on the real traces it cannot, and on built steps whose path is known
(CUDA graphs, stream waits, synchronisations, nesting)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.analyze import analyze_file_with_findings, run
from producers.traces.read import read_trace
from streams.traces import critical_path as trace_critical_path
from streams.traces.batch import EventBatch
from streams.traces.critical_path import STEP_CODE, CriticalPath
from streams.traces.kernel_type import short_kernel_name
from tests.support.traces import (
    SHARED_TRACES,
    cpu_op,
    cuda_graph_step_trace,
    kernel,
    memcpy,
    runtime,
    synthetic_job_trace,
    write_trace,
)

HTA_DATA = Path(__file__).resolve().parents[3] / "data" / "hta"
PARTS = ("cpu_us", "gpu_compute_us", "communication_us", "launch_overhead_us", "kernel_gap_us")


def critical_path(path: Path, batch: int = 4096) -> dict:
    """The trace's critical paths, its events fed ``batch`` at a time."""
    trace = read_trace(path, cpu_ops=True)
    cp = CriticalPath(infer_syncs=trace.sync_events == 0)
    for columns in trace.events.column_chunks(batch):
        cp.add(EventBatch(*columns))
    return cp.result()


def charged(step: dict) -> Counter:
    """Time on the path per event, named as HTA names it (kernels shortened)."""
    out: Counter = Counter()
    for t in step["top"]:
        out[short_kernel_name(t["name"]) if t["on"] == "gpu" else t["name"]] += t["time_us"]
    return out


def hta_parts(h: dict) -> dict:
    b = h["bound_by"]
    return {"cpu_us": b.get("cpu_bound", 0), "gpu_compute_us": b.get("gpu_compute_bound", 0),
            "communication_us": b.get("gpu_communication_bound", 0),
            "launch_overhead_us": b.get("gpu_kernel_launch_overhead", 0),
            "kernel_gap_us": b.get("gpu_kernel_kernel_overhead", 0)}


@pytest.fixture
def every_event(monkeypatch):
    monkeypatch.setattr(trace_critical_path, "TOP", 10_000)


def test_equals_hta_on_a_data_parallel_step(tmp_path, every_event):
    """Two compute streams, NCCL on two more, copies: the path, what it ran on and every
    event's time on it equal HTA's (its first step, as HTA's default)."""
    hta = json.loads((HTA_DATA / "synthetic-1.json").read_text())["critical_path"]
    step = critical_path(synthetic_job_trace(tmp_path / "synthetic-1.json", seed=1))["steps"][0]
    assert step["step"] == "ProfilerStep#1"
    assert step["path_us"] == hta["path_us"]
    assert {k: step[k] for k in PARTS} == hta_parts(hta)
    assert charged(step) == {k: v for k, v in hta["by_event"].items() if v}


def test_equals_hta_on_the_event_sync_trace(every_event):
    """Stream, event and device synchronisation on a real trace: cudaEventSynchronize waits for
    the kernel its event was recorded after, found through the stream the sync event names."""
    path = SHARED_TRACES / "cuda_event_sync__event_sync_trace.json.gz"
    if not path.exists():
        pytest.skip(f"{path} is not here (shared/traces sits beside the checkout)")
    hta = json.loads((HTA_DATA / "cuda_event_sync__event_sync_trace.json").read_text())["critical_path"]
    step = critical_path(path)["steps"][0]
    assert step["path_us"] == hta["path_us"]
    assert {k: step[k] for k in PARTS} == hta_parts(hta)
    assert charged(step) == {k: v for k, v in hta["by_event"].items() if v}


@pytest.mark.parametrize("name", ["resnet50_num_workers_0__worker0.1623143089861.pt.trace",
                                  "resnet50_num_workers_4__worker0.1623212756351.pt.trace"])
def test_real_traces_hta_fails_on_have_a_path_per_step(name):
    """HTA 0.5.0's critical path fails on both ResNet traces (a copy whose launch lies outside
    the step: an assertion); gpufleet finds every step's. These traces predate the profiler's
    synchronisation events: the blocking copy of ``loss.item()`` is taken to wait for its copy."""
    path = SHARED_TRACES / f"{name}.json.gz"
    if not path.exists():
        pytest.skip(f"{path} is not here (shared/traces sits beside the checkout)")
    assert "hta_error" in json.loads((HTA_DATA / f"{name.removesuffix('.pt.trace')}.json").read_text())["critical_path"]
    cp = critical_path(path)
    assert [s["step"] for s in cp["steps"]] == [f"ProfilerStep#{n}" for n in range(5, 10)]
    for s in cp["steps"]:
        assert sum(s[k] for k in PARTS) == pytest.approx(s["path_us"])
        assert 0.9 * s["span_us"] <= s["path_us"] <= s["span_us"]  # a step on one thread, bound by it
        assert s["gpu_compute_us"] > 0 and s["streams"] == {7: s["gpu_compute_us"]}
    assert cp["skipped"] == []


@pytest.mark.parametrize("graph", [True, False])
def test_a_cuda_graph_step_has_the_path_of_the_same_kernels_launched_one_by_one(tmp_path, graph):
    """The step's path: the CPU up to the launch, every kernel of stream 7 in order, the wait's
    end, aten::item. A graph's kernels share one correlation id; each follows the one before
    it on its stream, so the path is the same whether they came from one graph launch or six
    launch calls."""
    step = critical_path(cuda_graph_step_trace(tmp_path / "t.json", graph))["steps"][0]
    assert step["gpu_compute_us"] == 400 and step["streams"] == {7: 400}
    assert {t["name"] for t in step["top"] if t["on"] == "gpu"} == {"k7_0", "k7_1", "k7_2", "k7_3"}
    launch_call = 20 if graph else 12
    assert step["launch_overhead_us"] == 50 - launch_call
    assert step["cpu_us"] == launch_call - 10 + 10  # into aten::forward up to the launch; aten::item
    assert step["path_us"] == 40 + 400 + 10  # the wait for the GPU weighs nothing on the CPU
    # HTA 0.5.0 on the same two traces: on the graph it fails (its launch queue counts only kernel
    # launch calls); launched one by one, its path starts at the first kernel (its queue-length
    # test adds no launch edge), 40 us shorter: the CPU up to the launch and the launch delay
    hta = json.loads((HTA_DATA / f"cuda-graph-step-{'graph' if graph else 'launches'}.json").read_text())
    if graph:
        assert "hta_error" in hta["critical_path"]
    else:
        assert hta["critical_path"]["path_us"] == step["path_us"] - 40


def test_launch_or_previous_kernel_whichever_came_last(tmp_path):
    """A kernel starts after its launch and after the kernel before it on its stream; the path
    takes the later of the two: a kernel launched while the stream was busy follows the kernel
    before it (the gap between them is the GPU's), one launched after the stream went idle
    follows its launch (the time before is the launch's, not a gap)."""
    events = [cpu_op("aten::a", 0, 10), runtime("cudaLaunchKernel", 1, 2, corr=1),
              runtime("cudaLaunchKernel", 4, 2, corr=2),
              kernel("busy_then", 5, 100, corr=1), kernel("queued", 110, 20, corr=2),  # launched at 4: queued
              runtime("cudaDeviceSynchronize", 20, 120, corr=3),
              cpu_op("aten::b", 300, 10), runtime("cudaLaunchKernel", 301, 2, corr=4),
              kernel("idle_then", 308, 20, corr=4),  # the stream idle since 130: follows its launch at 301
              runtime("cudaDeviceSynchronize", 320, 30, corr=5), cpu_op("aten::c", 360, 5)]
    step = critical_path(write_trace(tmp_path / "t.json", events))["steps"][0]
    assert step["kernel_gap_us"] == 5  # busy_then -> queued
    assert step["launch_overhead_us"] == 4 + 7  # 301 -> 308, and not 130 -> 308 as a gap
    # the GPU's 100 + 20 + 20; the CPU: into aten::a and aten::b up to the launches, and aten::c
    assert step["gpu_compute_us"] == 140 and step["cpu_us"] == 1 + 1 + 5
    assert step["path_us"] == 163


def test_a_stream_waits_for_the_event_recorded_after_a_kernel(tmp_path):
    """cudaEventRecord on stream 7 after a 200 us kernel, cudaStreamWaitEvent on stream 8: the
    next kernel on stream 8 follows that kernel, not its own early launch."""
    events = [cpu_op("aten::step", 0, 300),
              runtime("cudaLaunchKernel", 1, 2, corr=1), runtime("cudaEventRecord", 4, 1, corr=2),
              runtime("cudaStreamWaitEvent", 6, 1, corr=3), runtime("cudaLaunchKernel", 8, 2, corr=4),
              kernel("producer", 10, 200, stream=7, corr=1),
              {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 8, "ts": 11, "dur": 1,
               "args": {"stream": 8, "correlation": 3, "wait_on_stream": 7, "wait_on_cuda_event_record_corr_id": 2}},
              kernel("consumer", 215, 50, stream=8, corr=4),
              runtime("cudaDeviceSynchronize", 30, 250, corr=5),
              {"ph": "X", "cat": "cuda_sync", "name": "Context Sync", "pid": 0, "tid": 7, "ts": 31, "dur": 248,
               "args": {"stream": -1, "correlation": 5, "device": 0}}]
    step = critical_path(write_trace(tmp_path / "t.json", events))["steps"][0]
    assert step["streams"] == {7: 200, 8: 50}
    assert step["launch_overhead_us"] == 9 and step["kernel_gap_us"] == 0  # not 207 us of launch delay
    # into aten::step up to the launch, the producer, the consumer, aten::step after the wait
    assert step["cpu_us"] == 1 + 20 and step["path_us"] == 1 + 9 + 200 + 50 + 20


def test_operators_are_charged_with_the_time_spent_in_them(tmp_path):
    """Nested operators on one thread (HTA's rule): a start and the next start, the first; an
    operator's own start and end, itself; an end and the next end, the outer; an end and the
    next start, the operator both are in."""
    events = [cpu_op("outer", 0, 100), cpu_op("first", 10, 20), cpu_op("second", 50, 30)]
    step = critical_path(write_trace(tmp_path / "t.json", events))["steps"][0]
    assert {t["name"]: t["time_us"] for t in step["top"]} == {"outer": 10 + 20 + 20, "first": 20, "second": 30}
    assert step["path_us"] == step["cpu_us"] == 100


def test_an_old_trace_blocking_copy_waits_for_its_copy(tmp_path):
    """Without the profiler's synchronisation events (PyTorch before 2.3), a blocking
    cudaMemcpy is taken to wait for its own copy, and cudaDeviceSynchronize for every stream."""
    events = [cpu_op("aten::copy_", 0, 300), runtime("cudaLaunchKernel", 1, 2, corr=1),
              runtime("cudaMemcpy", 5, 290, corr=2),
              kernel("k", 10, 150, corr=1), memcpy(160, 130, corr=2)]
    step = critical_path(write_trace(tmp_path / "t.json", events))["steps"][0]
    assert step["gpu_compute_us"] == 150 + 130
    assert step["path_us"] == 1 + 9 + 150 + 130 + 5  # the copy's end to the call's: a wait, of no weight


def test_a_step_too_big_to_hold_is_given_up_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_critical_path, "MAX_NODES", 10)
    events = [cpu_op(f"op{i}", 10 * i, 5) for i in range(20)]
    events += [runtime("cudaLaunchKernel", 300 + 10 * i, 2, corr=i + 1) for i in range(20)]
    trace = read_trace(write_trace(tmp_path / "t.json", events), cpu_ops=True)
    cp = CriticalPath()
    for columns in trace.events.column_chunks():
        cp.add(EventBatch(*columns))
    (region,) = cp.regions
    assert region.too_big and len(region.ts) == 0 and not region.calls and not cp.by_call  # nothing held
    result = cp.result()
    assert result["steps"] == [] and result["skipped"] == ["(whole trace): more than 10 nodes"]


def test_steps_are_summarised_as_they_end_and_forgotten(tmp_path):
    """Memory: at most two steps are held; each step's path is its own."""
    events = []
    for n in range(6):
        t = 1000 * n
        events += [{"ph": "X", "cat": "cpu_op", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1, "ts": t,
                    "dur": 900, "args": {}},
                   cpu_op("aten::mm", t + 100, 100 * (n + 1)), runtime("cudaLaunchKernel", t + 110, 5, corr=n + 1),
                   kernel("gemm", t + 120, 50, corr=n + 1)]
    trace = read_trace(write_trace(tmp_path / "t.json", events), cpu_ops=True)
    cp = CriticalPath()
    held = 0
    for columns in trace.events.column_chunks(1):
        cp.add(EventBatch(*columns))
        held = max(held, len(cp.regions))
    result = cp.result()
    assert held == 2
    # the last step is dropped as HTA drops it; each step is its ProfilerStep op, 900 us on one thread
    assert [s["step"] for s in result["steps"]] == [f"ProfilerStep#{n}" for n in range(5)]
    assert [s["path_us"] for s in result["steps"]] == [900] * 5
    assert [{t["name"]: t["time_us"] for t in s["top"]}["aten::mm"] for s in result["steps"]] == \
        [100 * (n + 1) - 5 for n in range(5)]  # (less its launch call's 5 us)
    assert result["total"]["path_us"] == 4500
    assert result["top"][0]["name"] == STEP_CODE


def test_gpufleet_analyze_prints_the_critical_path_and_its_finding(tmp_path):
    path = cuda_graph_step_trace(tmp_path / "t.json", graph=True)
    text, rc = run([str(path)], as_json=False, critical_path=True)
    assert rc == 0
    assert "critical path per step" in text and "k7_0" in text
    record, findings = analyze_file_with_findings(path, critical_path=True)
    assert record["critical_path"]["steps"][0]["gpu_compute_us"] == 400
    assert "critical_path_cpu" not in {f["rule"] for f in findings}  # the GPU set this step's pace
    without, _ = analyze_file_with_findings(path)
    assert "critical_path" not in without
    data = json.loads(run([str(path)], as_json=True, critical_path=True)[0])
    assert data["traces"][0]["analysis"]["critical_path"]["total"]["path_us"] == 450


@st.composite
def random_step(draw) -> list[dict]:
    """A step of nested operators on two threads launching kernels (some as one graph) onto
    three streams, with blocking synchronisations: random times, well formed."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100_000,
               "args": {}}]
    corr, gpu_free = 0, {7: 0, 8: 0, 9: 0}
    for tid in (1, 2):
        t = draw(st.integers(1, 50))
        for _ in range(draw(st.integers(1, 6))):
            op_start, n = t, draw(st.integers(0, 4))
            t += draw(st.integers(1, 20))
            inner = []
            for _ in range(n):
                corr += 1
                name = draw(st.sampled_from(["cudaLaunchKernel", "cudaLaunchKernel", "cudaGraphLaunch", "cudaMemcpy"]))
                dur = draw(st.integers(1, 30))
                inner.append({**runtime(name, t, dur, corr), "tid": tid})
                for _ in range(draw(st.integers(2, 3)) if name == "cudaGraphLaunch" else 1):
                    stream = draw(st.sampled_from([7, 8, 9]))
                    start = max(t + draw(st.integers(1, 40)), gpu_free[stream] + draw(st.integers(0, 20)))
                    kdur = draw(st.integers(1, 500))
                    gpu_free[stream] = start + kdur
                    inner.append(kernel(f"k{corr}", start, kdur, stream=stream, corr=corr))
                t += dur + draw(st.integers(0, 10))
            if draw(st.booleans()):
                corr += 1
                wait = max(gpu_free.values()) - t + 2 if draw(st.booleans()) else draw(st.integers(1, 50))
                inner.append({**runtime("cudaDeviceSynchronize", t, max(wait, 1), corr), "tid": tid})
                t += max(wait, 1) + 1
            events += [{**cpu_op(f"op{op_start}", op_start, t - op_start + 1), "tid": tid}, *inner]
            t += draw(st.integers(2, 30))
    return events


@given(random_step(), st.integers(1, 12))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_path_is_made_of_its_parts_and_fits_in_its_step(tmp_path, events, batch):
    """Whatever the step: the path's parts add up to it; it is at least as long as any kernel
    (a kernel alone is a path) and no longer than the time from the step's first node to its
    last (every edge goes forward in time and weighs at most the time it spans). However the
    events are batched, the path is the same."""
    path = write_trace(tmp_path / "t.json", events)
    whole = critical_path(path)
    assert critical_path(path, batch) == whole
    steps = whole["steps"]
    assert len(steps) == 1
    step = steps[0]
    assert sum(step[k] for k in PARTS) == pytest.approx(step["path_us"])
    kernels = [e for e in events if e["cat"] == "kernel"]
    assert step["path_us"] >= max((k["dur"] for k in kernels), default=0)
    first = min(e["ts"] for e in events)
    last = max(e["ts"] + e["dur"] for e in events)
    assert step["path_us"] <= last - first
    assert sum(step["streams"].values()) == pytest.approx(step["gpu_compute_us"] + step["communication_us"])
