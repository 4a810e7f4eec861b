"""The owner-facing commands' queries on the embedded ClickHouse, on data written by the sink's writer."""

from gpufleet.workflows import list_workflows, workflow_timeline
from sinks.clickhouse_ddl import ALERTS_TABLE, WORKFLOW_WINDOWS_TABLE
from sinks.write_clickhouse import ClickHouseWriter, Row
from tests.integration.test_notifier import alert
from tests.unit.samples import BASE_MS, window

MIN = 60_000


def test_list_and_timeline(chdb_client, database):
    writer = ClickHouseWriter(chdb_client, database)
    writer.ensure_tables()
    rows = []
    for m in range(3):
        rows.append(Row(0, m, window(workflow_id="wf-1", window_start=BASE_MS + m * MIN,
                                     window_end=BASE_MS + (m + 1) * MIN, utilization_mean_pct=10.0 + m,
                                     gpu_seconds=120.0, wasted_gpu_seconds=100.0)))
        rows.append(Row(0, 10 + m, window(workflow_id="wf-2", owner="bo", window_start=BASE_MS + m * MIN,
                                          window_end=BASE_MS + (m + 1) * MIN, utilization_mean_pct=90.0,
                                          gpu_seconds=60.0, wasted_gpu_seconds=6.0)))
    assert writer.insert(WORKFLOW_WINDOWS_TABLE, rows) == []
    fired = {**alert("a1", "FIRING", True, "nlp", "alice@example.com"), "window_end": BASE_MS + 2 * MIN}
    assert writer.insert(ALERTS_TABLE, [Row(0, 0, fired)]) == []

    columns, listed = list_workflows(chdb_client, database)
    by = {r[0]: dict(zip(columns, r)) for r in listed}
    assert [r[0] for r in listed] == ["wf-1", "wf-2"]  # most waste first
    assert by["wf-1"]["util_now_pct"] == 12.0 and by["wf-1"]["util_pct"] == 11.0
    assert by["wf-1"]["wasted_gpu_hours"] == round(300 / 3600, 2) and by["wf-1"]["firing_alerts"] == "low_utilization"
    assert by["wf-2"]["firing_alerts"] == "" and by["wf-2"]["owner"] == "bo"

    columns, timeline = workflow_timeline(chdb_client, database, "wf-1")
    assert [r[columns.index("util_pct")] for r in timeline] == [10.0, 11.0, 12.0]
    assert [r[columns.index("alerts")] for r in timeline] == ["", "low_utilization FIRING", ""]
    assert workflow_timeline(chdb_client, database, "x' OR 1=1 --")[1] == []
