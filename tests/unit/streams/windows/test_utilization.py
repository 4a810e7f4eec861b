import json
import random

import pytest

from streams.windows import workflow_state
from streams.windows.batches import Incoming, WindowConfig
from streams.windows.utilization import WindowAggregator
from tests.support.samples import BASE_MS, assert_window_matches, expected_windows, sample

CFG = WindowConfig(size_ms=60_000, allowed_lateness_ms=10_000, retention_ms=600_000, update_horizon_ms=300_000)



def changelog_round_trip(store: dict) -> dict:
    """The states as a restarted worker reads them back from the changelog."""
    return {wf: workflow_state.decode(workflow_state.encode(state)) for wf, state in store.items()}

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


def test_late_sample_beyond_the_update_horizon_is_refused_with_a_reason():
    agg = WindowAggregator(CFG, {})
    feed(agg, 0, series(seconds=75))
    feed(agg, 0, series(seconds=1, start=BASE_MS + 400_000), first_offset=500)  # watermark 390 s
    r = feed(agg, 0, [sample(event_time=BASE_MS + 30_000, utilization_pct=0.0)], first_offset=999)
    assert r.closed == [] and r.updated == [] and len(r.refused) == 1
    item, reason = r.refused[0]
    assert item.offset == 999
    assert "more than the update horizon (300000 ms) behind the watermark" in reason and "wf-a" in reason


def test_late_samples_within_the_horizon_complete_their_window_as_a_new_version():
    samples = series(seconds=120, gpus=3, util=lambda t, g: (5 * t + 13 * g) % 101)
    on_time = [s for s in samples if s["gpu_index"] != 2]
    late = [s for s in samples if s["gpu_index"] == 2 and s["event_time"] < BASE_MS + 60_000]
    agg = WindowAggregator(CFG, {})
    first = feed(agg, 0, on_time).closed
    assert [(w["window_start"], w["version"]) for w in first] == [(BASE_MS, 1)]
    r = feed(agg, 0, late[:20], first_offset=1000)
    r2 = feed(agg, 0, late[20:], first_offset=2000)
    assert r.refused == r2.refused == [] and r.closed == r2.closed == []
    (after, before), = r2.updated
    assert before == r.updated[0][0] and r.updated[0][1] == first[0]
    assert after["version"] == 3 and after["gpu_count"] == 3
    expected = expected_windows([s for s in samples if s["event_time"] < BASE_MS + 60_000])[("wf-a", BASE_MS)]
    assert_window_matches(after, expected)


def test_windows_close_as_the_watermark_passes_them_within_a_batch():
    """In one batch the watermark passes a window's end, then a sample of that window comes:
    the window closed when the watermark passed it, and the sample completes it as a new
    version; both are in the result, so the batch boundaries never change what a window holds."""
    agg = WindowAggregator(CFG, {})
    feed(agg, 0, series(seconds=30, gpus=1))
    batch = series(seconds=60, start=BASE_MS + 30_000, gpus=1) + [sample(event_time=BASE_MS + 45_000,
                                                                        gpu_uuid="wf-a-gpu7")]
    r = feed(agg, 0, batch, first_offset=100)
    assert r.refused == []
    (first,) = r.closed
    (after, before), = r.updated
    assert before == first and (first["gpu_count"], first["sample_count"], first["version"]) == (1, 60, 1)
    assert (after["gpu_count"], after["sample_count"], after["version"]) == (2, 61, 2)


def test_a_window_whose_samples_all_came_late_is_emitted_once_complete_so_far():
    agg = WindowAggregator(CFG, {})
    feed(agg, 0, series("wf-busy", seconds=200))
    cut_off = series("wf-cut-off", seconds=60, start=BASE_MS + 60_000)
    r = feed(agg, 0, cut_off, first_offset=1000)
    (window, before), = r.updated
    assert before is None and window["version"] == 1 and window["workflow_id"] == "wf-cut-off"
    assert_window_matches(window, expected_windows(cut_off)[("wf-cut-off", BASE_MS + 60_000)])


def test_kept_windows_are_dropped_once_past_the_horizon():
    agg = WindowAggregator(CFG, {})
    r = feed(agg, 0, series(seconds=75))
    key = f"wf-a@{BASE_MS}"
    assert r.history_changed == {key} and key in agg.history
    r = feed(agg, 0, series(seconds=1, start=BASE_MS + 380_000), first_offset=500)
    assert key in r.history_removed and key not in agg.history


def test_kept_windows_survive_a_restart_and_take_late_samples_after_it():
    store: dict = {}
    history: dict = {}
    samples = series(seconds=90, gpus=2)
    feed(WindowAggregator(CFG, store, history), 0, [s for s in samples if s["gpu_index"] == 0])
    store, history = changelog_round_trip(store), json.loads(json.dumps(history))
    r = feed(WindowAggregator(CFG, store, history), 0, [s for s in samples if s["gpu_index"] == 1],
             first_offset=1000)
    (after, _), = r.updated
    assert after["version"] == 2 and after["gpu_seconds"] == 120.0


