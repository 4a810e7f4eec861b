"""Plain helpers of the worker's wiring."""

from streams.stage_io import drop_unowned


def test_state_of_partitions_owned_elsewhere_is_dropped_with_its_unsaved_changes():
    data = {"wf-a": {"partition": 0}, "wf-b": {"partition": 3}, "wf-c@1": {"partition": 3}, "wf-d": {"partition": 5}}
    unsaved = {"wf-a": 0, "wf-b": 3, "wf-gone": 3}
    assert drop_unowned(data, {0, 5}, unsaved) == 2
    assert data == {"wf-a": {"partition": 0}, "wf-d": {"partition": 5}}
    assert unsaved == {"wf-a": 0}
