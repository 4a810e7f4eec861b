"""Every detector on crafted windows: fires exactly when its condition holds."""

import pytest

from streams.alerts.detectors import DEFAULTS, DETECTORS, DetectorConfig, detect
from streams.windows.workflow_state import WorkflowState
from tests.support.samples import BASE_MS, window

CFG = DetectorConfig()


def serving(state, **figures):
    """A serving replica's figures for its window (``streams.serving.traffic.close``)."""
    return {"state": state, "service": "sd-xl", "requests": 0.0, "requests_per_s": 0.0, "queue_time_ms": None,
            "waiting_max": None, "capacity_per_s": 2.0, "idle_since": None, **figures}


CASES = [
    ({"utilization_mean_pct": 60.0}, set()),
    ({"utilization_mean_pct": 20.0}, {"low_utilization"}),
    # One message per cause: every GPU idle is the idle allocation, not low utilisation as well.
    ({"utilization_mean_pct": 0.0, "idle_gpus": 2, "gpu_count": 2, "utilization_max_pct": 0.0},
     {"idle_allocated"}),
    ({"utilization_mean_pct": 4.0, "idle_gpus": 1, "gpu_count": 2}, {"low_utilization", "partial_use"}),
    ({"idle_gpus": 1, "gpu_count": 4}, {"partial_use"}),
    ({"gpu_count": 4, "utilization_max_pct": 90.0, "gpu_imbalance_pct": 60.0}, {"imbalance"}),
    ({"gpu_count": 4, "utilization_max_pct": 90.0, "gpu_imbalance_pct": 20.0}, set()),
    ({"memory_peak_fraction": 0.1}, {"memory_underuse"}),
    ({"throttled_gpu_seconds": 30.0, "gpu_seconds": 120.0}, {"throttling"}),
    ({"throttled_gpu_seconds": 10.0, "gpu_seconds": 120.0}, set()),
    ({"xid_count": 1}, {"hardware_fault"}),
    ({"ecc_uncorrected_max": 3}, {"hardware_fault"}),
    ({"utilization_mean_pct": 30.0, "workflow_cpu_mean_pct": 200.0, "gpu_count": 2}, {"input_bound"}),
    ({"utilization_mean_pct": 30.0, "workflow_cpu_mean_pct": 100.0, "gpu_count": 2}, set()),
    ({"utilization_mean_pct": 30.0, "host_iowait_mean_pct": 35.0}, {"input_bound"}),
    ({"utilization_mean_pct": 80.0, "workflow_cpu_mean_pct": 800.0, "gpu_count": 2}, set()),
    ({"foreign_workflows": ["wf-b"]}, {"foreign_process"}),
    ({"foreign_workflows": []}, set()),
    # A serving replica: judged by its traffic (raise_alerts sets the GPU-usage detectors aside for it).
    ({"serving": serving("IDLE", idle_since=0)}, {"idle_replica"}),
    ({"serving": serving("IDLE", idle_since=BASE_MS + 60_000 - 600_000)}, set()),  # idle 10 min of the 30 it takes
    ({"serving": serving("SATURATED", queue_time_ms=2500.0, requests_per_s=2.0)}, {"saturated"}),
    ({"serving": serving("SATURATED", waiting_max=7.0, requests_per_s=2.0)}, {"saturated"}),
    ({"serving": serving("HEADROOM", requests_per_s=0.4)}, set()),
    ({"serving": serving("BUSY", requests_per_s=1.9)}, set()),
]


@pytest.mark.parametrize("overrides, fired", CASES)
def test_detectors(overrides, fired):
    assert set(detect(window(**overrides), CFG)) == fired


def test_every_registered_detector_has_a_case_that_fires_it():
    """A detector is a function in streams/alerts/detectors.py, in DETECTORS, with a case here."""
    assert {fn.__name__ for fn in DETECTORS} == {name for _, fired in CASES for name in fired}


def test_low_utilization_severity_and_words():
    v = detect(window(utilization_mean_pct=10.0, low_util_gpu_seconds=7200.0), CFG)["low_utilization"]
    assert v.severity == "CRITICAL" and v.threshold == 15.0 and v.min_duration_s == 600
    assert (
        "under 25% mean utilisation (10.0% in its last 1-min window" in v.message
        and "2.00 GPU-hours wasted" in v.message
    )
    assert detect(window(utilization_mean_pct=20.0), CFG)["low_utilization"].severity == "WARNING"


