"""The window stage's decisions, called directly (``streams.stages.window_step``: state and a batch in,
records out, no app and no broker): time no sample stands for, start-up that no alert judges,
the capacity no job held, the GPUs a job never opens, and a workflow's end (the scheduler's,
its hosts', or its samples stopping), which closes its windows, resolves its alerts and stands
its ladders down."""

from __future__ import annotations

import pytest

from schemas.goodput_buckets import BUCKETS
from schemas.sample_columns import columns_of
from schemas.topics import ALERTS, ENFORCEMENT, WORKFLOW_SUMMARIES, WORKFLOW_WINDOWS
from schemas.validate_sample import IDLE, UNALLOCATED
from streams.stages.window_step import Decoded
from tests.support.samples import BASE_MS, sample
from tests.support.window_step import LADDER, Feed, blocks, ended, make, ticks


def unobserved(wf: str, from_s: float, to_s: float, gpus: float = 2.0, **extra) -> tuple[str, dict]:
    return ("UnobservedTime", {"workflow_id": wf, "host": "gpu-host-000", "owner": "ana", "team": "vision",
                               "scheduler_job_id": "7", "from_time": BASE_MS + int(from_s * 1000),
                               "to_time": BASE_MS + int(to_s * 1000), "gpus": gpus, "gpu_uuids": ["GPU-0", "GPU-1"],
                               "reason": "the agent on gpu-host-000 was not running", "event_time": BASE_MS, **extra})


def event(wf: str, kind: str, at_s: float, **extra) -> tuple[str, dict]:
    return ("WorkflowEvent", {
        "workflow_id": wf, "event": kind, "event_time": BASE_MS + int(at_s * 1000), "host": "gpu-host-000",
        "owner": "ana", "team": "vision", "gpu_uuids": ["GPU-0", "GPU-1"], "pids": [],
        "attribution": "allocation:slurm", "scheduler_job_id": "7", "scheduler": "slurm", "allocated_at": BASE_MS,
        "scheduler_unknown": [], **extra})


def buckets(w: dict) -> float:
    return sum(w[f"{b}_gpu_seconds"] for b in BUCKETS)


def test_time_no_sample_stands_for_is_its_own_bucket_and_judged_by_no_alert():
    step, _ = make(startup_max_s=0.0)
    feed = Feed(step)
    feed(*ticks("slurm-7", 0, 100, util=80.0))
    # The agent was down from 100 s to 250 s (it says so when it starts again), then the job idles.
    feed(unobserved("slurm-7", 100, 250), *ticks("slurm-7", 250, 400, util=0.0))
    feed(*ticks("wf-other", 400, 500, util=50.0))  # the partition's clock moves on: every window closes
    windows = {w["window_start"] - BASE_MS: w for w in feed.of(WORKFLOW_WINDOWS) if w["workflow_id"] == "slurm-7"}
    assert sum(w["unobserved_gpu_seconds"] for w in windows.values()) == pytest.approx(2 * 150.0)
    assert windows[180_000]["unobserved_gpu_seconds"] == 120.0 and windows[180_000]["sample_count"] == 0
    assert windows[180_000]["gpu_seconds"] == 120.0 and windows[180_000]["utilization_mean_pct"] == 0.0
    for w in windows.values():
        assert buckets(w) == pytest.approx(w["gpu_seconds"])
    assert sum(w["gpu_seconds"] for w in windows.values()) == pytest.approx(2 * 400.0)  # GPUs x its life
    # The idle alert counts only the idle time it saw: from 250 s, not from the agent's outage.
    fired, = [a for a in feed.of(ALERTS) if a["detector"] == "idle_allocated" and a["status"] == "FIRING"]
    assert fired["since"] >= BASE_MS + 240_000


