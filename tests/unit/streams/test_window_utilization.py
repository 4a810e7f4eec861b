import json
import random

import pytest

from streams.window_utilization import Incoming, WindowAggregator, WindowConfig
from tests.unit.samples import BASE_MS, assert_window_matches, expected_windows, sample

CFG = WindowConfig(size_ms=60_000, allowed_lateness_ms=10_000, retention_ms=600_000)


def feed(agg, partition, samples, first_offset=0, closed_at=0):
    batch = [Incoming.row(first_offset + i, s) for i, s in enumerate(samples)]
    return agg.process(partition, batch, closed_at=closed_at)


def series(workflow="wf-a", seconds=60, start=BASE_MS, gpus=2, util=lambda t, g: 40.0 + g):
    return [
        sample(workflow_id=workflow, event_time=start + t * 1000, gpu_uuid=f"{workflow}-gpu{g}",
               gpu_index=g, utilization_pct=util(t, g))
        for t in range(seconds) for g in range(gpus)
    ]


def test_window_stays_open_until_the_watermark_passes_its_end():
    agg = WindowAggregator(CFG, {})
    first = series(seconds=60)
    assert feed(agg, 0, first).closed == []
    # Event time 60..69 s: the watermark (max - 10 s) is still short of the window end.
    r = feed(agg, 0, series(seconds=10, start=BASE_MS + 60_000), first_offset=len(first))
    assert r.closed == []
    r = feed(agg, 0, [sample(event_time=BASE_MS + 70_000)], first_offset=1000)
    assert [w["window_start"] for w in r.closed] == [BASE_MS]


def test_closed_window_equals_the_direct_aggregate():
    rng = random.Random(3)
    samples = series(seconds=90, gpus=3, util=lambda t, g: rng.uniform(0, 100))
    samples[5]["memory_used_bytes"] = None
    samples[7]["power_watts"] = None
    samples[9]["interval_ms"] = 2000
    agg = WindowAggregator(CFG, {})
    r = feed(agg, 0, samples, closed_at=123)
    assert len(r.closed) == 1
    expected = expected_windows(samples)[("wf-a", BASE_MS)]
    assert_window_matches(r.closed[0], expected)
    assert r.closed[0]["closed_at"] == 123 and r.closed[0]["owner"] == "alice@example.com"


def test_batch_boundaries_do_not_change_the_result():
    samples = series(seconds=200, gpus=2, util=lambda t, g: (t * 7 + g) % 100)
    whole = feed(WindowAggregator(CFG, {}), 0, samples).closed
    agg, pieces, offset = WindowAggregator(CFG, {}), [], 0
    for size in (1, 7, 50, 33, 1000):
        chunk = samples[offset:offset + size]
        pieces += feed(agg, 0, chunk, first_offset=offset).closed
        offset += size
    assert pieces == whole and len(whole) == 3


def test_partitions_have_their_own_watermarks():
    agg = WindowAggregator(CFG, {})
    feed(agg, 0, series("wf-a", seconds=30))
    r = feed(agg, 1, series("wf-b", seconds=200), first_offset=0)
    assert {w["workflow_id"] for w in r.closed} == {"wf-b"}  # wf-a's partition has not moved
    r = feed(agg, 0, series("wf-a", seconds=100, start=BASE_MS + 30_000), first_offset=500)
    assert [(w["workflow_id"], w["window_start"]) for w in r.closed] == [("wf-a", BASE_MS)]


def test_one_partition_closes_windows_of_every_workflow_on_it():
    agg = WindowAggregator(CFG, {})
    feed(agg, 0, series("wf-quiet", seconds=20))
    r = feed(agg, 0, series("wf-busy", seconds=80), first_offset=100)
    assert sorted(w["workflow_id"] for w in r.closed) == ["wf-busy", "wf-quiet"]


def test_late_sample_is_reported_with_a_reason_not_applied():
    agg = WindowAggregator(CFG, {})
    feed(agg, 0, series(seconds=75))
    r = feed(agg, 0, [sample(event_time=BASE_MS + 30_000, utilization_pct=0.0)], first_offset=999)
    assert r.closed == [] and len(r.late) == 1
    item, reason = r.late[0]
    assert item.offset == 999
    assert "already closed by the watermark" in reason and "wf-a" in reason


