"""A serving replica's windows in the goodput waterfall, judged by its traffic (``judged_windows``,
``sinks/ddl_workflows.py``), on the real embedded ClickHouse: a window that served requests is
productive whatever its GPUs' utilisation, one that served none is idle (an ``idle_replica`` in
the waste view), start-up stays start-up, and a training job's windows are as its GPUs said."""

from __future__ import annotations

import pytest

from gpufleet.reports.goodput import fleet_goodput
from schemas.goodput_buckets import BUCKETS
from sinks.write_clickhouse import ClickHouseWriter

START = 1_767_225_600_000  # 2026-01-01 00:00 UTC
# (workflow, minute, startup, idle, low_util, productive, unobserved); a serving state or None
WINDOWS = [
    ("replica-1", 0, 40.0, 20.0, 0.0, 0.0, 0.0, "IDLE"),  # loading the model, then no request
    ("replica-1", 1, 0.0, 10.0, 45.0, 5.0, 0.0, "BUSY"),  # 5 % utilisation, serving its traffic
    ("replica-1", 2, 0.0, 30.0, 20.0, 10.0, 0.0, "IDLE"),  # no request: all of it idle
    ("replica-1", 3, 0.0, 0.0, 30.0, 20.0, 10.0, "SATURATED"),  # serving, queue over target
    ("training-1", 0, 0.0, 12.0, 30.0, 18.0, 0.0, None),
]


@pytest.fixture
def stored(chdb_client, database):
    ClickHouseWriter(chdb_client, database).ensure_tables()
    for wf, minute, startup, idle, low, productive, unobserved, state in WINDOWS:
        start = START + minute * 60_000
        total = startup + idle + low + productive + unobserved
        chdb_client.command(f"""
            INSERT INTO {database}.workflow_windows
                (workflow_id, owner, team, window_start, window_end, gpu_count, gpu_seconds, version,
                 startup_gpu_seconds, idle_gpu_seconds, low_util_gpu_seconds, productive_gpu_seconds,
                 unobserved_gpu_seconds, idle_joules, low_util_joules, productive_joules)
            VALUES ('{wf}', 'ada', 'vision', fromUnixTimestamp64Milli({start}),
                    fromUnixTimestamp64Milli({start + 60_000}), 1, {total}, 1,
                    {startup}, {idle}, {low}, {productive}, {unobserved}, {idle * 100}, {low * 100},
                    {productive * 100})""")
        if state is not None:
            chdb_client.command(f"""
                INSERT INTO {database}.serving_windows
                    (workflow_id, service, window_start, window_end, gpu_count, gpu_seconds, state, closed_at)
                VALUES ('{wf}', 'chat', fromUnixTimestamp64Milli({start}), fromUnixTimestamp64Milli({start + 60_000}),
                        1, {total}, '{state}', now64(3))""")
    return chdb_client, database


def buckets_of(client, database, workflow):
    sums = ", ".join(f"sum({b}_gpu_seconds)" for b in BUCKETS)
    row = client.query(f"SELECT sum(gpu_seconds), {sums} FROM {database}.goodput_hourly "
                       f"WHERE workflow_id = '{workflow}'").result_rows[0]
    return row[0], dict(zip(BUCKETS, row[1:]))


def test_a_replica_is_productive_while_it_serves_and_idle_while_it_serves_nothing(stored):
    client, database = stored
    allocated, b = buckets_of(client, database, "replica-1")
    assert b["startup"] == 40.0  # as its GPUs said
    assert b["idle"] == 20.0 + 60.0  # window 0 after start-up, all of window 2
    assert b["productive"] == 60.0 + 50.0  # windows 1 and 3, whatever their utilisation
    assert b["low_util"] == 0.0 and b["input_bound"] == 0.0
    assert b["unobserved"] == 10.0
    assert sum(b.values()) == allocated  # each GPU-second in one bucket still
    joules = client.query(f"SELECT sum(idle_joules), sum(productive_joules) FROM {database}.judged_windows "
                          "WHERE workflow_id = 'replica-1'").result_rows[0]
    assert joules == (2000.0 + 6000.0, 6000.0 + 5000.0)


def test_a_training_job_is_judged_by_its_gpus(stored):
    client, database = stored
    allocated, b = buckets_of(client, database, "training-1")
    assert (b["idle"], b["low_util"], b["productive"]) == (12.0, 30.0, 18.0)
    assert sum(b.values()) == allocated


def test_the_waste_view_names_a_replicas_idle_time_and_sums_to_the_waterfalls(stored):
    client, database = stored
    causes = dict(client.query(f"SELECT cause, sum(gpu_seconds) FROM {database}.waste "
                               "WHERE workflow_id = 'replica-1' GROUP BY cause").result_rows)
    assert causes["idle_replica"] == 80.0 and causes["startup"] == 40.0
    assert causes.get("idle", 0.0) == 0.0 and causes.get("low_util", 0.0) == 0.0
    fleet, _ = fleet_goodput(client, database, since="all")
    wasted = sum(fleet.buckets[b].gpu_seconds for b in ("unhealthy", "startup", "idle", "input_bound", "low_util"))
    (total,) = client.query(f"SELECT sum(gpu_seconds) FROM {database}.waste "
                            "WHERE NOT startsWith(cause, 'antipattern:')").result_rows[0]
    assert total == pytest.approx(wasted)
