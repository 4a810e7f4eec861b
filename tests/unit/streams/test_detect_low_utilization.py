import pytest

from streams.detect_low_utilization import LowUtilizationConfig, detect_low_utilization
from tests.unit.samples import window

CFG = LowUtilizationConfig(threshold_pct=30.0, critical_pct=5.0)


def test_no_alert_at_or_above_the_threshold():
    assert detect_low_utilization(window(utilization_mean_pct=30.0), CFG, fired_at=1) is None
    assert detect_low_utilization(window(utilization_mean_pct=95.0), CFG, fired_at=1) is None


def test_warning_says_what_is_wrong_with_the_numbers_and_what_to_try():
    alert = detect_low_utilization(window(utilization_mean_pct=20.0, gpu_seconds=7200.0), CFG, fired_at=42)
    assert alert["severity"] == "WARNING"
    assert alert["observed"] == 20.0 and alert["threshold"] == 30.0
    assert "20.0%" in alert["message"] and "1.60 GPU-hours wasted" in alert["message"]
    assert "num_workers" in alert["advice"]
    assert alert["fired_at"] == 42 and alert["owner"] == "alice@example.com"


def test_idle_gpus_are_critical():
    alert = detect_low_utilization(window(utilization_mean_pct=0.0), CFG, fired_at=1)
    assert alert["severity"] == "CRITICAL"
    assert "almost idle" in alert["message"] and "release" in alert["advice"]


def test_alert_id_is_deterministic_per_workflow_and_window():
    a = detect_low_utilization(window(utilization_mean_pct=10.0), CFG, fired_at=1)
    b = detect_low_utilization(window(utilization_mean_pct=10.0), CFG, fired_at=2)
    c = detect_low_utilization(window(utilization_mean_pct=10.0, window_start=0), CFG, fired_at=1)
    assert a["alert_id"] == b["alert_id"] != c["alert_id"]


@pytest.mark.parametrize("threshold", [10.0, 50.0])
def test_threshold_is_configurable(threshold):
    cfg = LowUtilizationConfig(threshold_pct=threshold)
    fired = detect_low_utilization(window(utilization_mean_pct=20.0), cfg, fired_at=1) is not None
    assert fired == (20.0 < threshold)
