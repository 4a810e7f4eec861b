"""Firing low-utilisation and input-bound alerts ask for one profile per workflow per 6 hours."""

from streams.profiling.auto import AutoProfileConfig, auto_profile_requests, request_id_for
from streams.profiling.root_cause import FOLLOWS
from streams.windows.workflow_state import WorkflowState
from tests.support.samples import BASE_MS

HOUR = 3_600_000


def alert(detector="low_utilization", status="FIRING", end=BASE_MS, wf="wf-a"):
    return {"alert_id": f"{detector}:{wf}:{BASE_MS}", "detector": detector, "status": status, "workflow_id": wf,
            "window_end": end, "message": "Mean GPU utilisation 9 %."}


def test_one_profile_per_workflow_per_interval_for_the_right_alerts():
    state, config = WorkflowState(partition=0), AutoProfileConfig()
    fired = alert()
    (request,) = auto_profile_requests(state, [fired, alert("input_bound")], config, now_ms=42)
    # The alert and its episode know the profile: its findings will update this alert.
    assert fired["profile_request_id"] == request["request_id"] == state.alerts["low_utilization"]["profile_request_id"]
    assert fired["message"] == "Mean GPU utilisation 9 %." + FOLLOWS
    assert request["reason"] == "AUTO" and request["hosts"] == [] and request["steps"] == 20
    assert request["requester"] == f"low_utilization:wf-a:{BASE_MS}"
    assert request["request_id"] == request_id_for(request["requester"]) == f"auto-low_utilization_wf-a_{BASE_MS}"
    assert request["deadline_ms"] == 42 + 600_000
    assert auto_profile_requests(state, [alert("input_bound", end=BASE_MS + 5 * HOUR)], config, 0) == []
    assert len(auto_profile_requests(state, [alert(end=BASE_MS + 6 * HOUR)], config, 0)) == 1


def test_other_detectors_resolutions_and_a_disabled_loop_ask_for_nothing():
    state = WorkflowState(partition=0)
    assert auto_profile_requests(state, [alert("idle_allocated"), alert("throttling"), alert(status="RESOLVED")],
                                 AutoProfileConfig(), 0) == []
    assert auto_profile_requests(state, [alert()], AutoProfileConfig(enabled=False), 0) == []
    assert state == WorkflowState(partition=0)