def test_thresholds_are_configurable():
    strict = DetectorConfig(low_util_warn_pct=70.0, low_util_critical_pct=40.0)
    assert detect(window(utilization_mean_pct=50.0), strict)["low_utilization"].severity == "WARNING"


def test_team_thresholds_from_a_file(tmp_path):
    import pytest as _pytest

    from streams.alerts.detectors import load_thresholds
    from streams.alerts.raising import AlertConfig, raise_alerts

    path = tmp_path / "thresholds.toml"
    path.write_text("[default]\nlow_util_warn_pct = 30.0\n[teams.research]\nlow_util_warn_pct = 10.0\n"
                    "low_util_critical_pct = 5.0\n")
    thresholds = load_thresholds(path)
    default, teams = thresholds.default, thresholds.teams
    assert default.low_util_warn_pct == 30.0 and teams["research"].low_util_warn_pct == 10.0
    assert teams["research"].idle_min_s == default.idle_min_s  # the rest comes from [default]
    config = AlertConfig(min_duration_s=0)
    for team, fires in (("research", False), ("vision", True)):
        alerts = raise_alerts(WorkflowState(partition=0), window(team=team, utilization_mean_pct=20.0), config,
                              now_ms=0, thresholds=thresholds)
        assert any(a["detector"] == "low_utilization" for a in alerts) == fires
    path.write_text("[teams.x]\nlow_util_pct = 1\n")
    with _pytest.raises(ValueError, match="unknown thresholds in \\[teams.x\\]: low_util_pct"):
        load_thresholds(path)


def test_memory_underuse_is_judged_over_the_job_so_far():
    """Fires after 30 minutes of a job under 20 % memory; one window that used more clears the
    job for good, even when later windows are small again."""
    from streams.alerts.raising import AlertConfig, raise_alerts
    from streams.windows.summary import accumulate
    from streams.windows.workflow_state import WorkflowState
    from tests.support.samples import BASE_MS

    config, state, fired = AlertConfig(), WorkflowState(partition=0), []

    def close(minute, peak):
        w = window(window_start=BASE_MS + minute * 60_000, window_end=BASE_MS + (minute + 1) * 60_000,
                   memory_peak_fraction=peak)
        alerts = [a for a in raise_alerts(state, w, config, now_ms=0, thresholds=DEFAULTS)
                  if a["detector"] == "memory_underuse"]
        accumulate(state, w, alerts)
        fired.extend((minute, a["status"]) for a in alerts)

    for minute in range(35):
        close(minute, 0.1)
    assert fired == [(29, "FIRING")]  # 30 minutes of windows under 20 %
    close(35, 0.6)  # the job used its memory after all
    assert fired[-1] == (35, "RESOLVED")
    for minute in range(36, 120):  # past any cooldown: small windows again, but not the whole job
        close(minute, 0.1)
    assert fired == [(29, "FIRING"), (35, "RESOLVED")]


def test_gpus_the_scheduler_gave_and_no_process_opened_are_named():
    """A CPU-only job that asked for GPUs; a job that opens one of its two."""
    never = window(utilization_mean_pct=0.0, idle_gpus=2, gpu_count=2, utilization_max_pct=0.0,
                   idle_gpu_names=["node-7/gpu0", "node-7/gpu1"], untouched_gpu_names=["node-7/gpu0", "node-7/gpu1"])
    v = detect(never, CFG)["idle_allocated"]
    assert "no process opened them (node-7/gpu0, node-7/gpu1)" in v.message and "CPU only" in v.advice
    half = window(idle_gpus=1, gpu_count=2, idle_gpu_names=["node-7/gpu1"], untouched_gpu_names=["node-7/gpu1"])
    v = detect(half, CFG)["partial_use"]
    assert "while the others worked, and no process of the job ever opened them: node-7/gpu1." in v.message
    v = detect(window(idle_gpus=2, gpu_count=4, idle_gpu_names=["node-7/gpu1", "node-7/gpu2"],
                      untouched_gpu_names=["node-7/gpu2"]), CFG)["partial_use"]
    assert "worked: node-7/gpu1, node-7/gpu2. No process of the job ever opened node-7/gpu2." in v.message
    assert "ask for only the GPUs it opens" in v.advice


def test_another_workflow_on_the_jobs_gpus_names_both():
    v = detect(window(workflow_id="slurm-88", foreign_workflows=["wf-a"]), CFG)["foreign_process"]
    assert "wf-a" in v.message and "slurm-88" in v.message and v.severity == "WARNING"
