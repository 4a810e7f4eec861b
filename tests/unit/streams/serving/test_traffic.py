"""A serving replica judged by its traffic through the window stage's step (no app, no broker):
busy, headroom, idle and saturated windows, the capacity it showed and where from, idle time that
a gap in its readings does not stretch, one idle-replica alert where a training job would get
low-utilisation ones; and a service's replicas needed, as a property."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.reports.serving import idle_line, peak_line
from schemas.goodput_buckets import BUCKETS
from schemas.sample_columns import columns_of
from schemas.topics import ALERTS, SERVING_WINDOWS, WORKFLOW_SUMMARIES, WORKFLOW_WINDOWS
from streams.serving.service import load, replicas_needed
from streams.serving.traffic import Declared
from streams.stages.window_step import Decoded
from tests.support.samples import BASE_MS, sample
from tests.support.window_step import Feed, make, ticks

WF = "svc-sd-0"


def served(t_s: int, requests: float, interval_s: int = 10, queue_ms: float | None = 50.0, wf: str = WF):
    return ("ServingSample", {
        "workflow_id": wf, "host": "gpu-host-000", "owner": "ana", "team": "vision", "gpu_uuids": ["GPU-0", "GPU-1"],
        "service": "sd-xl", "engine": "vllm", "event_time": BASE_MS + t_s * 1000, "interval_ms": interval_s * 1000,
        "requests": requests, "tokens": None, "running": None, "waiting": None, "queue_time_ms": queue_ms,
        "ttft_ms": None, "kv_cache_usage": None, "batch_size": None})


def run(minutes: list[tuple[float, float | None]], util: float = 5.0, gap_after: int | None = None):
    """A replica minute by minute: (requests in the minute, their mean queue time); a reading each
    10 s beside its GPU samples. ``gap_after``: its readings stop for 10 minutes after that minute."""
    step, store = make()
    feed = Feed(step)
    t0 = 0
    for m, (requests, queue) in enumerate(minutes):
        start = t0 + m * 60
        for k in range(6):
            t = start + k * 10
            gap = k == 0 and gap_after is not None and m == gap_after + 1
            feed(served(t, requests / 6, interval_s=600 if gap else 10, queue_ms=queue), *ticks(WF, t, t + 10, util))
        if gap_after is not None and m == gap_after:
            t0 += 600
    feed(*ticks("other", t0 + len(minutes) * 60 + 3600, t0 + len(minutes) * 60 + 3601))  # the fleet moves on
    return feed, store


def test_each_window_is_busy_headroom_idle_or_saturated_against_the_capacity_it_showed():
    feed, _ = run([(60, 50.0), (120, 40.0), (30, 60.0), (0, None), (240, 4000.0), (110, 80.0)])
    windows = feed.of(SERVING_WINDOWS)
    assert [w["state"] for w in windows] == ["BUSY", "BUSY", "HEADROOM", "IDLE", "SATURATED", "BUSY"]
    assert [round(w["requests_per_s"], 3) for w in windows] == [1.0, 2.0, 0.5, 0.0, 4.0, 1.833]
    last = windows[-1]  # the capacity: the busiest window within the queue target (not the saturated one)
    assert last["capacity_per_s"] == 2.0 and last["capacity_window_start"] == BASE_MS + 60_000
    assert last["capacity_windows"] == 4 and last["queue_time_ms"] == 80.0
    assert [w["service"] for w in windows] == ["sd-xl"] * 6 and windows[0]["gpu_count"] == 2


def test_a_replica_at_5_percent_that_serves_is_not_alerted_and_one_idle_for_30_minutes_is_once():
    feed, _ = run([(60, 50.0)] * 15 + [(0, None)] * 40 + [(60, 50.0)] * 5, util=5.0)
    alerts = feed.of(ALERTS)
    assert {a["detector"] for a in alerts} == {"idle_replica"}  # no low-utilisation judgement of a replica
    firing = [a for a in alerts if a["status"] == "FIRING"]
    assert len(firing) == 1 and firing[0]["notify"]
    assert firing[0]["window_end"] == BASE_MS + (15 + 30) * 60_000  # 30 minutes after its last request
    assert "served no request for 30 min" in firing[0]["message"]
    assert [a["status"] for a in alerts] == ["FIRING", "RESOLVED"]  # the first request resolves it


def test_time_its_readings_do_not_cover_is_not_idle_time():
    # Idle 20 minutes, its readings stop 10 minutes, idle 20 more: never 30 minutes idle as seen.
    feed, _ = run([(60, 50.0)] + [(0, None)] * 20 + [(0, None)] * 20, gap_after=20)
    assert feed.of(ALERTS) == []
    idle = [w for w in feed.of(SERVING_WINDOWS) if w["state"] == "IDLE"]
    assert idle[-1]["idle_since"] == BASE_MS + (21 + 10) * 60_000  # from its return


def test_a_late_serving_sample_is_a_dead_letter_and_a_replayed_one_counts_once():
    step, _ = make()
    feed = Feed(step)
    feed(served(0, 6.0), *ticks(WF, 0, 10))
    feed(*ticks(WF, 10, 200))  # the first window closes
    late = feed(served(5, 6.0))
    assert [why for _, why in late.dead] == [(
        f"serving sample at {BASE_MS + 5000}: its window ({BASE_MS}) had closed; the replica's samples must reach "
        "the worker with its GPU samples")]
    step.samples(0, [feed_decoded(served(130, 6.0), 3)], BASE_MS)  # offset 3 was added as ... nothing: a replay
    assert step.store[WF].serving.get("windows", {}) == {}


def test_a_serving_sample_ahead_of_the_time_kafka_received_it_is_a_dead_letter_as_its_gpu_samples_are():
    """A host whose clock runs a day ahead: its GPU samples were refused, and its serving samples
    counted, the replica's newest reading a day ahead."""
    step, store = make()
    received = BASE_MS + 60_000
    name, record = served(60 + 86_400, 6.0)
    out = step.samples(0, [Decoded(0, name, record, 0, received)], BASE_MS + 10**8)
    assert [why.split(" (")[0] for _, why in out.dead] == [
        f"the serving sample of workflow {WF} from host gpu-host-000 is ahead of the time Kafka received it"]
    assert "by 86,400 s (at most 300 s allowed" in out.dead[0][1] and WF not in store
    name, record = served(60 + 200, 6.0)  # (within the bound: taken)
    assert step.samples(0, [Decoded(0, name, record, 1, received)], BASE_MS + 10**8).dead == []
    assert store[WF].serving["last_time"] == BASE_MS + 260_000


