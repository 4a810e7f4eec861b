"""``gpufleet goodput`` and the job report on the real embedded ClickHouse: the waterfall of a
planted fleet read back through the DDL's views, with energy, carbon and cost from a rates file."""

from __future__ import annotations

from collections import defaultdict

import pytest

from gpufleet.reports.goodput import fleet_goodput, render_groups
from gpufleet.reports.workflows import workflow_summary
from producers.simulate.fleet import build_fleet
from schemas.goodput_buckets import BUCKETS, OBSERVED_BUCKETS
from schemas.sample_columns import columns_of
from sinks.clickhouse_ddl import WORKFLOW_EVENTS_TABLE, WORKFLOW_WINDOWS_TABLE
from sinks.job_report import JOULES_PER_KWH, RatesError, job_report, load_rates, render_waterfall
from sinks.write_clickhouse import ClickHouseWriter, Row
from streams.windows.batches import Incoming, WindowConfig
from streams.windows.goodput import GoodputConfig
from streams.windows.utilization import WindowAggregator
from tests.support.samples import BASE_MS

TICKS = 600
CONFIG = WindowConfig(goodput=GoodputConfig(startup_max_s=300))

RATES = """
currency = "USD"
default_price_per_gpu_hour = 2.0
default_grid_g_per_kwh = 400.0

[price_per_gpu_hour]
"NVIDIA H100 80GB HBM3" = 4.0

[grid_g_per_kwh]
eu-west = 250.0
"""


@pytest.fixture(scope="module", params=[False, True], ids=["processes", "scheduler"])
def fleet(request):
    """The planted fleet as agents see it from the processes alone, and as agents that read the
    scheduler's allocations see it (free GPUs, a CPU-only job holding GPUs, a job opening half)."""
    return build_fleet(seed=11, hosts=4, gpus_per_host=8, workflows=9, planted=True, scheduler=request.param)


@pytest.fixture
def stored(fleet, chdb_client, database):
    """The planted fleet's windows in ClickHouse, and an event placing every workflow in a cluster."""
    agg = WindowAggregator(CONFIG, {}, {}, clock=lambda: BASE_MS + 10**9)
    blocks = [b for t in range(TICKS) for b in columns_of(list(fleet.samples_at(t, BASE_MS, 1000)))]
    windows = agg.process(0, [Incoming(i, b) for i, b in enumerate(blocks)], closed_at=0).closed
    windows += agg.advance(0, BASE_MS + TICKS * 1000 + 120_000, closed_at=0).closed
    writer = ClickHouseWriter(chdb_client, database)
    writer.ensure_tables()
    assert writer.insert(WORKFLOW_WINDOWS_TABLE, [Row(0, i, w) for i, w in enumerate(windows)]) == []
    events = [{"workflow_id": w.workflow_id, "event": "started", "event_time": BASE_MS, "host": w.gpus[0].host,
               "owner": w.owner, "team": w.team, "gpu_uuids": [], "pids": [], "cmdline": None, "framework": "pytorch",
               "framework_version": None, "scheduler_job_id": None, "attribution": "simulated", "model": None,
               "cluster": "eu-west" if i % 2 else "us-east"} for i, w in enumerate(fleet.workflows)]
    assert writer.insert(WORKFLOW_EVENTS_TABLE, [Row(0, i, e) for i, e in enumerate(events)]) == []
    return windows


