"""The storage model on the embedded engine, against a simulated fleet's records: rollups,
latest workflow metadata and the ranking of fleet-wide opportunities, each checked against
totals computed in Python from the same samples."""

from collections import defaultdict

import pytest

from gpufleet.reports.opportunities import opportunities, parse_since
from sinks.write_clickhouse import ClickHouseWriter
from tests.support.fleet_data import build, store


@pytest.fixture(scope="module")
def data():
    return build()


@pytest.fixture
def writer(chdb_client, database, data):
    w = ClickHouseWriter(chdb_client, database)
    store(w, data)
    return w


def query(writer, sql):
    return writer.client.query(sql.replace("{db}", writer.database)).result_rows


def test_hourly_and_daily_rollups_equal_the_samples(writer, data):
    expected = defaultdict(lambda: [0.0, 0.0, 0.0])
    for s in data.samples:
        seconds = s["interval_ms"] / 1000 * (s.get("share") or 1.0)
        e = expected[(s["team"], s["gpu_model"])]
        e[0] += seconds
        e[1] += seconds * s["utilization_pct"] / 100
        e[2] += seconds if s["utilization_pct"] == 0 else 0.0
    for table in ("gpu_hours_hourly", "gpu_hours_daily"):
        got = {(team, model): (gpu, busy, zero) for team, model, gpu, busy, zero in query(writer, f"""
            SELECT team, gpu_model, sum(gpu_seconds), sum(busy_gpu_seconds), sum(zero_util_gpu_seconds)
            FROM {{db}}.{table} GROUP BY team, gpu_model""")}
        assert got.keys() == expected.keys()
        for key, (gpu, busy, zero) in got.items():
            assert gpu == pytest.approx(expected[key][0]) and busy == pytest.approx(expected[key][1], rel=1e-5)
            assert zero == pytest.approx(expected[key][2])
    workflows = query(writer, "SELECT uniqMerge(workflows) FROM {db}.gpu_hours_daily")[0][0]
    assert workflows == len(data.fleet.workflows)


def test_workflows_keep_the_latest_metadata(writer, data):
    rows = query(writer, "SELECT workflow_id, event, framework, framework_version, model FROM {db}.workflows FINAL")
    assert len(rows) == len(data.fleet.workflows)
    for wf, event, framework, version, model in rows:
        assert event == "heartbeat" and f"{framework} {version}" == data.frameworks[wf] and model == f"model-{wf[-1]}"


def test_opportunities_rank_the_planted_causes_with_their_gpu_hours(writer, data):
    columns, rows = opportunities(writer.client, writer.database, by="cause", since="7d")
    assert columns == ["cause", "gpu_hours", "workflows", "top_workflows"]
    expected = sorted(((cause, sum(per_wf.values()) / 3600, per_wf) for cause, per_wf in data.waste.items()
                       if sum(per_wf.values()) > 0), key=lambda e: (-round(e[1], 3), e[0]))
    assert [r[0] for r in rows] == [cause for cause, _, _ in expected]
    for (cause, hours, workflows, top), (_, want, per_wf) in zip(rows, expected):
        assert hours == pytest.approx(want, abs=0.001)
        assert workflows == sum(1 for v in per_wf.values() if v > 0)
        assert top[0] == max(per_wf, key=per_wf.get)
    # The planted zombie allocation: workflow 0 holds its GPUs at 0 % for the whole run: 15
    # minutes of start-up (it never got busy), then idle.
    idle = data.fleet.workflows[0]
    idle_row = next(r for r in rows if r[0] == "idle")
    assert idle_row[3][0] == idle.workflow_id
    assert data.waste["startup"][idle.workflow_id] == pytest.approx(len(idle.gpus) * 900)
    assert data.waste["idle"][idle.workflow_id] == pytest.approx(len(idle.gpus) * 300)


def test_opportunities_by_team_framework_gpu_model_and_antipattern(writer, data):
    _, rows = opportunities(writer.client, writer.database, by="team", since="all", limit=100)
    by_team = defaultdict(float)
    for cause, per_wf in data.waste.items():
        for wf, seconds in per_wf.items():
            by_team[(data.fleet.workflow(wf).team, cause)] += seconds
    assert {(team, cause): hours for team, cause, hours, _, _ in rows} == pytest.approx(
        {k: round(v / 3600, 3) for k, v in by_team.items() if v > 0}, abs=0.001)

    losing = [
        w for w in data.fleet.workflows if any(per_wf.get(w.workflow_id, 0) > 0 for per_wf in data.waste.values())
    ]
    assert 0 < len(losing) < len(data.fleet.workflows)  # the busy ones lose nothing
    _, rows = opportunities(writer.client, writer.database, by="framework", since="all", limit=100)
    assert {r[0] for r in rows} == {data.frameworks[w.workflow_id] for w in losing}

    for by, want in (("model", {f"model-{w.workflow_id[-1]}" for w in losing}),
                     ("cluster", {"east" if w.gpus[0].host < "gpu-host-002" else "west" for w in losing})):
        _, rows = opportunities(writer.client, writer.database, by=by, since="all", limit=100)
        assert {r[0] for r in rows} == want
        assert sum(r[2] for r in rows if r[1] == "idle") == pytest.approx(
            sum(data.waste["idle"].values()) / 3600, abs=0.002)

    _, rows = opportunities(writer.client, writer.database, by="gpu-model", since="all", limit=100)
    assert {r[0] for r in rows} == {
        s["gpu_model"] for s in data.samples if data.fleet.workflow(s["workflow_id"]) in losing
    }

    _, rows = opportunities(writer.client, writer.database, by="antipattern", since="all")
    assert [(r[0], r[1]) for r in rows] == [("antipattern:input_pipeline_stall", 1.5),
                                             ("antipattern:launch_bound", 0.25)]


def test_since_limits_the_period_and_is_parsed_strictly(writer):
    assert opportunities(writer.client, writer.database, since="1m")[1] == []
    assert parse_since("7d") == 7 * 86400 and parse_since("all") is None
    with pytest.raises(ValueError, match="--since"):
        parse_since("a week")


@pytest.mark.parametrize("by", ["cause", "team", "workflow", "regression", "right-size", "gpu-model"])
def test_every_grouping_answers_on_tables_with_nothing_in_them(chdb_client, database, by):
    """A new deployment has its tables and no loss yet: each grouping answers with no rows and
    the columns it names when there are rows (chdb names none for an empty result)."""
    ClickHouseWriter(chdb_client, database).ensure_tables()
    columns, rows = opportunities(chdb_client, database, by=by, since="all")
    assert rows == [] and columns[-3:] == ["gpu_hours", "workflows", "top_workflows"]
    assert columns[0] == {"regression": "workflow", "cause": "cause", "right-size": "cause"}.get(by, by)
