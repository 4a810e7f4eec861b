"""Helpers for integration tests: run the worker as a real process, read topics, wait on deadlines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kafka_client.config import consumer_config
from kafka_client.leave_group import leave_and_close
from schemas.codec import Codec
from schemas.topics import TopicSpec
from sinks.consume_to_clickhouse import ClickHouseSink
from sinks.write_clickhouse import ClickHouseWriter

CODEC = Codec()


class Hook(BaseHTTPRequestHandler):
    """A webhook receiver: the alerts it was sent, in ``received`` (reset it per test)."""

    received: ClassVar[list] = []

    def do_POST(self):
        Hook.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"])))["gpufleet_alert"])
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def start_notifier(bootstrap: str, prefix: str, tmp_path: Path) -> tuple[threading.Thread, threading.Event, object]:
    """``gpufleet notify`` for ``prefix``'s alerts in a thread, routing every alert to a local
    webhook (``Hook.received``, emptied here); returns the thread, its stop event and the server."""
    from http.server import ThreadingHTTPServer

    from sinks.consume_alerts import AlertNotifier
    from sinks.route_alerts import load_routing

    Hook.received = []
    http = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    (tmp_path / "routing.toml").write_text(f'[default]\nwebhook = "http://127.0.0.1:{http.server_address[1]}/"\n')
    notifier = AlertNotifier(bootstrap, load_routing(tmp_path / "routing.toml"), tmp_path / "sent.log",
                             group_id=f"{prefix}notifier", topic_prefix=prefix)
    stop = threading.Event()
    thread = threading.Thread(target=notifier.run, args=(stop,), daemon=True)
    thread.start()
    return thread, stop, http


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.3):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def print_log_tail(log: Path, lines: int = 60) -> None:
    """The warnings and errors of a process's log, then its last ``lines`` lines."""
    text = log.read_text(errors="replace").splitlines() if log.exists() else []
    notable = [line for line in text if "WARNING" in line or "ERROR" in line or "Traceback" in line]
    print(f"--- {log}: {len(notable)} warnings and errors (last 40) ---", *notable[-40:],
          f"--- {log}: last {lines} lines ---", *text[-lines:], sep="\n")


@contextmanager
def worker_process(bootstrap: str, prefix: str, data_dir: Path, app_id: str,
                   *options: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """``gpufleet worker`` as its own process, as it runs in production (``env``: more
    environment variables, such as its Kafka credentials)."""
    log = data_dir / f"{app_id}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", "--data-dir", str(data_dir), "--log-level", "info",
         "worker", "--bootstrap", bootstrap, "--topic-prefix", prefix, "--app-id", app_id, *options],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    proc.log_path = log  # type: ignore[attr-defined]
    try:
        yield proc
    except BaseException:
        print_log_tail(log)  # pytest shows it with the failure: CI keeps no worker logs
        raise
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_until_it_dies(sink: ClickHouseSink, topic: str, within_s: float = 60.0) -> None:
    """``sink``'s batches of ``topic`` until the test's fault stops it dead (``SystemExit``), then
    it leaves its group and closes (its partitions go to the next sink at once)."""
    sink.loop.consumer.subscribe([topic], on_assign=sink._on_assign)
    try:
        deadline = time.monotonic() + within_s  # the first batches may come up empty while the group forms
        while time.monotonic() < deadline:
            sink.run_batch(threading.Event())
        raise AssertionError(f"the sink was still running after {within_s:g} s")
    except SystemExit:
        pass
    finally:
        leave_and_close(sink.loop.consumer)


@contextmanager
def running_sink(bootstrap: str, prefix: str, client, database: str, sink_class: type[ClickHouseSink] = ClickHouseSink,
                 **options) -> Iterator[ClickHouseSink]:
    """The ClickHouse sink (or a test's subclass of it) consuming ``prefix``'s topics in a thread,
    stopped (and committed) on exit."""
    sink = sink_class(bootstrap, ClickHouseWriter(client, database), topic_prefix=prefix,
                      **{"group_id": f"{prefix}sink", "batch_wait_s": 0.3, **options})
    sink.writer.ensure_tables()  # before the thread starts: the test may query the tables at once
    stop = threading.Event()
    thread = threading.Thread(target=sink.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield sink
    finally:
        stop.set()
        thread.join(30)


def run_until(run: Callable[[threading.Event], object], until: Callable[[], object], timeout: float,
              what: str) -> None:
    """``run(stop)`` (a notifier's, an enforcer's loop) in a thread until ``until()`` holds,
    then stopped and joined."""
    stop = threading.Event()
    thread = threading.Thread(target=run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(until, timeout, what)
    finally:
        stop.set()
        thread.join(30)


def read_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 10.0, decode: bool = True) -> list[tuple]:
    """Every message on ``topic`` now: (partition, offset, key, schema name or None, record or raw bytes);
    ``decode=False``: the raw bytes of each."""
    c = Consumer(consumer_config(bootstrap, "test-reader"))
    try:
        ends = {}
        tps = []
        listed = c.list_topics(topic, timeout=timeout).topics.get(topic)
        if listed is not None and listed.error is None and listed.partitions:
            partitions = len(listed.partitions)  # as created (a deployment's --partitions), maybe not as declared
        for p in range(partitions):
            low, high = _watermarks(c, TopicPartition(topic, p), timeout)
            if high > low:
                ends[p] = high
                tps.append(TopicPartition(topic, p, low))
        if not tps:
            return []
        c.assign(tps)
        out = []
        deadline = time.monotonic() + timeout
        done = {p: False for p in ends}
        while not all(done.values()) and time.monotonic() < deadline:
            for m in c.consume(num_messages=10_000, timeout=0.5):
                if m.error():
                    continue
                try:
                    name, record = CODEC.decode(m.value()) if decode else (None, m.value())
                except ValueError:
                    name, record = None, m.value()
                out.append((m.partition(), m.offset(), m.key(), name, record))
                if m.offset() + 1 >= ends[m.partition()]:
                    done[m.partition()] = True
        return out
    finally:
        c.close()


def _watermarks(consumer: Consumer, tp: TopicPartition, timeout: float) -> tuple[int, int]:
    """Low and high offsets, retried while a new topic's partitions have no leader yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return consumer.get_watermark_offsets(tp, timeout=timeout)
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# What a group's committed offsets are answered with while its coordinator is still chosen or loaded.
COORDINATOR_LOADING = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                       KafkaError.COORDINATOR_NOT_AVAILABLE}


def committed_everything(bootstrap: str, group: str, spec: TopicSpec, topic: str) -> bool:
    """True when ``group`` has committed the end offset of every partition of ``topic``."""
    c = Consumer(consumer_config(bootstrap, group))
    try:
        partitions = c.list_topics(topic, timeout=10).topics[topic].partitions  # as created, maybe not as declared
        tps = [TopicPartition(topic, p) for p in partitions]
        try:
            committed = c.committed(tps, timeout=10)
        except KafkaException as exc:
            # The group's coordinator still chosen or loading on a broker just started: asked again
            error = exc.args[0] if exc.args else None
            if error is not None and (error.retriable() or error.code() in COORDINATOR_LOADING):
                return False
            raise
        for tp in committed:
            high = c.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=10)[1]
            if high > 0 and tp.offset < high:
                return False
        return True
    finally:
        c.close()