def test_a_replayed_unobserved_span_counts_once_and_a_hostile_one_is_a_dead_letter():
    step, store = make()
    feed = Feed(step)
    feed(*ticks("slurm-7", 0, 30, util=80.0), unobserved("slurm-7", 30, 50))
    step.samples(0, [Decoded(0, *unobserved("slurm-7", 30, 50), offset=30)], BASE_MS + 10**8)  # replayed
    assert store["slurm-7"].windows[str(BASE_MS)]["goodput"]["unobserved_ms"] == 2 * 20_000
    for bad, why in [({"to_time": BASE_MS - 1}, "ends"), ({"gpus": float("nan")}, "GPUs"), ({"gpus": 1e9}, "GPUs"),
                     ({"workflow_id": "x\ny"}, "U+000A"), ({"to_time": BASE_MS + 40 * 86_400_000}, "days")]:
        out = feed(unobserved("slurm-7", 0, 10, **bad))
        assert [why in reason for _, reason in out.dead] == [True], (bad, out.dead)


def test_no_alert_is_judged_inside_start_up_the_waterfall_and_the_alerts_agree():
    # Issue 40, on Alibaba's trace: 114 idle alerts fired on a workflow's first window while the
    # waterfall counted the same seconds as start-up.
    step, _ = make(startup_max_s=180.0)
    feed = Feed(step)
    feed(*ticks("slurm-7", 0, 400, util=0.0), *ticks("wf-other", 400, 500, util=50.0))
    windows = [w for w in feed.of(WORKFLOW_WINDOWS) if w["workflow_id"] == "slurm-7"]
    startup_end = max(w["window_end"] for w in windows if w["startup_gpu_seconds"] > 0)
    alerts = [a for a in feed.of(ALERTS) if a["workflow_id"] == "slurm-7"]
    assert alerts and all(a["since"] >= startup_end for a in alerts), (startup_end, alerts)


def test_the_end_resolves_every_firing_alert_and_the_summary_carries_the_schedulers_end():
    step, store = make(startup_max_s=0.0, ladders=[LADDER])
    feed = Feed(step)
    step.life_cycle(0, [Decoded(0, *event("slurm-7", "STARTED", 0))], BASE_MS)
    feed(*ticks("slurm-7", 0, 300, util=0.0))
    assert any(a["status"] == "FIRING" for a in feed.of(ALERTS))
    assert [e["step"] for e in feed.of(ENFORCEMENT)] == ["FIRST_WARNING", "SECOND_WARNING"]
    end = event("slurm-7", "ENDED", 300.5, end_state="CANCELLED", cancelled_by="ana", exit_code=0, exit_signal=15)
    feed(*ticks("slurm-7", 300, 301, util=0.0), end)
    summary, = feed.of(WORKFLOW_SUMMARIES)
    assert summary["ended_at"] == BASE_MS + 300_500 and summary["allocated_at"] == BASE_MS
    assert (summary["end_state"], summary["cancelled_by"], summary["scheduler"]) == ("CANCELLED", "ana", "slurm")
    assert summary["end_reason"] == "slurm: CANCELLED by ana"
    firing = {a["alert_id"] for a in feed.of(ALERTS) if a["status"] == "FIRING"}
    resolved = [a for a in feed.of(ALERTS) if a["status"] == "RESOLVED"]
    assert firing == {a["alert_id"] for a in resolved}  # every one resolves, once
    assert all("the workflow ended (slurm: CANCELLED by ana)" in a["message"] and a["window_end"] == BASE_MS + 300_500
               for a in resolved)
    assert [e["step"] for e in feed.of(ENFORCEMENT)][-1] == "CANCELLED"
    assert all(life.get("status") != "firing" for life in store["slurm-7"].alerts.values())


def test_a_workflow_whose_samples_stop_for_good_ends_and_its_alerts_resolve():
    step, _ = make(startup_max_s=0.0)
    feed = Feed(step)
    feed(*ticks("wf-gone", 0, 300, util=0.0))
    feed(*ticks("wf-other", 300, 600, util=50.0))  # 300 s later, past workflow_ended_s = 120 s
    resolved = [a for a in feed.of(ALERTS) if a["workflow_id"] == "wf-gone" and a["status"] == "RESOLVED"]
    assert resolved and all("its samples stopped" in a["message"] for a in resolved)


