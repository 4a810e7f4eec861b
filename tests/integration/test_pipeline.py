"""The walking skeleton end to end: simulator -> Kafka -> worker process -> Kafka -> sink -> ClickHouse."""

from __future__ import annotations

import subprocess
import sys

import pytest

from producers.publish_kafka import Publisher
from producers.simulate.fleet import IDLE, UNDERUTILIZED, build_fleet
from producers.simulate.run import SimulationPlan, run_simulation
from producers.traces.publish import publish_trace
from schemas.topics import GPU_SAMPLES, WORKFLOW_WINDOWS, trace_id_of
from streams.profiling.auto import request_id_for
from tests.support.integration import CODEC, read_topic, running_sink, wait_until, worker_process
from tests.support.samples import BASE_MS, assert_window_matches, batch_samples, expected_windows
from tests.support.traces import HOOK_TRACE

WINDOWS = 3
TICKS = WINDOWS * 60 + 15  # 15 s more: the watermark (max - 10 s) passes the third window's end


@pytest.fixture
def sink(kafka, prefix, chdb_client, database):
    with running_sink(kafka.bootstrap, prefix, chdb_client, database) as sink:
        yield sink


# What a stalled job's agent saw during its profile: a starved GPU, a saturated host CPU.
STALLED_HOST = {"ticks": 30, "span_ms": 3000, "interval_ms_mean": 100.0, "gpus": 1, "gpu_utilization_mean_pct": 4.0,
                "gpu_zero_utilization_share": 0.9, "sm_active_mean_pct": 2.0, "power_mean_watts": 110.0,
                "memory_peak_fraction": 0.01, "workflow_cpu_mean_pct": 99.0, "host_cpu_mean_pct": 97.0,
                "host_iowait_mean_pct": 0.0}


def q(sink, sql):
    return sink.writer.client.query(sql.format(db=sink.writer.database)).result_rows