def test_the_fleet_waterfall_is_the_planted_truth_with_its_cost_and_carbon(fleet, stored, chdb_client, database,
                                                                           tmp_path):
    (tmp_path / "rates.toml").write_text(RATES)
    rates = load_rates(tmp_path / "rates.toml")
    total, by_team = fleet_goodput(chdb_client, database, "team", "all", rates)
    truth = fleet.planted(TICKS, BASE_MS, 1000, CONFIG.goodput.startup_max_s)
    seconds, joules, cost, grams = defaultdict(float), defaultdict(float), defaultdict(float), defaultdict(float)
    for i, w in enumerate(fleet.workflows):
        price = 4.0 if w.gpus[0].model == "NVIDIA H100 80GB HBM3" else 2.0
        grid = 250.0 if i % 2 else 400.0
        for bucket, (s, j) in truth[w.workflow_id].items():
            seconds[bucket] += s
            joules[bucket] += j
            cost[bucket] += s / 3600 * price
            grams[bucket] += j / JOULES_PER_KWH * grid
    assert set(seconds) == set(OBSERVED_BUCKETS)  # (unobserved: no agent was down)
    assert total.buckets["unobserved"].gpu_seconds == 0.0
    for b in OBSERVED_BUCKETS:
        got = total.buckets[b]
        assert got.gpu_seconds == pytest.approx(seconds[b], abs=1e-6), b
        assert got.joules == pytest.approx(joules[b], rel=1e-9), b
        assert got.cost == pytest.approx(cost[b], rel=1e-9), b
        assert got.grams == pytest.approx(grams[b], rel=1e-9), b
    assert total.buckets["unclassified"].gpu_seconds == pytest.approx(0.0, abs=1e-6)
    assert total.goodput_pct == pytest.approx(100 * seconds["productive"] / sum(seconds.values()))
    assert total.unallocated.gpu_seconds == pytest.approx(fleet.unallocated(TICKS, 1000), abs=1e-6)
    assert (total.unallocated.gpu_seconds > 0) == fleet.scheduler
    assert {g.key for g in by_team} == {w.team for w in fleet.workflows}
    assert sum(g.allocated.gpu_seconds for g in by_team) == pytest.approx(total.allocated.gpu_seconds)
    text = render_waterfall(total, rates, "Fleet goodput")
    assert "input-bound" in text and "kg CO2e" in text and "USD" in text
    assert f"goodput: {total.goodput_pct:.1f}%" in text
    assert by_team[0].key in render_groups(by_team, "team", rates)


def test_windows_written_before_goodput_are_unclassified_not_lost(chdb_client, database):
    from tests.support.samples import window

    old = window(**{f"{b}_gpu_seconds": 0.0 for b in BUCKETS}, **{f"{b}_joules": 0.0 for b in BUCKETS})
    writer = ClickHouseWriter(chdb_client, database)
    writer.ensure_tables()
    assert writer.insert(WORKFLOW_WINDOWS_TABLE, [Row(0, 0, old)]) == []
    total, _ = fleet_goodput(chdb_client, database, "fleet", "all")
    assert total.buckets["unclassified"].gpu_seconds == 120.0 and total.allocated.gpu_seconds == 120.0
    assert total.buckets["unclassified"].joules == old["energy_joules"]
    assert "unclassified (before goodput)" in render_waterfall(total, load_rates(None), "t")


def test_the_job_report_says_where_the_hours_went_and_what_to_try(fleet, stored, chdb_client, database):
    starved = next(w for w in fleet.workflows if w.profile.name == "input-bound")
    summary, cluster = workflow_summary(chdb_client, database, starved.workflow_id)  # still running: from windows
    assert summary["end_reason"] == "still running" and cluster in ("eu-west", "us-east")
    text, page = job_report(summary, load_rates(None), cluster)
    assert text.startswith(f"gpufleet job report: {starved.workflow_id}")
    assert "input-bound" in text and "DataLoader workers" in text and "start-up" in text
    assert "<table>" in page and starved.workflow_id in page


def test_a_rates_file_with_a_mistake_is_refused_with_where(tmp_path):
    bad = tmp_path / "rates.toml"
    bad.write_text('[price_per_gpu_hour]\n"A100" = "four"\n')
    with pytest.raises(RatesError, match=r"price_per_gpu_hour.A100 must be a number"):
        load_rates(bad)
    bad.write_text("[[grid_series]]\ncluster = 'x'\nstart = 'soon'\ng_per_kwh = 1\n")
    with pytest.raises(RatesError, match=r"grid_series\[0\].start"):
        load_rates(bad)


