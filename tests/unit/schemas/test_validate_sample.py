import math

import pytest

from schemas.validate_sample import validate_sample
from tests.support.samples import sample


def test_a_good_sample_passes():
    assert validate_sample(sample()) is None
    assert validate_sample(sample(memory_used_bytes=None, power_watts=None, memory_utilization_pct=None)) is None


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"utilization_pct": -5.0}, "utilization_pct -5.0 is outside 0..100"),
        ({"utilization_pct": 100.5}, "utilization_pct 100.5 is outside"),
        ({"utilization_pct": math.nan}, "utilization_pct nan"),
        ({"memory_utilization_pct": 120.0}, "memory_utilization_pct 120.0"),
        ({"workflow_id": ""}, "empty workflow_id"),
        ({"event_time": 1_767_225_600}, "expected epoch milliseconds"),
        ({"interval_ms": 0}, "interval_ms 0"),
        ({"memory_used_bytes": -1}, "negative"),
        ({"memory_used_bytes": 100, "memory_total_bytes": 10}, "exceeds memory_total_bytes"),
        ({"power_watts": -3.0}, "power_watts -3.0 is negative"),
        ({"share": 0.0}, "share 0.0 is outside (0, 1]"),
    ],
)
def test_impossible_values_are_named(overrides, words):
    reason = validate_sample(sample(**overrides))
    assert reason is not None and words in reason
