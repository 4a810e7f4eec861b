"""Per-step timelines: each GPU event belongs to the step its launch call was made in."""

from __future__ import annotations

import pytest

from gpufleet.analyze import analyze_file
from streams.traces.temporal_breakdown import Coverage
from tests.support.traces import kernel, runtime, step, synthetic_job_trace, write_trace


def test_each_step_has_the_gpu_work_launched_during_it(tmp_path):
    # Step 1 launches two kernels (the second runs on after the step ends on the CPU), step 2 one
    # kernel late; step 3 is the last and dropped (HTA's rule), with what it launched.
    events = [step(1, 0, 100), runtime("cudaLaunchKernel", 10, 5, corr=1), kernel("gemm", 20, 30, corr=1),
              runtime("cudaLaunchKernel", 60, 5, corr=2), kernel("Memcpy HtoD (Pinned -> Device)", 90, 40, corr=2,
                                                                  cat="gpu_memcpy"),
              step(2, 100, 100), runtime("cudaLaunchKernel", 110, 5, corr=3), kernel("gemm", 180, 10, corr=3),
              step(3, 200, 100), runtime("cudaLaunchKernel", 210, 5, corr=4), kernel("gemm", 220, 10, corr=4)]
    steps = {s["step"]: s for s in analyze_file(write_trace(tmp_path / "t.json", events))["steps"]}
    assert list(steps) == ["ProfilerStep#1", "ProfilerStep#2"]
    one, two = steps["ProfilerStep#1"], steps["ProfilerStep#2"]
    assert (one["cpu_us"], one["gpu_events"], one["gpu_span_us"], one["gpu_busy_us"], one["gpu_idle_us"],
            one["compute_us"]) == (100, 2, 110, 70, 40, 30)
    assert (two["gpu_events"], two["gpu_span_us"], two["gpu_busy_us"], two["compute_us"]) == (1, 10, 10, 10)


def test_steps_of_a_multi_stream_trace_add_up(tmp_path):
    """On the synthetic job, each step's busy time is the union of its own events' intervals,
    computed here from the events directly."""
    from producers.traces.read import read_trace

    path = synthetic_job_trace(tmp_path / "t.json")
    events = list(read_trace(path).events)
    result = analyze_file(path)
    assert len(result["steps"]) == result["profiler_steps"] == 5
    bounds = {e["name"]: (e["ts"], e["end"]) for e in events if e["name"].startswith("ProfilerStep#")}
    calls = {e["correlation"]: e["ts"] for e in events if e["kind"] == "runtime"}
    for s in result["steps"]:
        start, end = bounds[s["step"]]
        mine = sorted((e["ts"], e["end"]) for e in events
                      if e["stream"] >= 0 and start <= calls.get(e["correlation"], -1) < end)
        union = Coverage()
        for ts, stop in mine:
            union.add(ts, stop)
        assert s["gpu_events"] == len(mine) and s["gpu_busy_us"] == pytest.approx(union.covered)
        assert s["gpu_span_us"] == pytest.approx(union.span) and s["cpu_us"] == end - start