def test_traffic_whose_gpu_samples_never_come_is_judged_alone_once_the_clock_passes_it():
    """A replica's readings whose GPU samples did not reach the worker (refused, or late past the
    watermark) are not kept for ever nor dropped unseen: each window of them, once the partition's
    clock passes it, is a ServingWindow of no GPU, judged by its traffic."""
    step, store = make()
    feed = Feed(step)
    for t in range(0, 180, 10):
        feed(served(t, 5.0 if t < 120 else 0.0), *ticks("other", t, t + 10))
    feed(*ticks("other", 180, 240))  # the clock moves on, past every window of the replica
    feed(served(240, 1.0))
    windows = feed.of(SERVING_WINDOWS)
    assert [(w["window_start"] - BASE_MS, w["requests"], w["gpu_count"], w["gpu_seconds"], w["state"])
            for w in windows] == [(0, 30.0, 0, 0.0, "BUSY"), (60_000, 30.0, 0, 0.0, "BUSY"),
                                  (120_000, 0.0, 0, 0.0, "IDLE")]
    assert sum(w["requests"] for w in windows) == 5.0 * 12  # every request it read, once
    assert list(store[WF].serving["windows"]) == [str(BASE_MS + 240_000)]  # only what the clock has not passed
    late = feed(*ticks(WF, 30, 40))  # its GPU samples of a judged window, late: its windows, not a second judging
    assert feed.of(SERVING_WINDOWS) == windows and not late.dead


def test_traffic_before_a_gpu_window_that_closes_is_judged_alone_first():
    """Readings of a window whose GPU samples never came, then a window with them: when both close
    in one batch, the first is judged alone, not dropped with the second's closing."""
    step, _ = make()
    feed = Feed(step)
    for t in range(0, 120, 10):
        feed(served(t, 2.0 if t < 60 else 3.0))
    feed(*ticks(WF, 60, 120))  # the second window's GPU samples (the first's never come), late as held
    feed(*ticks("other", 200, 201))  # one batch's clock passes both windows
    windows = feed.of(SERVING_WINDOWS)
    assert [(w["window_start"] - BASE_MS, w["requests"], w["gpu_count"]) for w in windows] == [
        (0, 12.0, 0), (60_000, 18.0, 2)]


def test_a_replica_its_labels_declare_is_judged_as_one_by_the_service_they_name():
    """A pod labelled ``gpufleet.io/service: sd-xl`` (its WorkflowEvent's ``service``): a replica of
    sd-xl from its first window, with no setting of the worker's, its engine read or not."""
    feed = declared_run(Declared(), 20, 40, service="sd-xl")
    alerts = feed.of(ALERTS)
    assert {a["detector"] for a in alerts} == {"idle_replica"}
    (firing,) = [a for a in alerts if a["status"] == "FIRING"]
    assert "replica of sd-xl" in firing["message"] and "did no work on its GPUs" in firing["message"]