def test_a_clock_that_jumps_past_the_retention_ends_a_workflow_before_forgetting_it():
    """A quiet partition that follows the fleet's clock after hours (its worker was down, the
    fleet moved on) must end its workflows -- summary out, alerts resolved -- before the
    retention forgets them; forgotten first, their alerts stayed FIRING for good."""
    step, store = make(startup_max_s=0.0)
    feed = Feed(step)
    feed(*ticks("wf-quiet", 0, 300, util=0.0))
    assert any(a["status"] == "FIRING" for a in feed.of(ALERTS))
    later = BASE_MS + 3 * 3600 * 1000  # three hours on: past the hour the windows' retention keeps
    step.quiet_ms = 0
    feed(("PartitionClock", {"event_time": later, "worker": "w2", "sent_at": later}))
    (summary,) = [s for s in feed.of(WORKFLOW_SUMMARIES) if s["workflow_id"] == "wf-quiet"]
    assert summary["end_reason"] == "its samples stopped: none for 120 s"
    last = {}
    for a in feed.of(ALERTS):
        last[a["alert_id"]] = a["status"]
    assert last and set(last.values()) == {"RESOLVED"}
    feed(("PartitionClock", {"event_time": later + 1000, "worker": "w2", "sent_at": later}))
    assert "wf-quiet" not in store  # forgotten once it has ended






@pytest.mark.parametrize("pseudo", [IDLE, UNALLOCATED])
def test_gpus_no_workflow_holds_are_counted_but_never_alerted_or_summarised(pseudo):
    """GPUs that no process (or no allocation) holds are the fleet's free capacity: their
    windows go out, so that capacity is counted, but nobody is alerted about them, no ladder
    climbs for them and no job ends."""
    step, _ = make(ladders=[LADDER])
    feed = Feed(step)
    feed(*blocks(pseudo, 0, 600))
    feed(*blocks("wf-real", 600, 601))  # the clock moves on: all closes
    windows = [w for w in feed.of(WORKFLOW_WINDOWS) if w["workflow_id"] == pseudo]
    assert len(windows) >= 9 and all(w["idle_gpus"] == 1 for w in windows)
    assert feed.of(ALERTS) == [] and feed.of(ENFORCEMENT) == []
    assert [s for s in feed.of(WORKFLOW_SUMMARIES) if s["workflow_id"] == pseudo] == []


def test_a_schedulers_end_closes_the_jobs_windows_and_summarises_it_at_once():
    """The end travels on the samples topic after the job's last samples: the job's last
    window closes then, not when the fleet's clock passes it, and its summary goes out."""
    feed = Feed(make()[0])
    feed(*blocks("slurm-1", 0, 96), ended("slurm-1", 96))
    windows = [w for w in feed.of(WORKFLOW_WINDOWS) if w["workflow_id"] == "slurm-1"]
    assert [(w["window_start"] - BASE_MS, w["gpu_seconds"]) for w in windows] == [(0, 60.0), (60_000, 36.0)]
    summary, = feed.of(WORKFLOW_SUMMARIES)
    assert summary["workflow_id"] == "slurm-1" and summary["gpu_seconds"] == 96.0
    assert summary["end_reason"] == "its scheduler (slurm) ended it"


def test_a_job_on_two_hosts_ends_when_both_have_ended_it():
    step, _ = make()
    feed = Feed(step)
    step.life_cycle(0, [Decoded(i, "WorkflowEvent", {**ended("slurm-2", 0, host)[1], "event": "STARTED"})
                        for i, host in enumerate(("gpu-host-000", "gpu-host-001"))], BASE_MS)
    feed(*blocks("slurm-2", 0, 90), ended("slurm-2", 90, "gpu-host-000"))
    assert feed.of(WORKFLOW_SUMMARIES) == []
    assert [w["window_start"] - BASE_MS for w in feed.of(WORKFLOW_WINDOWS)] == [0]
    feed(*blocks("slurm-2", 90, 100), ended("slurm-2", 100, "gpu-host-001"))
    summary, = feed.of(WORKFLOW_SUMMARIES)
    assert summary["gpu_seconds"] == 100.0


def test_a_sample_after_the_early_close_completes_the_window_as_a_new_version():
    feed = Feed(make()[0])
    feed(*blocks("slurm-3", 0, 90), ended("slurm-3", 90))
    feed(*blocks("slurm-3", 90, 92))  # a straggler of the same window
    versions = [(w["window_start"] - BASE_MS, w["version"], w["gpu_seconds"]) for w in feed.of(WORKFLOW_WINDOWS)]
    assert versions == [(0, 1, 60.0), (60_000, 1, 30.0), (60_000, 2, 32.0)]