NOW = BASE_MS + 86_400_000


def test_a_sample_from_the_future_is_refused_and_moves_no_watermark():
    agg = WindowAggregator(CFG, {}, clock=lambda: NOW)
    feed(agg, 0, series("wf-a", seconds=30, start=NOW - 60_000))
    watermark = agg.watermark(0)
    year_ahead = sample(workflow_id="wf-bad-clock", event_time=NOW + 365 * 86_400_000)
    r = feed(agg, 0, [year_ahead], first_offset=100)
    (item, reason), = r.refused
    assert item.offset == 100 and "ahead of the worker's clock" in reason and "wf-bad-clock" in reason
    assert agg.watermark(0) == watermark and r.closed == []
    # The bystander's later samples are on time, not late.
    r = feed(agg, 0, series("wf-a", seconds=30, start=NOW - 30_000), first_offset=200)
    assert r.refused == []
    # Nor does a quiet partition's clock follow a time from the future.
    assert agg.advance(0, NOW + 3_600_000, closed_at=NOW).closed == []
    assert agg.watermark(0) == NOW - 1000 - CFG.allowed_lateness_ms


def test_within_the_allowed_skew_a_sample_ahead_of_the_clock_counts():
    agg = WindowAggregator(CFG, {}, clock=lambda: NOW)
    r = feed(agg, 0, [sample(event_time=NOW + CFG.max_future_skew_ms)])
    assert r.refused == [] and agg.newest(0) == NOW + CFG.max_future_skew_ms


def test_a_state_poisoned_by_a_future_sample_is_repaired_when_its_partition_loads():
    # Written by a worker without the check: wf-bad's clock is a year ahead, and so is the partition's.
    store: dict = {}
    feed(WindowAggregator(CFG, store, clock=lambda: 10**15), 0,
         series("wf-a", seconds=30, start=NOW - 60_000)
         + [sample(workflow_id="wf-bad", event_time=NOW + 365 * 86_400_000)])
    assert store["wf-bad"].max_event_time > NOW + CFG.max_future_skew_ms
    agg = WindowAggregator(CFG, store, clock=lambda: NOW)
    assert agg.newest(0) < NOW  # wf-a's state was forgotten under the poisoned clock: nothing is left
    r = feed(agg, 0, series("wf-a", seconds=30, start=NOW - 30_000), first_offset=100)
    assert r.refused == [] and "wf-bad" in r.changed | r.removed
    assert "wf-bad" not in store or store["wf-bad"].windows == {}


def test_sample_within_allowed_lateness_still_counts():
    agg = WindowAggregator(CFG, {})
    samples = series(seconds=65, gpus=1)
    feed(agg, 0, samples)
    straggler = sample(event_time=BASE_MS + 59_000, gpu_uuid="wf-a-gpu9")
    r = feed(agg, 0, [straggler], first_offset=100)
    assert r.refused == []
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
    restored = changelog_round_trip(store)  # what a restarted worker reads back from the changelog
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
    # wf-old goes silent; past the retention it is kept until it has ended (the window step marks
    # it, its summary out), then forgotten.
    r = feed(agg, 0, series("wf-new", seconds=1, start=BASE_MS + 700_000), first_offset=500)
    assert "wf-old" not in r.removed and "wf-old" in store and agg.ended(0, 120_000) == ["wf-old"]
    store["wf-old"].ended = True
    r = feed(agg, 0, series("wf-new", seconds=1, start=BASE_MS + 701_000), first_offset=600)
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
    agg = WindowAggregator(
        WindowConfig(size_ms=60_000, allowed_lateness_ms=0, retention_ms=600_000, update_horizon_ms=300_000), {}
    )
    batch = [Incoming.row(7, sample(gpu_uuid=f"GPU-{i}", gpu_index=i), i) for i in range(4)]
    first = agg.process(0, batch[:2], closed_at=0)
    assert first.replayed == 0
    # After a restart the whole message comes again: the two applied samples are skipped.
    again = agg.process(0, batch, closed_at=0)
    assert again.replayed == 2
    closer = Incoming.row(8, sample(workflow_id="wf-other", event_time=BASE_MS + 60_000))
    (window,) = [w for w in agg.process(0, [closer], closed_at=0).closed if w["workflow_id"] == "wf-a"]
    assert window["sample_count"] == 4 and window["gpu_count"] == 4


