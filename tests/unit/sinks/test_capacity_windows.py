"""Capacity no job held (the agents' ``unallocated`` and ``idle`` pseudo-workflows) is kept in
``capacity_windows``, where no sum over the jobs' rows can pick it up: an analyst's own
``sum(gpu_seconds) FROM workflow_windows`` is the allocated GPU-seconds."""

from datetime import UTC, datetime

import pytest

from gpufleet.reports.fleet import gather
from gpufleet.reports.goodput import fleet_goodput
from sinks.clickhouse_ddl import CAPACITY_WINDOWS_TABLE, KAFKA_COLUMNS, WORKFLOW_WINDOWS_TABLE
from sinks.write_clickhouse import ClickHouseWriter, Row
from tests.support.samples import BASE_MS, window

JOB = window(workflow_id="wf-a", gpu_seconds=120.0)
FREE = [window(workflow_id="unallocated", owner=None, team=None, gpu_seconds=60.0, energy_joules=6000.0),
        window(workflow_id="idle", owner=None, team=None, gpu_seconds=30.0, energy_joules=3000.0,
               window_start=BASE_MS + 60_000, window_end=BASE_MS + 120_000)]


def sums(client, database: str, table: str) -> dict[str, float]:
    return dict(client.query(f"SELECT workflow_id, sum(gpu_seconds) FROM {database}.{table} FINAL "
                             "GROUP BY workflow_id").result_rows)


@pytest.fixture
def writer(chdb_client, database) -> ClickHouseWriter:
    w = ClickHouseWriter(chdb_client, database)
    w.ensure_tables()
    return w


def test_an_analysts_sum_of_the_windows_is_the_allocated_hours(writer):
    rows = [Row(0, 7, FREE[0], "wf", "id"), Row(0, 8, JOB, "wf", "id"), Row(1, 3, FREE[1], "wf", "id")]
    assert writer.insert(WORKFLOW_WINDOWS_TABLE, rows) == []
    assert sums(writer.client, writer.database, "workflow_windows") == {"wf-a": 120.0}
    assert sums(writer.client, writer.database, "capacity_windows") == {"unallocated": 60.0, "idle": 30.0}
    for view, want in (("goodput_hourly", 120.0), ("goodput_daily", 120.0), ("capacity_daily", 90.0)):
        (got,), = writer.client.query(f"SELECT sum(gpu_seconds) FROM {writer.database}.{view}").result_rows
        assert got == pytest.approx(want), view
    kept = writer.client.query(f"SELECT workflow_id, kafka_partition, kafka_offset FROM {writer.database}."
                               "capacity_windows ORDER BY workflow_id").result_rows
    assert kept == [("idle", 1, 3), ("unallocated", 0, 7)]  # each row keeps where it came from
    # The sink resumes from the jobs' rows: a batch whose capacity rows landed and whose jobs'
    # did not is read again, and the capacity rows collapse (ReplacingMergeTree).
    assert writer.insert(WORKFLOW_WINDOWS_TABLE, rows) == []
    assert sums(writer.client, writer.database, "capacity_windows") == {"unallocated": 60.0, "idle": 30.0}


def test_every_report_still_tells_capacity_beside_allocation(writer):
    writer.insert(WORKFLOW_WINDOWS_TABLE, [Row(0, i, r) for i, r in enumerate([JOB, *FREE])])
    fleet, groups = fleet_goodput(writer.client, writer.database, since="all")
    assert fleet.allocated.gpu_seconds == pytest.approx(120.0)
    assert fleet.unallocated.gpu_seconds == pytest.approx(90.0)
    assert [(g.key, g.allocated.gpu_seconds) for g in groups] == [("", pytest.approx(120.0))]
    numbers = gather(writer.client, writer.database, "all")
    assert numbers["unallocated_gpu_hours"] == pytest.approx(90.0 / 3600)


def test_a_database_of_the_previous_release_moves_its_capacity_out_of_the_jobs_windows(chdb_client, database):
    """Before capacity_windows, the pseudo-workflows' windows were rows of workflow_windows:
    migration 4 moves them (and only them), and running it again changes nothing."""
    writer = ClickHouseWriter(chdb_client, database)
    writer.ensure_tables()
    columns = ["workflow_id", "owner", "team", "window_start", "window_end", "gpu_seconds", "closed_at"]
    times = ("window_start", "window_end", "closed_at")
    old = [[datetime.fromtimestamp(r[c] / 1000, UTC) if c in times else r[c] for c in columns] + [0, i]
           for i, r in enumerate((JOB, *FREE))]
    chdb_client.insert(f"{database}.workflow_windows", old, column_names=[*columns, *KAFKA_COLUMNS[:2]])
    chdb_client.command(f"ALTER TABLE {database}.schema_migrations DELETE WHERE version = 4 "
                        "SETTINGS mutations_sync = 2")
    chdb_client.command(f"TRUNCATE TABLE {database}.{CAPACITY_WINDOWS_TABLE.name}")
    for _ in range(2):
        writer.ensure_tables()
        assert sums(chdb_client, database, "workflow_windows") == {"wf-a": 120.0}
        assert sums(chdb_client, database, "capacity_windows") == {"unallocated": 60.0, "idle": 30.0}
