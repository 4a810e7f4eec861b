"""Every query of docs/queries.md runs on the embedded engine against a simulated fleet, and
its answer equals what Python computes from the same samples."""

import re
from collections import defaultdict
from datetime import date
from pathlib import Path

import pytest

from sinks.clickhouse_ddl import ALERTS_TABLE
from sinks.write_clickhouse import ClickHouseWriter, Row
from tests.support.fleet_data import PLANTED_FINDINGS, SMALL_MEMORY, build, store

COOKBOOK = Path(__file__).resolve().parents[2] / "docs" / "queries.md"


def recipes() -> dict[str, str]:
    text = COOKBOOK.read_text()
    found = re.findall(r"^### (.+?)\n.*?```sql\n(.*?)```", text, flags=re.DOTALL | re.MULTILINE)
    return {title.strip(): sql for title, sql in found}


@pytest.fixture(scope="module")
def fleet(chdb_client):
    client = chdb_client  # one embedded engine per process: the session's
    data = build()
    writer = ClickHouseWriter(client, "cookbook")
    store(writer, data)
    wf = data.fleet.workflows
    alert = {"detector": "low_utilization", "severity": "CRITICAL", "notify": True, "observed": 9.0, "threshold": 15.0,
             "message": "low", "advice": "fix", "window_start": data.start_ms + 540_000, "since": data.start_ms,
             "window_end": data.start_ms + 600_000, "fired_at": data.start_ms + 610_000, "wasted_gpu_hours_so_far": 1.5}
    alerts = [
        {**alert, "alert_id": "a1", "status": "FIRING", "workflow_id": wf[0].workflow_id, "owner": wf[0].owner,
         "team": wf[0].team},
        {**alert, "alert_id": "a2", "status": "FIRING", "workflow_id": wf[1].workflow_id, "owner": wf[1].owner,
         "team": wf[1].team},
        {**alert, "alert_id": "a2", "status": "RESOLVED", "workflow_id": wf[1].workflow_id, "owner": wf[1].owner,
         "team": wf[1].team, "window_end": data.start_ms + 660_000},
    ]
    assert writer.insert(ALERTS_TABLE, [Row(0, i, a) for i, a in enumerate(alerts)]) == []
    yield client, data
    client.command("DROP DATABASE IF EXISTS cookbook")


def run(fleet, title):
    client, _ = fleet
    sql = recipes()[title].replace("gpufleet.", "cookbook.")
    return client.query(sql).result_rows


def seconds(s):
    return s["interval_ms"] / 1000 * (s.get("share") or 1.0)


def test_the_cookbook_has_the_questions_operators_ask():
    titles = list(recipes())
    assert len(titles) == 11
    assert "Who wasted the most GPU-hours this week?" in titles


def test_who_wasted_the_most(fleet):
    from schemas.vocabulary import wasted_seconds

    _, data = fleet
    want = defaultdict(lambda: [0.0, 0.0, set()])
    for s in data.samples:
        w = want[(s["owner"], s["team"])]
        w[1] += seconds(s)
        w[2].add(s["workflow_id"])
    for window in data.windows:  # wasted: the waste buckets of the worker's windows
        want[(window["owner"], window["team"])][0] += wasted_seconds(window)
    rows = run(fleet, "Who wasted the most GPU-hours this week?")
    assert [r[2] for r in rows] == sorted((r[2] for r in rows), reverse=True)
    assert {(o, t): (wasted, hours, n) for o, t, wasted, hours, n in rows} == {
        k: (pytest.approx(round(v[0] / 3600, 2), abs=0.011), pytest.approx(round(v[1] / 3600, 2), abs=0.011),
            len(v[2])) for k, v in want.items()}


