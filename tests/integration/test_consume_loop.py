"""The consume loop every reading component shares (``kafka_client.consume_loop``), on the real
broker: consume errors are counted and logged instead of dropped, and the enforcer serves the
same Prometheus metrics as the other components."""

from __future__ import annotations

import subprocess
import sys
import threading

from confluent_kafka import Producer

from gpufleet.local.ports import free_port
from kafka_client.config import producer_config
from kafka_client.consume_loop import ConsumeLoop
from kafka_client.leave_group import leave_and_close
from kafka_client.metrics import ComponentMetrics
from schemas.topics import ENFORCEMENT
from tests.support.integration import wait_until
from tests.support.metrics import scrape, value


def test_a_consume_error_is_counted_and_logged(kafka, prefix, caplog):
    metrics = ComponentMetrics("test-loop")
    loop = ConsumeLoop(kafka.bootstrap, f"{prefix}g", [prefix + ENFORCEMENT.name, prefix + "no-such-topic"],
                       metrics, "test")
    loop.consumer.subscribe(loop.topics)
    stop = threading.Event()
    try:
        wait_until(lambda: loop.batch(stop, 10, 0.5) is not None and loop.consume_errors, 30,
                   "the consumer to report the missing topic")
    finally:
        leave_and_close(loop.consumer)
    assert "consume error (UNKNOWN_TOPIC_OR_PART)" in caplog.text
    from prometheus_client import generate_latest

    assert 'gpufleet_consume_errors_total{code="UNKNOWN_TOPIC_OR_PART",component="test-loop"}' in \
        generate_latest(metrics.registry).decode()


def test_the_enforcer_serves_the_same_metrics_as_every_component(kafka, prefix, tmp_path):
    policy = tmp_path / "enforcement.toml"
    policy.write_text('[[ladder]]\nname = "idle"\n')
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "enforce",
            "--bootstrap",
            kafka.bootstrap,
            "--topic-prefix",
            prefix,
            "--policy",
            str(policy),
            "--metrics-port",
            str(port),
            "--metrics-host",
            "127.0.0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        garbage = Producer(producer_config(kafka.bootstrap))
        garbage.produce(prefix + ENFORCEMENT.name, key=b"wf", value=b"not avro at all")
        garbage.flush(10)

        def page():
            try:
                p = scrape(port)
            except OSError:
                return None
            lagging = any(name == "gpufleet_consumer_lag" for name, _ in p)
            return p if lagging and value(p, "gpufleet_dead_letters_total", component="enforcer",
                                          kind="undecodable") else None

        metrics = wait_until(page, 60, "the enforcer's metrics: the dead letter, and its lag")
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert value(metrics, "gpufleet_records_in_total", component="enforcer", topic=prefix + ENFORCEMENT.name) == 1
    assert value(metrics, "gpufleet_records_out_total", component="enforcer",
                 topic=prefix + "gpufleet.dead-letters.v1") == 1
