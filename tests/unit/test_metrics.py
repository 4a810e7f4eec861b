"""Prometheus metrics: dead-letter reasons as a bounded label, consumer lag that forgets the
partitions a component no longer owns, and the agent's GPU readings, one tick at a time."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kafka_client.metrics import ComponentMetrics, reason_kind
from schemas.codec import Codec, CodecError
from schemas.validate_ids import ids_error
from schemas.validate_sample import validate_sample
from tests.support.agent import make_world
from tests.support.samples import sample


def decode_error(data: bytes) -> str:
    try:
        Codec().decode(data)
    except CodecError as exc:
        return str(exc)
    raise AssertionError("decoded")


def test_the_reasons_the_stages_give_fall_into_bounded_kinds():
    """Each reason as the code words it (never the text as a label: it names workflows and offsets)."""
    from streams.windows.batches import future_reason, late_reason

    assert reason_kind(decode_error(b"\x00\x00")) == "undecodable"
    assert reason_kind(decode_error(b"\x07abcdef")) == "undecodable"
    assert reason_kind(decode_error(b"\x00\x00\x00\x99\x99xx")) == "undecodable"
    assert reason_kind("expected GpuSample, got Alert") == "wrong_record_type"
    assert reason_kind("expected Alert on t.gpufleet.alerts.v1, got GpuSample") == "wrong_record_type"
    assert reason_kind(late_reason([1000], 0, 60_000, "wf-a", 10**7, 3, 3_600_000)) == "late"
    assert reason_kind(future_reason([10**13], "wf-a", 10**12, 300_000)) == "future"
    assert reason_kind(ids_error({"workflow_id": "", "owner": "a", "team": "b", "host": "h"})) == "bad_id"
    assert reason_kind(validate_sample(sample(utilization_pct=250.0))) == "impossible_value"
    assert reason_kind("ClickHouse refused the row (code 53): Type mismatch") == "refused_by_clickhouse"
    assert reason_kind("the notifier could not handle this alert: KeyError") == "handler_error"
    assert reason_kind("something nobody wrote yet") == "other"


def test_consumer_lag_forgets_partitions_no_longer_owned():
    metrics = ComponentMetrics("sink")

    def lag(topic, partition):
        return metrics.registry.get_sample_value("gpufleet_consumer_lag", {
            "component": "sink", "topic": topic, "partition": str(partition)})

    metrics.set_lag({("a", 0): 5, ("a", 1): 0})
    assert (lag("a", 0), lag("a", 1)) == (5.0, 0.0)
    metrics.set_lag({("a", 1): 7})  # partition 0 went to another consumer
    assert (lag("a", 0), lag("a", 1)) == (None, 7.0)
    metrics.dead_letter("sink", "expected Alert, got GpuSample")
    assert metrics.registry.get_sample_value("gpufleet_dead_letters_total", {
        "component": "sink", "stage": "sink", "kind": "wrong_record_type"}) == 1.0


def gpu_series(registry) -> dict[tuple, float]:
    return {(s.name, s.labels["uuid"], s.labels["workflow"]): s.value
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            if family.name.startswith("gpufleet_gpu_") for s in family.samples}


def test_the_agent_shows_each_gpus_latest_reading_and_no_series_of_a_workflow_gone(tmp_path):
    agent, spool, gpus, clock = make_world(tmp_path, metrics=True)
    metrics = agent.links.metrics
    agent.tick()
    series = gpu_series(metrics.registry)
    utilization = {(uuid, wf): v for (name, uuid, wf), v in series.items()
                   if name == "gpufleet_gpu_utilization_percent"}
    assert utilization[("GPU-1", "wf-a")] == 80.0 and ("GPU-0", "slurm-77") in utilization
    assert not any(name == "gpufleet_gpu_sm_active_percent" for name, _, _ in series)  # no GPM: not shown as 0
    gpus[0].processes = [p for p in gpus[0].processes if p.pid != 201]  # slurm-77 left GPU-0
    clock.t += 1
    agent.tick()
    assert not any(wf == "slurm-77" for _, _, wf in gpu_series(metrics.registry))
    registry = metrics.registry
    assert registry.get_sample_value("gpufleet_agent_tick_seconds_count") == 2.0
    assert registry.get_sample_value("gpufleet_agent_spool_records") == spool.pending() > 0
    assert registry.get_sample_value("gpufleet_agent_spool_dropped_total") == 0.0
    assert registry.get_sample_value("gpufleet_agent_records_sent_total") is None  # no forwarder yet
    metrics.forwarder = SimpleNamespace(sent=12, failed=1)  # what a forwarder reports, once there is one
    assert registry.get_sample_value("gpufleet_agent_records_sent_total") == 12.0
    assert registry.get_sample_value("gpufleet_agent_records_refused_total") == 1.0


def test_the_worker_registry_holds_every_stages_metrics():
    from streams import topology  # noqa: F401 -- every stage imported: their metrics registered once
    from streams.stages.io import METRICS

    names = {f.name for f in METRICS.registry.collect()}
    assert {"gpufleet_worker_samples", "gpufleet_windows_closed", "gpufleet_alerts", "gpufleet_records_in",
            "gpufleet_records_out", "gpufleet_consumer_lag", "gpufleet_dead_letters"} <= names