def test_a_service_name_that_cannot_be_a_name_is_a_dead_letter_and_declares_nothing():
    step, store = make()
    out = step.life_cycle(0, [Decoded(0, "WorkflowEvent", {**started("inference"), "service": "sd\nxl\x1b[31m"})],
                          BASE_MS)
    assert [why for _, why in out.dead] == [
        "service 'sd\\nxl\\x1b[31m' is not a printable name of 1 to 256 characters"]
    assert WF not in store or store[WF].serving is None


def started(partition: str) -> dict:
    return {"workflow_id": WF, "event": "STARTED", "event_time": BASE_MS, "host": "gpu-host-000", "owner": "ana",
            "team": "vision", "gpu_uuids": ["GPU-0", "GPU-1"], "pids": [], "attribution": "allocation:slurm",
            "scheduler": "slurm", "scheduler_job_id": "77", "scheduler_partition": partition}


def declared_run(declared: Declared, minutes_busy: int, minutes_idle: int, service: str | None = None):
    """A Slurm job of partition ``inference`` whose engine's metrics are not read: its GPUs at 5 %
    for ``minutes_busy``, then at 0 %; the worker told (or not) that the partition serves, its
    event naming (or not) the service it is a replica of."""
    step, _ = make()
    step.settings = replace(step.settings, serving=declared)
    step.life_cycle(0, [Decoded(0, "WorkflowEvent", {**started("inference"), "service": service})], BASE_MS)
    feed = Feed(step)
    for m in range(minutes_busy + minutes_idle):
        feed(*ticks(WF, m * 60, m * 60 + 60, 5.0 if m < minutes_busy else 0.0))
    feed(*ticks("other", (minutes_busy + minutes_idle) * 60 + 120, (minutes_busy + minutes_idle) * 60 + 121))
    return feed


def test_a_replica_the_site_declares_is_judged_as_one_even_where_its_engine_is_not_read():
    """A job of a partition the worker is told serves (``--serving-partitions``): never judged as a
    training job's low utilisation; where no reading of its engine comes, idle is its GPUs doing
    nothing at all, for the idle-replica time."""
    feed = declared_run(Declared(partitions=frozenset({"inference"})), 20, 40)
    alerts = feed.of(ALERTS)
    assert {a["detector"] for a in alerts} == {"idle_replica"}
    (firing,) = [a for a in alerts if a["status"] == "FIRING"]
    assert firing["window_end"] == BASE_MS + (20 + 30) * 60_000  # 30 minutes after its GPUs last worked
    assert "did no work on its GPUs" in firing["message"] and "replica of inference" in firing["message"]
    assert feed.of(SERVING_WINDOWS) == []  # no traffic was read: no window of it to store
    undeclared = {a["detector"] for a in declared_run(Declared(), 20, 40).of(ALERTS)}
    assert "low_utilization" in undeclared and "idle_replica" not in undeclared


def test_a_serving_sample_of_gpus_no_workflow_holds_is_a_dead_letter():
    step, store = make()
    dead = Feed(step)(served(0, 3.0, wf="unallocated")).dead
    assert [why for _, why in dead] == ["a serving sample of 'unallocated': the GPUs of a replica belong to a workflow"]
    assert "unallocated" not in store


def feed_decoded(record, offset):
    return Decoded(0, record[0], record[1], offset)


@given(st.lists(st.floats(0.01, 100.0), min_size=1, max_size=40), st.floats(0.0, 2.0), st.floats(0.0, 1.0))
def test_replicas_needed_never_exceed_those_held_nor_fall_below_the_peaks_need(capacities, share, margin):
    held = len(capacities)
    peak = share * sum(capacities)  # what all of them could serve, or less, or more
    needed = replicas_needed(capacities, peak, margin)
    at_peak = replicas_needed(capacities, peak, 0.0)
    assert at_peak <= needed <= held
    best = sorted(capacities, reverse=True)
    if sum(best) >= peak * (1 + margin):
        assert sum(best[:needed]) >= peak * (1 + margin) > (sum(best[:needed - 1]) if needed else -1)


def test_a_service_needs_the_replicas_its_peak_asked_for():
    windows = [{"workflow_id": f"r{i}", "window_start": BASE_MS + m * 60_000, "window_end": BASE_MS + (m + 1) * 60_000,
                "requests": r, "gpu_seconds": 60.0, "state": "BUSY" if r else "IDLE", "capacity_per_s": 2.0}
               for i in range(10) for m, r in enumerate([120.0 if i < 3 else 0.0, 60.0 if i < 2 else 0.0])]
    got = load("sd-xl", windows, span_ms=60_000, margin=0.0)
    assert (got.replicas, got.peak_per_s, got.replicas_at_peak, got.replicas_needed) == (10, 6.0, 10, 3)
    assert got.freed_gpu_hours == 2 * 7 * 60 / 3600  # two minutes of 7 replicas beyond the 3 needed
    assert got.idle_gpu_hours == (7 + 8) * 60 / 3600
    # At the end: r0 and r1 served in the last minute, r2 not since the first, the others never.
    assert got.idle_tails == {"r0": 0, "r1": 0, **{f"r{i}": 120_000 for i in range(3, 10)}, "r2": 60_000}
    assert idle_line(got, 120) == ("7 of 10 replicas of sd-xl served no request for their last 2 min or more: "
                                   "r9 (2 min), r8 (2 min), r7 (2 min), r6 (2 min), r5 (2 min) ...")
    assert idle_line(got, 7200) is None
    assert peak_line(got, 60, 0.0) == ("The busiest 1 min of sd-xl (6.00 requests/s) needed 3 replicas with +0% "
                                       "headroom: 10 held; 0.2 of its 0.3 GPU-hours were held beyond the replicas "
                                       "needed.")


