"""The closed loop on plain state: an alert fires, its automatic profile is analysed (a real
trace our hook captured on an H200), and the alert comes back with the root cause."""

from pathlib import Path

import pytest

from gpufleet.analyze import analyze_file_with_findings
from schemas.codec import Codec
from schemas.topics import ALERTS, PROFILE_RESULTS, trace_id_of
from streams.alerts.detectors import DEFAULTS
from streams.alerts.raising import AlertConfig, raise_alerts
from streams.profiling.auto import AutoProfileConfig, auto_profile_requests
from streams.profiling.root_cause import FOLLOWS, apply_profile_result, profile_result
from streams.windows.workflow_state import WorkflowState
from tests.support.samples import BASE_MS, window

TRACE = Path(__file__).resolve().parents[3] / "data" / "hook-trace-h200.json.gz"
CONFIG = AlertConfig(min_duration_s=0)
MINUTE = 60_000


def low(i: int) -> dict:
    return window(window_start=BASE_MS + i * MINUTE, window_end=BASE_MS + (i + 1) * MINUTE, utilization_mean_pct=9.0)


def fire(state: dict) -> tuple[dict, dict]:
    """A low-utilisation alert fires and asks for a profile: (the alert, the request)."""
    alerts = raise_alerts(state, low(0), CONFIG, now_ms=1, thresholds=DEFAULTS)
    (request,) = auto_profile_requests(state, alerts, AutoProfileConfig(), now_ms=1)
    (alert,) = [a for a in alerts if a["detector"] == "low_utilization"]
    return alert, request


def result_of(request: dict, host: str = "host-a", rank: int = 0) -> dict:
    trace_id = trace_id_of(request["request_id"], host, rank)
    analysis, findings = analyze_file_with_findings(TRACE, request["workflow_id"], trace_id)
    return profile_result(analysis, findings, request["request_id"], host, rank, now_ms=5)


def test_the_alert_comes_back_with_the_root_cause_of_its_profile():
    state = WorkflowState(partition=0)
    alert, request = fire(state)
    assert alert["profile_request_id"] == request["request_id"] and alert["root_cause"] is None
    result = result_of(request)
    assert Codec().decode(Codec().encode(PROFILE_RESULTS.schema, result))[1] == result  # it fits its schema

    updated = apply_profile_result(state, result, now_ms=10)
    assert updated["alert_id"] == alert["alert_id"] and updated["status"] == "FIRING" and updated["notify"]
    assert updated["fired_at"] == 10
    assert [f["rule"] for f in updated["findings"]] == ["low_utilization_chunks", "launch_bound"]
    assert updated["findings"][0]["ranks"] == 1
    # The trace: 98.9 % idle, nearly all of it waiting on the host (116.3 of 116.9 ms).
    assert updated["root_cause"].startswith("GPU idle 99 % of the profiled time, 100 % of it waiting on the host "
                                            "(1 rank profiled).")
    assert "Try: Profile the low chunks" in updated["root_cause"]
    assert FOLLOWS not in updated["message"]
    assert updated["message"].endswith(f"Automatic profile {request['request_id']}: {updated['root_cause']}")
    assert Codec().decode(Codec().encode(ALERTS.schema, updated))[1] == updated


def test_more_ranks_merge_without_a_second_message_and_a_replay_changes_nothing():
    state = WorkflowState(partition=0)
    _, request = fire(state)
    first = apply_profile_result(state, result_of(request, "host-a", 0), now_ms=10)
    assert apply_profile_result(state, result_of(request, "host-a", 0), now_ms=11) is None  # replayed
    second = apply_profile_result(state, result_of(request, "host-b", 1), now_ms=12)
    assert first["notify"] and not second["notify"]  # the owner is told the root cause once
    assert [f["ranks"] for f in second["findings"]] == [2, 2]
    assert "(2 ranks profiled)" in second["root_cause"]


def test_the_root_cause_stays_on_the_episode_and_a_new_episode_starts_without_it():
    state = WorkflowState(partition=0)
    _, request = fire(state)
    apply_profile_result(state, result_of(request), now_ms=10)
    healthy = window(window_start=BASE_MS + MINUTE, window_end=BASE_MS + 2 * MINUTE, utilization_mean_pct=80.0)
    (resolved,) = raise_alerts(state, healthy, CONFIG, now_ms=20, thresholds=DEFAULTS)
    assert resolved["status"] == "RESOLVED" and resolved["root_cause"] and resolved["findings"]
    # A result landing after the resolution updates the resolved alert, and nobody is messaged.
    late = apply_profile_result(state, result_of(request, "host-b", 1), now_ms=21)
    assert late["status"] == "RESOLVED" and not late["notify"]
    # More than the hour after it resolved, the same detector fires a new episode: clean.
    later = BASE_MS + 120 * MINUTE
    again = raise_alerts(state, window(window_start=later, window_end=later + MINUTE, utilization_mean_pct=9.0),
                         CONFIG, now_ms=30, thresholds=DEFAULTS)
    (fired,) = [a for a in again if a["detector"] == "low_utilization"]
    assert fired["status"] == "FIRING" and fired["root_cause"] is None and fired["findings"] == []
    assert fired["profile_request_id"] is None


def test_what_the_hosts_saw_during_the_profile_joins_the_root_cause():
    """The 10 Hz context of each rank's capture: its numbers, weighted by the time each covers."""
    state = WorkflowState(partition=0)
    _, request = fire(state)

    def seen(span_ms, util, cpu):
        return {"ticks": span_ms // 100, "span_ms": span_ms, "interval_ms_mean": 100.0, "gpus": 1,
                "gpu_utilization_mean_pct": util, "gpu_zero_utilization_share": 0.9, "sm_active_mean_pct": None,
                "power_mean_watts": 80.0, "memory_peak_fraction": 0.1, "workflow_cpu_mean_pct": 100.0,
                "host_cpu_mean_pct": cpu, "host_iowait_mean_pct": 0.0}

    first = {**result_of(request, "host-a", 0), "system": seen(3000, 4.0, 96.0)}
    assert Codec().decode(Codec().encode(PROFILE_RESULTS.schema, first))[1] == first
    one = apply_profile_result(state, first, now_ms=10)
    assert ("Meanwhile the host agents measured GPU utilisation 4 %, host CPU 96 %, I/O wait 0 % "
            "(30 samples, one every 100 ms).") in one["root_cause"]
    two = apply_profile_result(state, {**result_of(request, "host-b", 1), "system": seen(1000, 8.0, 50.0)}, now_ms=11)
    assert "GPU utilisation 5 %, host CPU 84 %, I/O wait 0 % (40 samples" in two["root_cause"]
    plain = WorkflowState(
        partition=0
    )  # results without the hosts' view (no agent context on the trace) say nothing of it
    _, req = fire(plain)
    assert "Meanwhile" not in apply_profile_result(plain, result_of(req), now_ms=10)["root_cause"]


@pytest.mark.parametrize("request_id", ["periodic-1", "someone-else"])
def test_results_of_other_profiles_leave_alerts_alone(request_id):
    state = WorkflowState(partition=0)
    _, request = fire(state)
    other = {**result_of(request), "request_id": request_id}
    assert apply_profile_result(state, other, now_ms=10) is None
    assert apply_profile_result(WorkflowState(partition=0), other, now_ms=10) is None
