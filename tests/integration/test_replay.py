"""``gpufleet replay`` of Alibaba's GenAI serving trace (read from ``../shared/datasets``, never
copied) through the real broker, a worker process and the sink into ClickHouse: 16 containers
(the first by name) over the trace's first 6 hours. Every figure is checked against the CSV,
computed here: each replica's GPU-seconds and idle GPU-seconds, its idle windows, its idle-replica
alerts (each at the end of a stretch of 30 minutes or more without a request), every alert
resolved once the replay ends the replica, the idle replicas' and their start-up's GPU-hours as
`gpufleet opportunities` ranks them, and the service's peak and replicas needed."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict

import pytest

from gpufleet.reports.opportunities import opportunities
from gpufleet.reports.serving import services
from streams.alerts.detectors import DEFAULTS
from streams.serving.service import replicas_needed
from tests.support.alibaba import DATA, duty_cycles, gaps, qps, requests_of
from tests.support.integration import running_sink, wait_until, worker_process

pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"{DATA} is not here (it sits beside the checkout)")

CONTAINERS, HOURS, WINDOW_S = 16, 6, 60


@pytest.fixture
def sink(kafka, prefix, chdb_client, database):
    with running_sink(kafka.bootstrap, prefix, chdb_client, database) as sink:
        yield sink


def expected():
    """From the CSV alone: each replica's windows, start (s) -> (GPU-seconds, requests)."""
    series, rates = duty_cycles(HOURS), qps()
    out = {}
    for ip in sorted(series)[:CONTAINERS]:
        points = series[ip]
        windows = defaultdict(lambda: [0.0, 0.0])
        for (t, _), gap, n in zip(points, gaps(points), requests_of(points, rates.get(ip, {}))):
            windows[t // WINDOW_S * WINDOW_S][0] += gap
            windows[t // WINDOW_S * WINDOW_S][1] += n
        out[f"replay-{ip}"] = dict(windows)
    return out


def startups() -> dict[str, dict[int, float]]:
    """From the CSV alone, by the start-up rule (``streams.windows.goodput``): each replica's
    GPU-seconds before its GPU first reached 1 %, for at most 15 minutes, by window start."""
    out = {}
    for ip, points in sorted(duty_cycles(HOURS).items())[:CONTAINERS]:
        busy = next((t for t, duty in points if duty >= 1.0), None)
        end = points[0][0] + 900 if busy is None else min(points[0][0] + 900, busy)
        windows = defaultdict(float)
        for (t, _), gap in zip(points, gaps(points)):
            if t < end:
                windows[t // WINDOW_S * WINDOW_S] += gap
        out[f"replay-{ip}"] = dict(windows)
    return out


def test_a_recorded_serving_fleet_replayed_through_the_pipeline_is_judged_as_the_csv_says(
        kafka, prefix, sink, tmp_path):
    want = expected()
    q = lambda sql: sink.writer.client.query(sql.format(db=sink.writer.database)).result_rows
    with worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker", "--idle-partition-s", "5",
                        "--no-periodic-profiles") as worker:
        done = subprocess.run(
            [sys.executable, "-m", "gpufleet", "--data-dir", str(tmp_path), "replay", "--bootstrap", kafka.bootstrap,
             "--topic-prefix", prefix, "--alibaba", str(DATA), "--containers", str(CONTAINERS), "--hours", str(HOURS)],
            check=False, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        shift = int(re.search(r"times shifted by (\d+) s", done.stdout).group(1))
        assert "replayed:" in done.stdout
        windows = sum(map(len, want.values()))
        wait_until(lambda: q("SELECT count() FROM {db}.serving_windows FINAL")[0][0] >= windows, 240,
                   f"{windows} serving windows in ClickHouse")
        wait_until(lambda: q("SELECT count() FROM {db}.workflow_summaries FINAL")[0][0] >= CONTAINERS, 120,
                   "every replica ended and summarised")
        assert worker.poll() is None
    got = defaultdict(dict)
    for wf, start, gpu_s, requests, state in q(
            "SELECT workflow_id, toUnixTimestamp(window_start), gpu_seconds, requests, state "
            "FROM {db}.serving_windows FINAL"):
        got[wf][start - shift] = (gpu_s, requests, state)
    assert set(got) == set(want)
    idle_windows, idle_gpu_s, startup = 0, 0.0, startups()
    for wf, windows in want.items():
        assert set(got[wf]) == set(windows), wf
        for start, (gpu_s, requests) in windows.items():
            assert got[wf][start][0] == pytest.approx(gpu_s) and got[wf][start][1] == pytest.approx(requests)
            assert (got[wf][start][2] == "IDLE") == (requests == 0), (wf, start)
            idle_windows += requests == 0
            idle_gpu_s += gpu_s - startup[wf].get(start, 0.0) if requests == 0 else 0.0
    assert 0 < idle_windows < sum(map(len, want.values()))
    # Ranked beside training waste: a replica's causes are its start-up and the GPU time it held
    # for no traffic after it; a window that served wastes nothing, whatever the GPU's utilisation.
    columns, rows = opportunities(sink.writer.client, sink.writer.database, "cause", "all", 20)
    causes = {row[columns.index("cause")]: row[columns.index("gpu_hours")] for row in rows}
    assert set(causes) == {"idle_replica", "startup"}
    assert causes["idle_replica"] == pytest.approx(idle_gpu_s / 3600, abs=0.01)
    assert causes["startup"] == pytest.approx(sum(sum(w.values()) for w in startup.values()) / 3600, abs=0.01)

    # The alerts: only the replicas' own, each after 30 minutes without a request, all resolved.
    alerts = q("SELECT workflow_id, detector, status, toUnixTimestamp(window_end) FROM {db}.alert_transitions FINAL")
    assert {d for _, d, _, _ in alerts} == {"idle_replica"}
    idle_min = DEFAULTS.default.idle_replica_min_s
    for wf, _, status, end in alerts:
        if status == "FIRING":
            span = range(int(end - shift - idle_min) // WINDOW_S * WINDOW_S, int(end - shift), WINDOW_S)
            assert all(want[wf].get(s, (0, 0))[1] == 0 for s in span), (wf, end)
    assert {s for (s,) in q("SELECT status FROM {db}.alerts FINAL")} == {"RESOLVED"}

    # The service: its busiest 10 minutes and the replicas they needed.
    (load,) = services(sink.writer.client, sink.writer.database, "all", 600, 0.2)
    spans, capacity = defaultdict(float), {}
    for wf, windows in want.items():
        for start, (_, requests) in windows.items():
            spans[start // 600 * 600] += requests
            if requests:
                capacity[wf] = max(capacity.get(wf, 0.0), requests / WINDOW_S)
    assert load.service == "stable-diffusion" and load.replicas == CONTAINERS
    assert load.peak_per_s == pytest.approx(max(spans.values()) / 600)
    assert load.replicas_needed == replicas_needed(list(capacity.values()), max(spans.values()) / 600, 0.2)
    assert load.gpu_hours == pytest.approx(sum(g for w in want.values() for g, _ in w.values()) / 3600)
    # Each replica's time without a request at the end of the replay, as `gpufleet serving` names them.
    tails = {}
    for wf, windows in want.items():
        served = [s for s, (_, n) in windows.items() if n > 0]
        tails[wf] = (max(windows) + WINDOW_S - (max(served) + WINDOW_S if served else min(windows))) * 1000
    assert load.idle_tails == tails and any(ms >= 7_200_000 for ms in tails.values())