def test_samples_become_windows_and_alerts_in_clickhouse(kafka, prefix, sink, tmp_path):
    fleet = build_fleet(seed=21, hosts=3, gpus_per_host=4, workflows=6)
    plan = SimulationPlan(start_ms=BASE_MS, ticks=TICKS, interval_ms=1000, speed=0)
    progress = run_simulation(fleet, plan, Publisher(kafka.bootstrap, CODEC), topic=prefix + GPU_SAMPLES.name)
    published = [s for t in range(TICKS) for s in fleet.samples_at(t, BASE_MS, 1000)]
    assert progress.samples == len(published) == TICKS * fleet.gpu_count

    # Three minutes of data: let violations fire after one window instead of their 5-10 minutes.
    with worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker", "--detector-min-s", "60",
                        "--startup-max-s", "60") as worker:
        n_windows = len(fleet.workflows) * WINDOWS
        wait_until(lambda: q(sink, "SELECT count() FROM {db}.workflow_windows FINAL")[0][0] >= n_windows,
                   120, f"{n_windows} windows in ClickHouse")
        wait_until(lambda: q(sink, "SELECT count() FROM {db}.gpu_samples")[0][0] >= len(published),
                   60, "every sample in ClickHouse")

        # The closed loop: a firing low-utilisation alert asked for a profile. Here the test plays
        # the stalled job's agent and answers with a trace our hook recorded on an H200, and what
        # the agent saw meanwhile (a saturated CPU): the alert comes back with what was found.
        wait_until(
            lambda: q(sink, "SELECT count() FROM {db}.profile_requests WHERE reason = 'AUTO'")[0][0] >= 1,
            30,
            "automatic profiles",
        )
        (workflow, request_id), *_ = q(sink, "SELECT workflow_id, request_id FROM {db}.profile_requests FINAL "
                                             "WHERE reason = 'AUTO' ORDER BY workflow_id")
        publish_trace(HOOK_TRACE, workflow, Publisher(kafka.bootstrap, CODEC), prefix,
                      trace_id_of(request_id, "host-x", 0), system=STALLED_HOST)
        wait_until(lambda: q(sink, "SELECT count() FROM {db}.alerts FINAL WHERE root_cause IS NOT NULL")[0][0] >= 1,
                   60, "the root cause in the alert")
        assert worker.poll() is None
    (alert_id, profile, root_cause, rules, message), = q(
        sink, "SELECT alert_id, profile_request_id, root_cause, findings.rule, message FROM {db}.alerts FINAL "
              "WHERE root_cause IS NOT NULL")
    assert alert_id.startswith(f"low_utilization:{workflow}:") and profile == request_id
    assert rules == ["low_utilization_chunks", "cpu_bound_input", "launch_bound"]
    assert root_cause.startswith("GPU idle 99 % of the profiled time") and message.endswith(root_cause)
    assert ("Meanwhile the host agents measured GPU utilisation 4 %, SM activity 2 %, host CPU 97 %, I/O wait 0 % "
            "(30 samples, one every 100 ms).") in root_cause
    assert q(sink, "SELECT system_ticks, system_host_cpu_mean_pct FROM {db}.trace_analyses FINAL "
                   f"WHERE trace_id = '{trace_id_of(request_id, 'host-x', 0)}'") == [(30, 97.0)]
    # The analysis and findings of the profile's trace are stored, joined to the alert by request id.
    assert q(sink, "SELECT count() FROM {db}.findings FINAL WHERE trace_id LIKE concat('profile/', "
                   "(SELECT profile_request_id FROM {db}.alerts FINAL WHERE root_cause IS NOT NULL), '/%')")[0][0] == 3

    # Nothing lost, nothing doubled; each workflow's samples of a host tick came in one message.
    rows, positions, points = q(sink, "SELECT count(), uniqExact(kafka_partition, kafka_offset), "
                                      "uniqExact(workflow_id, gpu_uuid, event_time) FROM {db}.gpu_samples")[0]
    assert rows == points == len(published)
    assert positions == sum(len(batch_samples(list(fleet.samples_at(t, BASE_MS, 1000)))) for t in range(TICKS))
    # The workflows' samples were spread over several partitions, and all their windows closed.
    assert q(sink, "SELECT uniqExact(kafka_partition) FROM {db}.gpu_samples")[0][0] > 1

    # Every window equals the aggregate computed directly from what was published.
    seen = [CODEC.decode(CODEC.encode("GpuSample", s))[1] for s in published]  # float32 on the wire
    expected = {k: v for k, v in expected_windows(seen).items() if k[1] < BASE_MS + WINDOWS * 60_000}
    on_topic = [r for *_, name, r in read_topic(kafka.bootstrap, prefix + WORKFLOW_WINDOWS.name,
                                                WORKFLOW_WINDOWS.partitions) if name == "WorkflowWindow"]
    keys = [(w["workflow_id"], w["window_start"]) for w in on_topic]
    assert sorted(keys) == sorted(expected), "each closed window emitted exactly once"
    for w in on_topic:
        assert_window_matches(w, expected[(w["workflow_id"], w["window_start"])])
    stored = q(sink, "SELECT workflow_id, toUnixTimestamp64Milli(window_start), sample_count, "
                     "utilization_mean_pct FROM {db}.workflow_windows FINAL")
    for wf, start, n, util in stored:
        assert n == expected[(wf, start)]["sample_count"]
        assert util == pytest.approx(expected[(wf, start)]["utilization_mean_pct"], rel=1e-6)

    # Alerts for exactly the wasteful workflows: low utilisation for the underutilised one,
    # idle-but-allocated for the idle one (one alert for its one cause, not low utilisation as
    # well); one episode each, still firing.
    expected = {(w.workflow_id, "low_utilization") for w in fleet.workflows if w.profile is UNDERUTILIZED}
    expected |= {(w.workflow_id, "idle_allocated") for w in fleet.workflows if w.profile is IDLE}
    alerts = q(sink, "SELECT workflow_id, detector, status, severity, notify FROM {db}.alerts FINAL")
    assert {(wf, d) for wf, d, *_ in alerts} == expected and len(alerts) == len(expected)
    assert all(status == "FIRING" and notify for _, _, status, _, notify in alerts)
    assert {sev for wf, d, _, sev, _ in alerts if d == "low_utilization"} == {"CRITICAL"}  # ~12 %
    assert q(sink, "SELECT count() FROM {db}.dead_letters")[0][0] == 0

    # Each workflow with a firing low-utilisation alert was profiled automatically, once, linked to its alert.
    requests = q(sink, "SELECT workflow_id, reason, requester, request_id FROM {db}.profile_requests FINAL "
                       "WHERE reason = 'AUTO'")
    low = {wf for wf, d in expected if d == "low_utilization"}
    assert sorted(wf for wf, *_ in requests) == sorted(low)
    assert all(reason == "AUTO" and requester.startswith("low_utilization:") and request_id == request_id_for(requester)
               for _, reason, requester, request_id in requests)


def test_the_worker_makes_its_data_directory_and_its_parents(kafka, prefix, tmp_path):
    """A --data-dir that does not exist yet (a fresh host) is made, as the other commands do;
    Faust made only the last folder and the worker ended in a traceback."""
    data = tmp_path / "not" / "yet"
    proc = subprocess.Popen([sys.executable, "-m", "gpufleet", "--data-dir", str(data), "--log-level", "info", "worker",
                             "--bootstrap", kafka.bootstrap, "--topic-prefix", prefix, "--app-id", f"{prefix}w2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: (data / "worker").is_dir() and any((data / "worker").iterdir()) or proc.poll() is not None,
                   120, "the worker to make its data directory and start")
        assert proc.poll() is None
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert "Traceback" not in out, out[-3000:]
