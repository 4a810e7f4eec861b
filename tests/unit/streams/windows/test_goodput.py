"""The goodput waterfall: every GPU-second of a workflow in exactly one bucket, equal to what
a simulated fleet planted, bucket by bucket, and the energy of each."""

from __future__ import annotations

import pytest

from producers.simulate.fleet import INPUT_BOUND, build_fleet
from schemas.goodput_buckets import BUCKETS, JOULES_FIELDS, OBSERVED_BUCKETS, SECONDS_FIELDS
from schemas.sample_columns import columns_of
from streams.windows.batches import Incoming, WindowConfig
from streams.windows.goodput import GoodputConfig
from streams.windows.summary import accumulate, summary
from streams.windows.utilization import WindowAggregator
from tests.support.samples import BASE_MS, sample

CONFIG = WindowConfig()


def run(blocks: list[dict], config: WindowConfig = CONFIG) -> tuple[list[dict], WindowAggregator]:
    """Every window of ``blocks`` (one partition), all closed at the end."""
    agg = WindowAggregator(config, {}, {}, clock=lambda: BASE_MS + 10**9)
    result = agg.process(0, [Incoming(i, b) for i, b in enumerate(blocks)], closed_at=0)
    newest = max(t for b in blocks for t in b["event_time"])
    closing = agg.advance(0, newest + config.size_ms + config.allowed_lateness_ms, closed_at=0)
    return result.closed + closing.closed, agg


def test_a_planted_fleet_ends_in_the_buckets_it_planted():
    fleet = build_fleet(seed=11, hosts=6, gpus_per_host=8, workflows=13, planted=True)
    assert {w.profile for w in fleet.workflows} >= {INPUT_BOUND}
    ticks = 1500  # 25 minutes: past the 15 minutes a workflow that never got busy counts as starting
    blocks = [b for t in range(ticks) for b in columns_of(list(fleet.samples_at(t, BASE_MS, 1000)))]
    windows, _ = run(blocks)
    truth = fleet.planted(ticks, BASE_MS, 1000, GoodputConfig().startup_max_s)
    got: dict[str, dict[str, list[float]]] = {}
    for w in windows:
        # Each window's buckets are its GPU-seconds, exactly.
        assert sum(w[f] for f in SECONDS_FIELDS) == pytest.approx(w["gpu_seconds"], abs=1e-9)
        assert sum(w[f] for f in JOULES_FIELDS) == pytest.approx(w["energy_joules"], rel=1e-12)
        mine = got.setdefault(w["workflow_id"], {})
        for b in BUCKETS:
            entry = mine.setdefault(b, [0.0, 0.0])
            entry[0] += w[f"{b}_gpu_seconds"]
            entry[1] += w[f"{b}_joules"]
    planted_buckets = {b for buckets in truth.values() for b in buckets}
    assert planted_buckets == set(OBSERVED_BUCKETS)  # the fleet plants every bucket a sample decides
    for wf, buckets in truth.items():
        for b in BUCKETS:
            want = buckets.get(b, [0.0, 0.0])
            assert got[wf][b][0] == pytest.approx(want[0], abs=1e-6), (wf, b)
            assert got[wf][b][1] == pytest.approx(want[1], rel=1e-9, abs=1e-6), (wf, b)


def tick(t: int, utils: list[float], **extra) -> dict:
    (block,) = columns_of([sample(gpu_index=g, gpu_uuid=f"GPU-{g}", event_time=BASE_MS + t * 1000,
                                  utilization_pct=u, **extra) for g, u in enumerate(utils)])
    return block


def buckets(window: dict) -> dict[str, float]:
    return {b: window[f"{b}_gpu_seconds"] for b in BUCKETS if window[f"{b}_gpu_seconds"]}


def test_start_up_ends_at_the_first_busy_sample_by_event_time_in_whatever_order():
    # 20 s at 0 %, then busy; the busy tick arrives before the quiet ones that precede it.
    order = [*range(20, 60), *range(20)]
    (window,), agg = run([tick(t, [0.0 if t < 20 else 80.0, 0.0 if t < 20 else 90.0]) for t in order])
    assert buckets(window) == {"startup": 40.0, "productive": 80.0}
    assert agg.store["wf-a"].busy_since == BASE_MS + 20_000


def test_a_workflow_that_never_gets_busy_is_starting_then_idle():
    config = WindowConfig(goodput=GoodputConfig(startup_max_s=90))
    windows, _ = run([tick(t, [0.0]) for t in range(180)], config)
    assert [buckets(w) for w in windows] == [{"startup": 60.0}, {"startup": 30.0, "idle": 30.0}, {"idle": 60.0}]


def test_unhealthy_comes_first_and_idle_is_zero_after_the_start():
    blocks = [tick(t, [90.0, 0.0]) for t in range(30)]
    blocks += [tick(t, [90.0, 0.0], clock_event_reasons=0x20) for t in range(30, 40)]  # thermal limit
    blocks += [tick(t, [90.0, 0.0], xids=[79]) for t in range(40, 41)]
    blocks += [tick(t, [90.0, 10.0]) for t in range(41, 60)]
    (window,), _ = run(blocks)
    assert buckets(window) == {"unhealthy": 22.0, "idle": 30.0, "low_util": 19.0, "productive": 49.0}


def test_input_bound_is_the_window_the_input_bound_detector_judges_starved():
    starved = [tick(t, [30.0, 10.0], host_iowait_pct=35.0) for t in range(60)]
    (window,), _ = run(starved)
    assert buckets(window) == {"input_bound": 120.0}  # 30 % and 10 % both under the 40 % threshold
    fed = [tick(t, [30.0, 10.0], host_iowait_pct=1.0) for t in range(60)]
    (window,), _ = run(fed)
    assert buckets(window) == {"productive": 60.0, "low_util": 60.0}  # 30 % is over the 25 % threshold


def test_energy_comes_from_the_counters_where_the_gpus_have_them():
    # GPU 0 adds 300 J a second whatever its power says; the share halves what the workflow is charged.
    blocks = [tick(t, [90.0], energy_joules_total=1000.0 + 300.0 * t, power_watts=200.0, share=0.5)
              for t in range(60)]
    (window,), _ = run(blocks)
    # The first reading has no counter before it: its power (200 W x 1 s x 0.5) stands for it.
    assert window["energy_joules"] == pytest.approx(100.0 + 59 * 150.0)
    assert window["productive_joules"] == window["energy_joules"]
    # A counter that went back (a driver reload) is not a negative energy.
    blocks[30]["energy_joules_total"] = [5.0]
    (window,), _ = run(blocks)
    assert window["energy_joules"] == pytest.approx(100.0 + 57 * 150.0 + 2 * 100.0)


def test_the_summary_carries_the_jobs_waterfall():
    windows, agg = run([tick(t, [0.0 if t < 30 else 70.0]) for t in range(120)])
    state = agg.store["wf-a"]
    for w in windows:
        accumulate(state, w, [])
    s = summary("wf-a", state, "ended", now_ms=0)
    assert s["startup_gpu_seconds"] == 30.0 and s["productive_gpu_seconds"] == 90.0
    assert sum(s[f] for f in SECONDS_FIELDS) == s["gpu_seconds"] and s["gpu_model"] == windows[0]["gpu_model"]
