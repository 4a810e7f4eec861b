"""Operators scrape gpufleet's health from Prometheus: a worker process and a sink, each on its
own /metrics, while samples (and one undecodable message) flow through the real broker."""

from __future__ import annotations

from confluent_kafka import Producer

from gpufleet.local.ports import free_port
from kafka_client.config import producer_config
from kafka_client.metrics import serve
from producers.publish_kafka import Publisher
from producers.simulate.fleet import build_fleet
from producers.simulate.run import SimulationPlan, run_simulation
from schemas.topics import GPU_SAMPLES
from sinks.consume_to_clickhouse import METRICS as SINK_METRICS
from tests.support.integration import CODEC, running_sink, wait_until, worker_process
from tests.support.metrics import scrape, value
from tests.support.samples import BASE_MS

TICKS = 80  # the first window closes (watermark = newest - 10 s)






def test_the_worker_and_the_sink_report_their_health(kafka, prefix, chdb_client, database, tmp_path):
    fleet = build_fleet(seed=3, hosts=2, gpus_per_host=2, workflows=2)
    topic = prefix + GPU_SAMPLES.name
    run_simulation(fleet, SimulationPlan(start_ms=BASE_MS, ticks=TICKS, interval_ms=1000, speed=0),
                   Publisher(kafka.bootstrap, CODEC), topic=topic)
    garbage = Producer(producer_config(kafka.bootstrap))
    garbage.produce(topic, key=b"wf-x", value=b"not avro at all")
    garbage.flush(10)
    samples = TICKS * fleet.gpu_count

    port = free_port()
    with worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker", "--metrics-port", str(port)), \
            running_sink(kafka.bootstrap, prefix, chdb_client, database):
        sink_server = serve(SINK_METRICS.registry, free_port(), "127.0.0.1")
        try:
            worker = wait_until(lambda: (p := _page(port)) and value(p, "gpufleet_worker_samples_total") >= samples
                                and len(lags(p, topic)) == GPU_SAMPLES.partitions and sum(lags(p, topic)) == 0
                                and p, 120, "the worker's metrics to count every sample, with no lag left")
            sink = wait_until(lambda: (p := scrape(sink_server.server_address[1]))
                              and value(p, "gpufleet_sink_rows_total", table="gpu_samples") >= samples and p,
                              60, "the sink's metrics to count every row")
        finally:
            sink_server.shutdown()
    assert value(worker, "gpufleet_records_in_total", component="worker", topic=topic) >= samples / 2
    assert value(worker, "gpufleet_dead_letters_total", component="worker", kind="undecodable") == 1
    assert value(worker, "gpufleet_windows_closed_total") >= len(fleet.workflows)
    assert value(sink, "gpufleet_dead_letters_total", component="sink", kind="undecodable") >= 1
    assert value(sink, "gpufleet_sink_insert_seconds_count", table="gpu_samples") >= 1


def lags(page: dict, topic: str) -> list[float]:
    """The lag of each partition of ``topic`` on the page (the worker is alone: it owns them all)."""
    return [v for (n, ls), v in page.items() if n == "gpufleet_consumer_lag" and ("topic", topic) in ls]


def _page(port: int) -> dict | None:
    try:
        return scrape(port)
    except OSError:  # the worker is still starting
        return None
