"""Job-to-date totals, the end of a workflow, and idle partitions."""

import pytest

from streams.windows.batches import Incoming, WindowConfig
from streams.windows.summary import accumulate, correct, summary
from streams.windows.utilization import WindowAggregator
from streams.windows.workflow_state import WorkflowState
from tests.support.samples import BASE_MS, sample, window

CFG = WindowConfig(size_ms=60_000, allowed_lateness_ms=10_000, retention_ms=3_600_000)


def test_totals_over_windows():
    state = WorkflowState(partition=0, owner="ana")
    accumulate(state, window(gpu_seconds=120.0, utilization_mean_pct=50.0, wasted_gpu_seconds=60.0), [])
    later = window(window_start=BASE_MS + 60_000, window_end=BASE_MS + 120_000, gpu_seconds=60.0,
                   utilization_mean_pct=20.0, wasted_gpu_seconds=48.0, gpu_count=3, xid_count=2)
    accumulate(state, later, [{"status": "FIRING", "detector": "low_utilization"}])
    s = summary("wf-a", state, "no samples for 600 s", now_ms=7)
    assert (s["first_window_start"], s["last_window_end"], s["windows"], s["max_gpus"]) == (
        BASE_MS, BASE_MS + 120_000, 2, 3)
    assert s["gpu_seconds"] == 180.0 and s["wasted_gpu_seconds"] == 108.0
    assert s["utilization_mean_pct"] == pytest.approx((50 * 120 + 20 * 60) / 180)
    assert s["alerts_fired"] == ["low_utilization"] and s["xid_count"] == 2 and s["owner"] == "ana"
    assert summary("wf-b", WorkflowState(partition=0), "x", 0) is None


def test_a_window_completed_late_replaces_its_first_emission_in_the_totals():
    first = window(gpu_seconds=60.0, utilization_mean_pct=50.0, wasted_gpu_seconds=30.0, energy_joules=100.0)
    complete = window(gpu_seconds=120.0, utilization_mean_pct=40.0, wasted_gpu_seconds=72.0, energy_joules=250.0,
                      gpu_count=4, xid_count=1)
    late_only = window(window_start=BASE_MS + 60_000, window_end=BASE_MS + 120_000, gpu_seconds=30.0,
                       utilization_mean_pct=10.0, wasted_gpu_seconds=27.0, energy_joules=None)
    corrected, direct = WorkflowState(partition=0), WorkflowState(partition=0)
    accumulate(corrected, first, [])
    correct(corrected, first, complete)
    correct(corrected, None, late_only)  # a window that never closed before: all its samples came late
    accumulate(direct, complete, [])
    accumulate(direct, late_only, [])
    a, b = summary("wf-a", corrected, "r", 0), summary("wf-a", direct, "r", 0)
    assert a.keys() == b.keys()
    for k, v in b.items():
        assert a[k] == (pytest.approx(v) if isinstance(v, float) else v), k


def feed(agg, partition, samples, first=0):
    return agg.process(partition, [Incoming.row(first + i, s) for i, s in enumerate(samples)], closed_at=0)


def test_a_workflow_ends_after_silence_in_event_time():
    agg = WindowAggregator(CFG, {})
    both = [sample(workflow_id=wf, event_time=BASE_MS + t * 1000) for t in range(90) for wf in ("wf-a", "wf-b")]
    feed(agg, 0, both)
    assert agg.ended(0, 60_000) == []
    feed(agg, 0, [sample(workflow_id="wf-b", event_time=BASE_MS + t * 1000) for t in range(90, 200)], first=500)
    assert agg.ended(0, 60_000) == ["wf-a"]  # silent since 89 s, the partition is at 199 s
    agg.store["wf-a"].ended = True
    assert agg.ended(0, 60_000) == []
    feed(agg, 0, [sample(workflow_id="wf-a", event_time=BASE_MS + 200_000)], first=900)
    assert not agg.store["wf-a"].ended  # it came back: a new life


def test_an_idle_partition_follows_the_busy_ones():
    agg = WindowAggregator(CFG, {})
    feed(agg, 0, [sample(workflow_id="wf-a", event_time=BASE_MS + t * 1000) for t in range(50)])
    feed(agg, 1, [sample(workflow_id="wf-b", event_time=BASE_MS + t * 1000) for t in range(300)])
    result = agg.advance(0, agg.newest(1), closed_at=0)
    assert [(w["workflow_id"], w["window_start"]) for w in result.closed] == [("wf-a", BASE_MS)]
    assert agg.ended(0, 60_000) == ["wf-a"]
    assert agg.advance(1, agg.newest(0), closed_at=0).closed == []  # never backwards


