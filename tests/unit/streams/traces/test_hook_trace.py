"""The analysis of a trace our profiling hook captured on a real GPU (tests/data/README.md)."""


from gpufleet.analyze import analyze_file_with_findings
from producers.traces.read import read_trace
from tests.support.traces import HOOK_TRACE as TRACE


def test_a_hook_trace_from_an_h200_reads_whole_with_its_steps():
    trace = read_trace(TRACE)
    assert not trace.partial and trace.rank == 0
    steps = {e["name"] for e in trace.events if e["name"].startswith("ProfilerStep#")}
    # HTA's loading rule: the last step may be cut short by the capture, so it is left out.
    assert trace.last_step_dropped
    assert steps == {f"ProfilerStep#{i}" for i in range(29)}


def test_the_starved_small_model_is_found_idle_and_launch_bound():
    record, findings = analyze_file_with_findings(TRACE, "wf-small", "profile/req-1/host-a/rank0")
    assert record["gpu_events"] == 667 and record["launches"] == 609
    assert record["idle_pct"] > 95  # 2 ms of input wait per step against microseconds of kernels
    assert record["launch_delay_outliers"] == 0
    rules = {f["rule"]: f for f in findings}
    assert set(rules) == {"low_utilization_chunks", "launch_bound"}, sorted(rules)
    assert rules["low_utilization_chunks"]["severity"] == "CRITICAL"
    assert "30 of 30 time chunks" in rules["low_utilization_chunks"]["evidence"]
    assert "CUDA graphs" in rules["launch_bound"]["recommendation"]
    assert all(f["workflow_id"] == "wf-small" and f["trace_id"] == "profile/req-1/host-a/rank0" for f in findings)