def test_a_grid_series_takes_the_latest_intensity_before_the_hour(tmp_path):
    from datetime import UTC, datetime

    f = tmp_path / "rates.toml"
    f.write_text(
        "default_grid_g_per_kwh = 400.0\n[[grid_series]]\ncluster = 'eu'\nstart = 2026-06-01T00:00:00Z\n"
        "g_per_kwh = 180.0\n[[grid_series]]\ncluster = 'eu'\nstart = 2026-03-01T00:00:00Z\ng_per_kwh = 300.0\n"
    )
    rates = load_rates(f)
    assert rates.intensity("eu", datetime(2026, 2, 1, tzinfo=UTC)) == 400.0
    assert rates.intensity("eu", datetime(2026, 4, 1, tzinfo=UTC)) == 300.0
    assert rates.intensity("eu", datetime(2026, 7, 1)) == 180.0  # a naive time is UTC
    assert rates.intensity("us", datetime(2026, 7, 1, tzinfo=UTC)) == 400.0


def test_capacity_no_job_held_is_a_line_of_its_own_beside_the_allocated(chdb_client, database):
    """GPUs no job was allocated (the agents' ``unallocated``, or ``idle`` where they read no
    allocations) are not in any bucket: capacity = unallocated + allocated."""
    from tests.support.samples import window

    writer = ClickHouseWriter(chdb_client, database)
    writer.ensure_tables()
    job = window(workflow_id="slurm-1", gpu_seconds=120.0, productive_gpu_seconds=120.0,
                 **{f"{b}_gpu_seconds": 0.0 for b in BUCKETS if b != "productive"})
    free = [window(workflow_id=name, window_start=BASE_MS + i * 60_000, window_end=BASE_MS + (i + 1) * 60_000,
                   gpu_seconds=60.0, idle_gpu_seconds=60.0, energy_joules=3000.0,
                   **{f"{b}_gpu_seconds": 0.0 for b in BUCKETS if b != "idle"}, owner=None, team=None)
            for i, name in enumerate(("unallocated", "idle"))]
    assert writer.insert(WORKFLOW_WINDOWS_TABLE, [Row(0, i, w) for i, w in enumerate([job, *free])]) == []
    total, by_workflow = fleet_goodput(chdb_client, database, "workflow", "all")
    assert total.allocated.gpu_seconds == 120.0 and total.buckets["idle"].gpu_seconds == 0.0
    assert total.unallocated.gpu_seconds == 120.0 and total.unallocated.joules == 6000.0
    assert [g.key for g in by_workflow] == ["slurm-1"]
    text = render_waterfall(total, load_rates(None), "Fleet goodput")
    assert "unallocated (no job held them)" in text and "capacity" in text
    assert "allocated: 50.0% of the capacity was handed to jobs" in text


def test_a_job_that_never_opened_its_gpus_is_told_that_and_not_start_up_advice():
    """The demo's CPU-only job (issue 42): its start-up and idle buckets have one cause, which the
    report names, with what to do about it; a job that opened some of its GPUs is told which to drop."""
    from tests.support.alerts import job_summary

    base = {**job_summary("wf-cpu", "vision", "ana"), "max_gpus": 2, "startup_gpu_seconds": 1800.0,
            "idle_gpu_seconds": 1800.0, "input_bound_gpu_seconds": 0.0, "productive_gpu_seconds": 0.0,
            "gpu_seconds": 3600.0, "alerts_fired": ["idle_allocated"]}
    text, page = job_report({**base, "untouched_gpus": 2})
    assert "No process of the job ever opened its 2 GPU(s)" in text and "submit it without GPUs" in text
    assert "Start-up took long" not in text and "GPUs sat at 0 %" not in text
    assert "No process of the job ever opened its 2 GPU(s)" in page
    partly = job_report({**base, "max_gpus": 4, "untouched_gpus": 2})[0]
    assert "2 of its 4 GPUs were never opened by any process of the job: ask for 2" in partly
    assert "Start-up took long" in job_report({**base, "untouched_gpus": None})[0]  # not known: as before
