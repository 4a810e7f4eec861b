"""A service's load as the reports compute it (ClickHouse sums a service's windows into spans and
replicas: ``gpufleet.reports.serving.service_loads``) is the load the rule gives from the windows
themselves (``streams.serving.service.load``): the same replicas, peak, replicas needed, GPU-hours
held beyond them and idle tails, for any windows."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.reports.serving import STATES, service_loads
from sinks.clickhouse_ddl import SERVING_WINDOWS_TABLE
from sinks.write_clickhouse import ClickHouseWriter, Row
from streams.serving.service import load

BASE_MS = 1_764_000_000_000


@pytest.fixture(scope="module")
def writer(chdb_client):
    database = f"t_{uuid.uuid4().hex[:12]}"
    w = ClickHouseWriter(chdb_client, database)
    w.ensure_tables()
    yield w
    chdb_client.command(f"DROP DATABASE IF EXISTS {database}")


window = st.fixed_dictionaries({
    "service": st.sampled_from(["sd-xl", "chat"]), "replica": st.integers(0, 4), "minute": st.integers(0, 45),
    "requests": st.one_of(st.just(0.0), st.floats(0.5, 500.0)), "gpu_seconds": st.floats(1.0, 480.0),
    "state": st.sampled_from(STATES), "capacity_per_s": st.one_of(st.none(), st.floats(0.1, 10.0)),
    "owner": st.sampled_from(["ana", "bo"]),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(window, min_size=1, max_size=40, unique_by=lambda w: (w["replica"], w["minute"])),
       st.sampled_from([60, 300, 600]), st.floats(0.0, 1.0))
def test_the_reports_load_is_the_rules_load_from_the_windows(writer, windows, span_s, margin):
    client, database = writer.client, writer.database
    client.command(f"TRUNCATE TABLE {database}.serving_windows")
    records = [{"workflow_id": f"{w['service']}-{w['replica']}", "owner": w["owner"], "team": "llm",
                "service": w["service"], "engine": "vllm", "window_start": BASE_MS + w["minute"] * 60_000,
                "window_end": BASE_MS + (w["minute"] + 1) * 60_000, "gpu_count": 1, "gpu_seconds": w["gpu_seconds"],
                "utilization_mean_pct": 10.0, "requests": w["requests"], "requests_per_s": w["requests"] / 60,
                "tokens_per_s": None, "queue_time_ms": None, "ttft_ms": None, "waiting_max": None,
                "capacity_per_s": w["capacity_per_s"], "capacity_window_start": None, "capacity_windows": 1,
                "state": w["state"], "idle_since": None, "closed_at": BASE_MS + (w["minute"] + 2) * 60_000}
               for w in windows]
    assert writer.insert(SERVING_WINDOWS_TABLE, [Row(0, i, r) for i, r in enumerate(records)]) == []
    for key, groups in (("''", {""}), ("owner", {w["owner"] for w in windows})):
        got = service_loads(client, database, span_s=span_s, margin=margin, key=key)
        assert set(got) == groups
        for group, loads in got.items():
            mine = [r for r in records if key == "''" or r["owner"] == group]
            for s in loads:
                want = load(s.service, [r for r in mine if r["service"] == s.service], int(span_s * 1000), margin)
                assert (s.replicas, s.peak_start, s.replicas_at_peak, s.replicas_needed, s.saturated_windows,
                        s.idle_tails) == (want.replicas, want.peak_start, want.replicas_at_peak, want.replicas_needed,
                                          want.saturated_windows, want.idle_tails)
                assert (s.gpu_hours, s.idle_gpu_hours, s.peak_per_s, s.freed_gpu_hours) == pytest.approx(
                    (want.gpu_hours, want.idle_gpu_hours, want.peak_per_s, want.freed_gpu_hours), rel=1e-9, abs=1e-9)
            assert {s.service for s in loads} == {r["service"] for r in mine}