def test_a_window_closed_on_the_fleets_clock_stays_closed_after_a_rebalance():
    """Found by the fleet fault test (a window emitted twice as version 1, 84 and then 36 of
    120 GPU-seconds, the second replacing the first): a quiet partition follows the fleet's
    clock and closes its windows before its own samples of them have all come (the broker
    holding them was down); the clock it followed is not kept in any workflow's state, so
    after a rebalance the partition's watermark is rebuilt lower, and the rest of the window's
    samples opened it again as a new window. A window that has closed takes its later samples
    as a new version, whatever the watermark."""
    store: dict = {}
    history: dict = {}
    agg = WindowAggregator(CFG, store, history)
    samples = series(seconds=120, start=BASE_MS, gpus=2)
    early = [s for s in samples if s["event_time"] < BASE_MS + 102_000]
    rest = [s for s in samples if s["event_time"] >= BASE_MS + 102_000]
    feed(agg, 0, early)
    followed = agg.follow(0, BASE_MS + 140_000, quiet_ms=5_000, closed_at=0)  # the fleet is at 140 s
    first = [w for w in followed.closed if w["window_start"] == BASE_MS + 60_000]
    assert [(w["version"], w["gpu_seconds"]) for w in first] == [(1, 84.0)]
    agg.forget_partitions()  # a rebalance: the indexes (the partition's clock with them) are rebuilt
    r = feed(agg, 0, rest, first_offset=1000)
    assert [w for w in r.closed if w["window_start"] == BASE_MS + 60_000] == []  # not a new window
    (after, before), = [(a, b) for a, b in r.updated if a["window_start"] == BASE_MS + 60_000]
    assert before == first[0] and (after["version"], after["gpu_seconds"]) == (2, 120.0)


def test_a_window_still_open_behind_the_watermark_takes_its_samples_after_a_partial_restore():
    """Found by the fleet fault test (a window stored as 179 of the 180 GPU-seconds published):
    a worker killed while writing its changelogs left the state of one workflow written after
    it closed a window (the partition's clock past it) and another's from before (its window
    0 still open, through an earlier offset), and no kept window. The partition's next owner
    read again the samples after that offset: they came behind the watermark into a window
    still open, started a new one beside it, and closing the open one replaced the new one's
    samples. An open window takes its samples whatever the watermark, and closes with all."""
    store: dict = {}
    agg = WindowAggregator(CFG, store, {})
    window_0 = series("wf-a", seconds=60, gpus=2)
    batch = [Incoming.row(i, s) for i, s in enumerate(window_0[:114])]  # wf-a through 57 s
    agg.process(0, batch, closed_at=0)
    written_early = changelog_round_trip(store)["wf-a"]
    later = window_0[114:] + series("wf-b", seconds=1, start=BASE_MS + 80_000, gpus=1)
    rest = [Incoming.row(114 + i, s) for i, s in enumerate(later)]
    closed = agg.process(0, rest, closed_at=0).closed
    assert [(w["workflow_id"], w["gpu_seconds"]) for w in closed] == [("wf-a", 120.0)]
    # Killed: wf-b's state was written after the close, wf-a's not since 57 s, no kept window.
    restored = {"wf-a": written_early, "wf-b": changelog_round_trip(store)["wf-b"]}
    successor = WindowAggregator(CFG, restored, {})
    r = successor.process(0, rest, closed_at=1)  # read again from wf-a's offset
    emitted = r.closed + [after for after, _ in r.updated]
    final = max((w for w in emitted if w["workflow_id"] == "wf-a"), key=lambda w: w["version"])
    assert final["gpu_seconds"] == 120.0
    assert_window_matches(final, expected_windows(window_0)[("wf-a", BASE_MS)])


def test_a_window_closed_again_after_a_partial_restore_outranks_what_its_first_owner_emitted():
    """The other order of the same kill: the kept window (closed, then completed by a late
    sample as version 2) was written, the workflow's state not since before the close. The
    next owner closes the window again from that state and every sample after it: complete,
    and above version 2, so that the store keeps it and not an equal version of another
    content."""
    store: dict = {}
    history: dict = {}
    agg = WindowAggregator(CFG, store, history)
    window_0 = series("wf-a", seconds=60, gpus=2)
    late = window_0.pop(10)
    first = [Incoming.row(i, s) for i, s in enumerate(window_0[:100])]
    agg.process(0, first, closed_at=0)
    written_early = changelog_round_trip(store)["wf-a"]
    later = window_0[100:] + series("wf-b", seconds=1, start=BASE_MS + 80_000, gpus=1) + [late]
    rest = [Incoming.row(100 + i, s) for i, s in enumerate(later)]
    r = agg.process(0, rest, closed_at=0)
    assert [(w["version"], w["gpu_seconds"]) for w, _ in r.updated] == [(2, 120.0)]
    restored = {"wf-a": written_early, "wf-b": changelog_round_trip(store)["wf-b"]}
    successor = WindowAggregator(CFG, restored, json.loads(json.dumps(history)))
    r = successor.process(0, rest, closed_at=1)
    emitted = [w for w in r.closed + [after for after, _ in r.updated] if w["workflow_id"] == "wf-a"]
    final = max(emitted, key=lambda w: w["version"])
    assert final["version"] > 2 and final["gpu_seconds"] == 120.0