def test_which_framework_version_regressed(fleet):
    _, data = fleet
    want = defaultdict(lambda: [0.0, 0.0])
    for s in data.samples:
        framework, version = data.frameworks[s["workflow_id"]].split()
        day = date.fromtimestamp(s["event_time"] // 1000)
        key = (framework, version, s["gpu_model"])
        want[key][0] += seconds(s) * s["utilization_pct"] / 100
        want[key][1] += seconds(s)
    rows = run(fleet, "Which framework version regressed?")
    got = defaultdict(lambda: [0.0, 0])
    for day, framework, version, model, pct, _ in rows:
        got[(framework, version, model)][0] = pct  # one simulated day (or two around midnight)
    assert set(got) == set(want)
    if len({r[0] for r in rows}) == 1:
        for key, (pct, _) in got.items():
            assert pct == pytest.approx(round(100 * want[key][0] / want[key][1], 1), abs=0.051)
    assert day >= date(2026, 1, 1)


def test_jobs_that_never_used_a_fifth_of_gpu_memory(fleet):
    _, data = fleet
    peak = defaultdict(float)
    for s in data.samples:
        peak[s["workflow_id"]] = max(peak[s["workflow_id"]], s["memory_used_bytes"] / s["memory_total_bytes"])
    rows = run(fleet, "Which jobs never used more than 20 % of GPU memory?")
    assert {r[0] for r in rows} == {wf for wf, p in peak.items() if p < 0.2} == {
        data.fleet.workflows[SMALL_MEMORY].workflow_id}
    assert rows[0][3] == pytest.approx(0.1, abs=0.001)


def test_gpus_allocated_but_idle_now(fleet):
    _, data = fleet
    last = max(s["event_time"] for s in data.samples)
    busy = defaultdict(float)
    for s in data.samples:
        if s["event_time"] >= last - 300_000:
            busy[(s["host"], s["gpu_index"])] = max(busy[(s["host"], s["gpu_index"])], s["utilization_pct"])
    rows = run(fleet, "Which GPUs are allocated but idle right now?")
    idle = {gpu for gpu, top in busy.items() if top == 0}
    assert {(h, i) for h, i, *_ in rows} == idle
    zombie = data.fleet.workflows[0]
    assert {(g.host, g.index) for g in zombie.gpus} <= idle


def test_team_by_gpu_model(fleet):
    _, data = fleet
    want = defaultdict(lambda: [0.0, 0.0, 0.0])
    for s in data.samples:
        w = want[(s["team"], s["gpu_model"])]
        w[0] += seconds(s)
        w[1] += seconds(s) * s["utilization_pct"] / 100
        w[2] += seconds(s) if s["utilization_pct"] == 0 else 0
    rows = run(fleet, "How busy is each team on each GPU model?")
    for team, model, hours, pct, idle_pct in rows:
        g, b, z = want[(team, model)]
        assert hours == pytest.approx(round(g / 3600, 2), abs=0.011)
        assert pct == pytest.approx(round(100 * b / g, 1), abs=0.051)
        assert idle_pct == pytest.approx(round(100 * z / g, 1), abs=0.051)
    assert len(rows) == len(want)


def test_antipatterns_that_cost_the_most(fleet):
    _, data = fleet
    rows = run(fleet, "Which antipatterns cost the fleet the most?")
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (rule, round(at_stake / 3600, 2), 1) for _, rule, at_stake in sorted(PLANTED_FINDINGS, key=lambda f: -f[2])]
    assert rows[0][3] == [data.fleet.workflows[PLANTED_FINDINGS[0][0]].workflow_id]


def test_alerts_firing_now(fleet):
    _, data = fleet
    rows = run(fleet, "Which alerts are firing, and for how long?")
    assert [(r[0], r[1], r[5]) for r in rows] == [(data.fleet.workflows[0].workflow_id, "low_utilization", 10)]


def test_what_the_automatic_profile_found(chdb_client, database):
    from sinks.clickhouse_ddl import FINDINGS_TABLE

    writer = ClickHouseWriter(chdb_client, database)
    writer.ensure_tables()
    alert = {"detector": "low_utilization", "severity": "CRITICAL", "notify": True, "observed": 9.0,
             "threshold": 15.0, "message": "low", "advice": "fix", "window_start": 0, "since": 0, "window_end": 60_000,
             "fired_at": 61_000, "wasted_gpu_hours_so_far": 1.5, "owner": "ana", "team": "nlp"}
    top = [{"rule": r, "severity": "WARNING", "title": r, "evidence": "e", "recommendation": "r",
            "gpu_seconds_at_stake": 1.0, "ranks": 2} for r in ("input_pipeline_stall", "launch_bound")]
    writer.insert(ALERTS_TABLE, [Row(0, i, a) for i, a in enumerate([
        {**alert, "alert_id": "a1", "status": "FIRING", "workflow_id": "wf-1", "profile_request_id": "auto-a1"},
        {**alert, "alert_id": "a1", "status": "FIRING", "workflow_id": "wf-1", "profile_request_id": "auto-a1",
         "root_cause": "GPU idle 80 %.", "findings": top, "fired_at": 90_000},  # the update: replaces the row
        {**alert, "alert_id": "a2", "status": "FIRING", "workflow_id": "wf-2", "profile_request_id": "auto-a2"},
    ])])
    finding = {"rank": 0, "severity": "WARNING", "title": "t", "evidence": "e", "gpu_seconds_at_stake": 1.0,
               "recommendation": "r", "detected_at": 0, "workflow_id": "wf-1"}
    writer.insert(FINDINGS_TABLE, [Row(0, i, {**finding, "finding_id": f"f{i}", "trace_id": t, "rule": rule})
                                   for i, (t, rule) in enumerate([
                                       ("profile/auto-a1/h1/rank0", "input_pipeline_stall"),
                                       ("profile/auto-a1/h1/rank0", "launch_bound"),
                                       ("profile/auto-a1/h2/rank1", "input_pipeline_stall"),
                                       ("profile/auto-a2/h1/rank0", "launch_bound"),
                                       ("wf-1/trace.json", "launch_bound")])])
    sql = recipes()["Why is it wasting? What did the automatic profile find?"].replace("gpufleet.", f"{database}.")
    assert chdb_client.query(sql).result_rows == [
        ("wf-1", "low_utilization", "FIRING", "auto-a1", "GPU idle 80 %.", "input_pipeline_stall, launch_bound", 3, 2)]


