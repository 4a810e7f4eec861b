"""Alibaba's public GenAI serving trace judged as the serving fleet it is: each container's GPU
samples with its traffic beside them (``tests.support.alibaba.traffic``, from ``qps.csv``),
through the window stage's step with the worker's defaults. Every figure is checked against a
computation from the CSV here: the replicas' GPU-seconds and idle GPU-seconds, their idle
windows, the idle-replica alerts and their episodes, the service's peak and the replicas it
needed. (Judged by its GPUs alone, the same trace alerted 138 of its 143 replicas, on exactly
the replicas that did the serving: ``benchmarks/replay_alibaba.py``.)"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from schemas.topics import ALERTS, DEAD_LETTERS, SERVING_WINDOWS
from streams.alerts.detectors import DEFAULTS
from streams.serving.service import load, replicas_needed
from tests.support.alibaba import DATA, MAX_INTERVAL_S, duty_cycles, gaps, qps, replay, requests_of, samples, traffic

pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"{DATA} is not here (it sits beside the checkout)")

WINDOW_S = 60
IDLE_MIN_S = DEFAULTS.default.idle_replica_min_s


@pytest.fixture(scope="module")
def fleet():
    series, rates = duty_cycles(None), qps()
    sent = replay(samples(series), traffic(series, rates))
    return series, rates, sent


def csv_windows(series, rates) -> dict[str, dict[int, tuple[float, float]]]:
    """From the CSV alone: each replica's windows, start (s) -> (GPU-seconds, requests)."""
    out: dict[str, dict[int, list[float]]] = {}
    for ip, points in series.items():
        windows = out.setdefault(f"ali-{ip[:12]}", defaultdict(lambda: [0.0, 0.0]))
        for (t, _), gap, requests in zip(points, gaps(points), requests_of(points, rates.get(ip, {}))):
            w = windows[t // WINDOW_S * WINDOW_S]
            w[0] += gap
            w[1] += requests
    return {wf: {s: tuple(v) for s, v in w.items()} for wf, w in out.items()}


def test_every_window_of_every_replica_is_judged_by_its_traffic_as_the_csv_says(fleet):
    series, rates, sent = fleet
    expected = csv_windows(series, rates)
    judged: dict[str, dict[int, dict]] = defaultdict(dict)
    for spec, r in sent:
        if spec is SERVING_WINDOWS:
            judged[r["workflow_id"]][r["window_start"] // 1000] = r
    assert [r for spec, r in sent if spec is DEAD_LETTERS] == []
    assert set(judged) == set(expected) and len(judged) == 143
    for wf, windows in expected.items():
        assert set(judged[wf]) == set(windows), wf
        for start, (gpu_s, requests) in windows.items():
            got = judged[wf][start]
            assert got["gpu_seconds"] == pytest.approx(gpu_s), (wf, start)
            assert got["requests"] == pytest.approx(requests), (wf, start)
            assert (got["state"] == "IDLE") == (requests == 0), (wf, start)
    idle = sum(g for w in expected.values() for g, r in w.values() if r == 0)
    assert sum(r["gpu_seconds"] for w in judged.values() for r in w.values() if r["state"] == "IDLE") == \
        pytest.approx(idle)


def stretches(series, rates) -> dict[str, list[tuple[int, int]]]:
    """From the CSV alone: each replica's stretches without a request while it ran, (from, to) in
    seconds, on the window grid: from its first sample, the end of the window of a request or its
    return after a gap in its samples (longer than any sample stands for), to the start of the
    window of its next request or the end of what its last sample before a gap stands for."""
    out = {}
    for ip, points in series.items():
        runs, begin = [], None
        served = requests_of(points, rates.get(ip, {}))
        for (t, _), n, nxt in zip(points, served, [*points[1:], None]):
            window = t // WINDOW_S * WINDOW_S
            begin = window if begin is None else begin
            if n > 0:
                if window > begin:
                    runs.append((begin, window))
                begin = window + WINDOW_S
            if nxt is None or nxt[0] - t > MAX_INTERVAL_S:  # its readings stop here, for a while or for good
                end = window + WINDOW_S
                if end > begin:
                    runs.append((begin, end))
                begin = None
        out[f"ali-{ip[:12]}"] = runs
    return out


def test_an_idle_replica_is_alerted_once_per_stretch_without_traffic_and_never_while_it_serves(fleet):
    series, rates, sent = fleet
    runs = stretches(series, rates)
    alerts = [a for spec, a in sent if spec is ALERTS]
    assert {a["detector"] for a in alerts} == {"idle_replica"}  # no GPU-usage judgement of a replica
    assert {a["service"] for a in alerts} == {"stable-diffusion"}  # (what the notifier tells them together by)
    firing = [a for a in alerts if a["status"] == "FIRING"]
    for a in firing:  # each at a window that ends a stretch of at least the minimum without a request
        end = a["window_end"] // 1000
        assert any(b <= end - IDLE_MIN_S and end <= e for b, e in runs[a["workflow_id"]]), a["alert_id"]
    long = {wf: [(b, e) for b, e in r if e - b >= IDLE_MIN_S + WINDOW_S] for wf, r in runs.items()}
    for wf, spans in long.items():  # each long stretch sees the replica's idle alert fire (or still firing)
        fired = sorted(a["window_end"] // 1000 for a in firing if a["workflow_id"] == wf)
        for b, e in spans:
            assert any(b < t <= e for t in fired), (wf, b, e)
    messages = Counter(a["workflow_id"] for a in firing if a["notify"])
    for wf, n in messages.items():
        assert n <= len(long[wf]), wf
    last = {}
    for a in alerts:
        last[a["alert_id"]] = a["status"]
    assert set(last.values()) == {"RESOLVED"}  # every replica's alert ends with it
    print(f"replicas alerted {len({a['workflow_id'] for a in firing})} of 143, messages {sum(messages.values())}, "
          f"long stretches {sum(map(len, long.values()))}")


def test_the_service_peak_and_the_replicas_it_needed_are_the_csvs(fleet):
    series, rates, sent = fleet
    windows = [r for spec, r in sent if spec is SERVING_WINDOWS]
    got = load("stable-diffusion", windows, span_ms=600_000, margin=0.2)
    expected = csv_windows(series, rates)
    spans: dict[int, list] = defaultdict(lambda: [0.0, set()])
    capacity = {}
    for wf, w in expected.items():
        for start, (_, requests) in w.items():
            spans[start // 600 * 600][0] += requests
            if requests:
                spans[start // 600 * 600][1].add(wf)
            if requests:  # (no queue in the trace: every window that served is within the target)
                capacity[wf] = max(capacity.get(wf, 0.0), requests / WINDOW_S)
    peak_start, (peak_requests, _) = max(spans.items(), key=lambda kv: (kv[1][0], -kv[0]))
    assert got.peak_start == peak_start * 1000
    assert got.peak_per_s == pytest.approx(peak_requests / 600)
    assert got.replicas == 143 and got.saturated_windows == 0
    assert got.replicas_needed == replicas_needed(list(capacity.values()), peak_requests / 600, 0.2)
    assert got.replicas_needed < got.replicas_at_peak <= got.replicas
    assert got.gpu_hours == pytest.approx(sum(g for w in expected.values() for g, _ in w.values()) / 3600)
    print(f"peak {got.peak_per_s:.2f} req/s with {got.replicas_at_peak} replicas held; needed "
          f"{got.replicas_needed}; {got.freed_gpu_hours:.0f} of {got.gpu_hours:.0f} GPU-hours held beyond them")