def test_sample_within_allowed_lateness_still_counts():
    agg = WindowAggregator(CFG, {})
    samples = series(seconds=65, gpus=1)
    feed(agg, 0, samples)
    straggler = sample(event_time=BASE_MS + 59_000, gpu_uuid="wf-a-gpu9")
    r = feed(agg, 0, [straggler], first_offset=100)
    assert r.late == []
    r = feed(agg, 0, [sample(event_time=BASE_MS + 71_000, gpu_uuid="wf-a-gpu0")], first_offset=101)
    assert r.closed[0]["sample_count"] == 61 and r.closed[0]["gpu_count"] == 2


def test_replayed_offsets_are_skipped():
    store: dict = {}
    samples = series(seconds=40)
    feed(WindowAggregator(CFG, store), 0, samples)
    # A new worker on the same state re-reads the batch (offsets not committed before the crash).
    agg = WindowAggregator(CFG, store)
    r = feed(agg, 0, samples + series(seconds=40, start=BASE_MS + 40_000), first_offset=0)
    assert r.replayed == len(samples)
    w = r.closed[0]
    assert w["sample_count"] == 120 and w["gpu_seconds"] == 120.0


def test_state_survives_a_json_round_trip_as_after_changelog_recovery():
    samples = series(seconds=150, gpus=2, util=lambda t, g: (3 * t + 11 * g) % 97)
    reference = feed(WindowAggregator(CFG, {}), 0, samples).closed

    store: dict = {}
    first = WindowAggregator(CFG, store)
    closed = feed(first, 0, samples[:130]).closed
    restored = json.loads(json.dumps(store))  # what a restarted worker reads back from the changelog
    second = WindowAggregator(CFG, restored)
    assert second.watermark(0) == first.watermark(0)
    assert second.open_windows(0) == first.open_windows(0)
    closed += feed(second, 0, samples[130:], first_offset=130).closed
    assert closed == reference


def test_changed_and_removed_keys_are_reported_for_the_changelog():
    store: dict = {}
    agg = WindowAggregator(CFG, store)
    r = feed(agg, 0, series("wf-old", seconds=61))
    assert r.changed == {"wf-old"} and r.removed == set()
    # wf-old goes silent; once the partition moves past the retention it is forgotten.
    r = feed(agg, 0, series("wf-new", seconds=1, start=BASE_MS + 700_000), first_offset=500)
    assert "wf-old" in r.removed and "wf-old" not in store and "wf-new" in r.changed


def test_invalid_config_is_refused():
    with pytest.raises(ValueError):
        WindowConfig(size_ms=0)


def test_shared_gpus_count_for_each_workflow_by_its_share():
    agg = WindowAggregator(CFG, {})
    samples = []
    for t in range(75):
        samples.append(sample(workflow_id="wf-a", event_time=BASE_MS + t * 1000, share=0.75, utilization_pct=80.0))
        samples.append(sample(workflow_id="wf-b", event_time=BASE_MS + t * 1000, share=0.25, utilization_pct=80.0))
    r = feed(agg, 0, samples)
    by_wf = {w["workflow_id"]: w for w in r.closed}
    assert len(r.closed) == 2  # window 0 of each; window 1 is still open
    assert by_wf["wf-a"]["gpu_seconds"] == pytest.approx(45.0)
    assert by_wf["wf-b"]["gpu_seconds"] == pytest.approx(15.0)
    assert by_wf["wf-a"]["utilization_mean_pct"] == pytest.approx(80.0)
    expected = expected_windows([x for x in samples if x["event_time"] < BASE_MS + 60_000])
    for w in r.closed:
        assert_window_matches(w, expected[(w["workflow_id"], w["window_start"])])


def test_samples_of_one_message_count_once_each_and_replays_are_skipped_by_position():
    agg = WindowAggregator(WindowConfig(size_ms=60_000, allowed_lateness_ms=0, retention_ms=600_000), {})
    batch = [Incoming.row(7, sample(gpu_uuid=f"GPU-{i}", gpu_index=i), i) for i in range(4)]
    first = agg.process(0, batch[:2], closed_at=0)
    assert first.replayed == 0
    # After a restart the whole message comes again: the two applied samples are skipped.
    again = agg.process(0, batch, closed_at=0)
    assert again.replayed == 2
    closer = Incoming.row(8, sample(workflow_id="wf-other", event_time=BASE_MS + 60_000))
    (window,) = [w for w in agg.process(0, [closer], closed_at=0).closed if w["workflow_id"] == "wf-a"]
    assert window["sample_count"] == 4 and window["gpu_count"] == 4