def test_a_quiet_partition_follows_the_fleet_clock_only_when_far_enough_behind():
    agg = WindowAggregator(CFG, {})
    feed(agg, 0, [sample(workflow_id="wf-a", event_time=BASE_MS + t * 1000) for t in range(50)])
    assert agg.follow(0, BASE_MS + 100_000, quiet_ms=60_000, closed_at=0).closed == []  # 51 s behind: not quiet
    result = agg.follow(0, BASE_MS + 120_000, quiet_ms=60_000, closed_at=0)
    assert [(w["workflow_id"], w["window_start"]) for w in result.closed] == [("wf-a", BASE_MS)]
    assert agg.newest(0) == BASE_MS + 120_000
    assert agg.follow(1, BASE_MS + 999_000, quiet_ms=0, closed_at=0).closed == []  # no clock of its own yet


def test_a_workflow_its_hosts_ended_is_summarised_once_its_windows_close():
    agg = WindowAggregator(CFG, {})
    feed(agg, 0, [sample(workflow_id="wf-a", event_time=BASE_MS + t * 1000) for t in range(50)])
    agg.store["wf-a"].ending = True
    assert agg.ended(0, 600_000) == []  # its window [0, 60 s) is still open
    feed(agg, 0, [sample(workflow_id="wf-b", event_time=BASE_MS + t * 1000) for t in range(50, 75)], first=100)
    assert agg.ended(0, 600_000) == ["wf-a"]


def test_an_ending_heard_before_any_sample_waits_for_the_samples():
    agg = WindowAggregator(CFG, {})
    agg.state_of("wf-a", 0).ending = True  # the agent's ENDED arrived first
    assert agg.ended(0, 60_000) == []
    feed(agg, 0, [sample(workflow_id="wf-a", event_time=BASE_MS + t * 1000) for t in range(60)])
    assert agg.ended(0, 60_000) == []  # its window is still open
    feed(agg, 0, [sample(workflow_id="wf-b", event_time=BASE_MS + 75_000)], first=100)
    assert agg.ended(0, 60_000) == ["wf-a"]


def test_the_summary_counts_the_gpus_no_process_of_the_job_ever_opened():
    """The GPUs the scheduler gave and no process opened over the job's whole life (issue 42: a
    job that ran on the CPU only is told that, not start-up advice); None where no agent counted."""
    agg = WindowAggregator(CFG, {})
    gpus = [("g0", "node-7/gpu0"), ("g1", "node-7/gpu1"), ("g2", "node-7/gpu2")]
    rows = [sample(workflow_id="wf-cpu", gpu_uuid=uuid, gpu_index=i, host="node-7", event_time=BASE_MS + t * 1000,
                   utilization_pct=0.0, process_count=0) for t in range(130) for i, (uuid, _) in enumerate(gpus[:2])]
    # another job opens one of its two GPUs only in its second minute
    rows += [sample(workflow_id="wf-half", gpu_uuid=uuid, gpu_index=i, host="node-8", event_time=BASE_MS + t * 1000,
                    utilization_pct=50.0 if i == 0 else 0.0, process_count=1 if (i == 0 and t >= 60) else 0)
             for t in range(130) for i, (uuid, _) in enumerate(gpus)]
    rows += [sample(workflow_id="wf-old", event_time=BASE_MS + t * 1000, process_count=None) for t in range(130)]
    closed = feed(agg, 0, rows).closed
    closed += agg.process(0, [Incoming.row(10_000, sample(workflow_id="wf-clock", event_time=BASE_MS + 600_000))],
                          closed_at=0).closed
    for w in closed:  # as the window step does with each closed window
        accumulate(agg.store[w["workflow_id"]], w, [])
    summaries = {wf: summary(wf, agg.store[wf], "r", 0) for wf in ("wf-cpu", "wf-half", "wf-old")}
    assert all(s["windows"] >= 2 for s in summaries.values())  # both whole minutes closed
    assert summaries["wf-cpu"]["untouched_gpus"] == summaries["wf-cpu"]["max_gpus"] == 2
    assert summaries["wf-half"]["untouched_gpus"] == 2 and summaries["wf-half"]["max_gpus"] == 3
    assert summaries["wf-old"]["untouched_gpus"] is None