def planted(data) -> dict[str, dict[str, list[float]]]:
    """Per workflow and goodput bucket, [GPU-seconds, joules] as the fleet put them there."""
    from streams.windows.goodput import GoodputConfig
    from tests.support.fleet_data import INTERVAL_MS, TICKS

    return data.fleet.planted(TICKS, data.start_ms, INTERVAL_MS, GoodputConfig().startup_max_s)


def test_goodput_by_team(fleet):
    _, data = fleet
    truth = planted(data)
    want = defaultdict(lambda: defaultdict(float))
    for w in data.fleet.workflows:
        for bucket, (s, _) in truth[w.workflow_id].items():
            want[w.team][bucket] += s
    assert any(want[t]["startup"] and want[t]["idle"] for t in want)  # the idle workflow: starting, then idle
    rows = run(fleet, "What was each team's goodput this week?")
    assert {r[0] for r in rows} == set(want)
    for team, hours, pct, unhealthy, startup, idle, starved, low in rows:
        b = want[team]
        total = sum(b.values())
        assert hours == pytest.approx(round(total / 3600, 2), abs=0.011)
        assert pct == pytest.approx(round(100 * b["productive"] / total, 1), abs=0.051)
        assert (unhealthy, startup, idle, starved, low) == pytest.approx(
            tuple(round(b[k] / 3600, 2) for k in ("unhealthy", "startup", "idle", "input_bound", "low_util")),
            abs=0.011)


def test_workflows_that_wasted_the_most_energy(fleet):
    _, data = fleet
    truth = planted(data)
    wasted = {wf: sum(j for b, (_, j) in buckets.items() if b != "productive") for wf, buckets in truth.items()}
    rows = run(fleet, "Which workflows wasted the most energy?")
    assert [r[3] for r in rows] == sorted((r[3] for r in rows), reverse=True)
    assert {wf for wf, j in wasted.items() if j > 0} <= {r[0] for r in rows}  # every one that wasted any
    for wf, _, _, kwh_wasted, kwh in rows:
        assert kwh_wasted == pytest.approx(round(wasted[wf] / 3.6e6, 3), abs=0.0011)
        assert kwh == pytest.approx(round(sum(j for _, j in truth[wf].values()) / 3.6e6, 3), abs=0.0011)


def test_cost_of_idle_allocated_gpus_per_cluster(fleet):
    _, data = fleet
    truth = planted(data)
    price = {"NVIDIA H100 80GB HBM3": 4.0, "NVIDIA A100-SXM4-80GB": 2.5}
    want = defaultdict(float)
    for w in data.fleet.workflows:
        idle = truth[w.workflow_id].get("idle", [0.0])[0]
        if idle:
            cluster = "east" if w.gpus[0].host < "gpu-host-002" else "west"
            want[(cluster, w.gpus[0].model)] += idle
    assert want  # the idle workflow held its GPUs past its start-up
    rows = run(fleet, "What do idle-allocated GPUs cost, per cluster?")
    assert {(c, m): (h, cost) for c, m, h, cost in rows} == {
        k: (pytest.approx(round(s / 3600, 2), abs=0.011),
            pytest.approx(round(s / 3600 * price.get(k[1], 2.0), 2), abs=0.011)) for k, s in want.items()}