def test_a_replicas_summary_counts_its_gpu_hours_as_its_windows_were_judged_by_traffic():
    """The WorkflowSummary (the owner's job report at its end, the summaries topic, the stored row)
    puts a replica's GPU-seconds where ``judged_windows`` puts them for every other report: a window
    that served requests productive at 5 % utilisation, one that served none idle; start-up and
    unobserved time as its GPUs said."""
    feed, _ = run([(60, 50.0)] * 10 + [(0, None)] * 5, util=5.0)
    (summary,) = feed.of(WORKFLOW_SUMMARIES)
    state = {w["window_start"]: w["state"] for w in feed.of(SERVING_WINDOWS)}
    windows = [w for w in feed.of(WORKFLOW_WINDOWS) if w["workflow_id"] == WF]
    assert set(state) == {w["window_start"] for w in windows}
    pooled = {kind: {s: sum(w[f"{b}_{kind}"] for w in windows if (state[w["window_start"]] == "IDLE") == (s == "IDLE")
                         for b in ("idle", "input_bound", "low_util", "productive")) for s in ("IDLE", "SERVED")}
              for kind in ("gpu_seconds", "joules")}
    assert sum(w["low_util_gpu_seconds"] for w in windows) > 0  # (5 %: by its GPUs, low utilisation)
    assert summary["productive_gpu_seconds"] == pytest.approx(pooled["gpu_seconds"]["SERVED"])
    assert summary["idle_gpu_seconds"] == pytest.approx(pooled["gpu_seconds"]["IDLE"])
    assert summary["productive_joules"] == pytest.approx(pooled["joules"]["SERVED"])
    assert summary["low_util_gpu_seconds"] == summary["input_bound_gpu_seconds"] == 0.0
    for bucket in ("startup", "unhealthy", "unobserved"):
        assert summary[f"{bucket}_gpu_seconds"] == pytest.approx(sum(w[f"{bucket}_gpu_seconds"] for w in windows))
    assert summary["gpu_seconds"] == pytest.approx(sum(summary[f"{b}_gpu_seconds"] for b in BUCKETS))


def test_a_replicas_window_completed_late_is_judged_in_its_summary_as_it_was_when_it_closed():
    step, _ = make()
    feed = Feed(step)
    for m in range(12):  # serving at 5 %, a reading each 10 s beside its GPU samples
        for k in range(6):
            t = m * 60 + k * 10
            feed(served(t, 10.0 if m < 8 else 0.0), *ticks(WF, t, t + 10, util=5.0))
        if m == 9:  # a third GPU's samples of minute 2 come late (an agent that was cut off): minute 2 is completed
            late = [sample(workflow_id=WF, owner="ana", team="vision", event_time=BASE_MS + t * 1000,
                           utilization_pct=5.0, gpu_uuid="GPU-2", gpu_index=2) for t in range(120, 180)]
            feed(*[("GpuSampleColumns", b) for b in columns_of(late)])
    feed(*ticks("other", 12 * 60 + 3600, 12 * 60 + 3601))  # the fleet moves on: the replica ends
    latest = {w["window_start"]: w for w in feed.of(WORKFLOW_WINDOWS) if w["workflow_id"] == WF}  # each as last sent
    assert latest[BASE_MS + 120_000]["gpu_count"] == 3  # (minute 2 was completed)
    state = {w["window_start"]: w["state"] for w in feed.of(SERVING_WINDOWS)}
    summary = feed.of(WORKFLOW_SUMMARIES)[-1]
    served_s = sum(w[f"{b}_gpu_seconds"] for s, w in latest.items() if state[s] != "IDLE"
                   for b in ("idle", "input_bound", "low_util", "productive"))
    assert summary["productive_gpu_seconds"] == pytest.approx(served_s)
    assert summary["gpu_seconds"] == pytest.approx(sum(w["gpu_seconds"] for w in latest.values()))
    assert summary["gpu_seconds"] == pytest.approx(sum(summary[f"{b}_gpu_seconds"] for b in BUCKETS))