def test_the_life_cycle_topic_leaves_a_schedulers_end_to_the_samples_topic():
    """The same end on the life-cycle topic is not applied there: read before the job's last
    samples, it would end the job early."""
    step, store = make()
    feed = Feed(step)
    feed(*blocks("slurm-4", 0, 30))
    step.life_cycle(0, [Decoded(0, *ended("slurm-4", 30))], BASE_MS + 30_000)
    assert store["slurm-4"].ending is False
    feed(ended("slurm-4", 30))
    assert store["slurm-4"].ended and feed.of(WORKFLOW_SUMMARIES)


def test_a_gpu_the_job_never_opens_and_a_foreign_process_are_alerted_with_names():
    samples = []
    for t in range(200):
        at = BASE_MS + t * 1000
        samples += [sample(workflow_id="slurm-5", event_time=at, gpu_uuid="GPU-0", gpu_index=0, process_count=1,
                           utilization_pct=80.0),
                    sample(workflow_id="slurm-5", event_time=at, gpu_uuid="GPU-1", gpu_index=1, process_count=0,
                           utilization_pct=0.0, memory_used_bytes=0),
                    sample(workflow_id="slurm-5", event_time=at, gpu_uuid="GPU-2", gpu_index=2, process_count=1,
                           utilization_pct=30.0, foreign_workflow_id="wf-intruder")]
    feed = Feed(make()[0])
    feed(*[("GpuSampleColumns", b) for b in columns_of(samples)])
    alerts = {a["detector"]: a for a in feed.of(ALERTS) if a["status"] == "FIRING"}
    assert {"partial_use", "foreign_process"} <= set(alerts)
    assert "gpu-host-000/gpu1" in alerts["partial_use"]["message"]
    assert "no process of the job ever opened them: gpu-host-000/gpu1." in alerts["partial_use"]["message"]
    assert "wf-intruder" in alerts["foreign_process"]["message"] and "slurm-5" in alerts["foreign_process"]["message"]


DAY_MS = 86_400_000


def test_a_clock_an_end_or_an_outage_ahead_of_the_time_kafka_received_it_is_a_dead_letter():
    """The samples topic keeps the broker's time on every record, and a GPU sample more than 5
    minutes ahead of it was refused. Its other records were not: a ``PartitionClock`` a day ahead
    (a replay run where the clock is wrong) moved the partition's clock on by a day, closing every
    open window, so that every sample of the day that followed came late; a scheduler's end a day
    ahead went into the job's summary; an outage a day ahead was counted as unobserved GPU-time."""
    step, store = make()
    feed = Feed(step)
    feed(*ticks("slurm-7", 0, 100, util=80.0))
    received = BASE_MS + 100_000
    clock = ("PartitionClock", {"event_time": received + DAY_MS, "worker": "replay", "sent_at": received + DAY_MS})
    ahead = [clock, ended("slurm-7", 100 + 86_400), unobserved("slurm-7", 99, 100 + 86_400)]
    out = step.samples(0, [Decoded(i, *r, feed.offset + i, received) for i, r in enumerate(ahead)], BASE_MS + 10**8)
    reasons = dict(out.dead)
    assert sorted(reasons) == [0, 1, 2], out.dead
    assert reasons[0].startswith("the fleet's clock from worker 'replay' is ahead of the time Kafka received it "
                                 "(2026-01-01T00:01:40Z) by 86,400 s (at most 300 s allowed")
    assert reasons[1].startswith("the end of workflow slurm-7 from host gpu-host-000 is ahead of the time Kafka")
    assert reasons[2].startswith("the unobserved time of workflow slurm-7 from host gpu-host-000 is ahead")
    assert out.records == [] and not store["slurm-7"].ending
    # Within the bound, the same clock closes the windows of a partition whose samples stopped.
    feed.offset += 3
    on_time = step.samples(0, [Decoded(0, clock[0], {**clock[1], "event_time": received + 200_000}, feed.offset,
                                       received)], BASE_MS + 10**8)
    assert on_time.dead == [] and any(s is WORKFLOW_WINDOWS for s, _ in on_time.records)
