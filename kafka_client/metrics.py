"""What each component tells Prometheus about itself (``prometheus-client``, the reference
client: exposition format, thread-safe counters, its own HTTP server).

Each component (worker, sink, notifier) has a ``ComponentMetrics`` in a registry of its own,
served on ``/metrics`` when its command is given a port (``--metrics-port``, off by default:
two components on one host would collide); several instances of a component in one process
(the tests) count into the same series. The same names serve every component, told apart by
the ``component`` label, so one dashboard query covers them all:

- ``gpufleet_records_in_total{component, topic}``, ``gpufleet_records_out_total{component, topic}``
- ``gpufleet_dead_letters_total{component, stage, kind}``: ``kind`` is one of ``REASON_KINDS``,
  never the reason's text (which names workflows and offsets: unbounded)
- ``gpufleet_consumer_lag{component, topic, partition}``: messages between the consumer's
  position and the end of each partition it owns; partitions it no longer owns are removed

The label values are bounded: topics and partitions are the deployment's, stages and kinds are
fixed here. Component-specific metrics are added where the component lives.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

# (kind, pattern of the reason's text), first match wins; anything else is "other".
REASON_KINDS: tuple[tuple[str, re.Pattern], ...] = tuple((kind, re.compile(pattern)) for kind, pattern in (
    ("undecodable", (r"^(empty message|message of \d+ bytes|not a gpufleet Avro|unknown schema id|corrupt |"
                    r"\d+ trailing bytes|cannot decode)")),
    ("wrong_record_type", r"^expected \S+ on .*, got |^expected \S+, got "),
    ("late", r" behind the watermark "),
    ("future", r" ahead of (the worker's clock|the time Kafka received them)"),
    ("refused_by_clickhouse", r"^ClickHouse refused the row"),
    ("bad_id", (r"^(workflow_id|owner|team|host|trace_id|request_id|gpu_uuid)\b.*"
               r"(not a string|is empty|characters|space|control character)")),
    ("impossible_value", r"(is outside|exceeds|is not finite|is negative)"),
    ("not_delivered", r"(webhook|e-mail|SMTP|refused the message)"),
    ("handler_error", r"could not handle"),
))


def reason_kind(reason: str) -> str:
    """The bounded kind of a dead letter's reason, for a metric label."""
    for kind, pattern in REASON_KINDS:
        if pattern.search(reason):
            return kind
    return "other"


class ComponentMetrics:
    """The metrics every component has, in a registry of the component's own."""

    def __init__(self, component: str) -> None:
        self.component = component
        self.registry = CollectorRegistry()
        r = self.registry
        self._in = Counter("gpufleet_records_in", "Records read, by topic", ["component", "topic"], registry=r)
        self._out = Counter("gpufleet_records_out", "Records written, by topic", ["component", "topic"],
                            registry=r)
        self._dead = Counter("gpufleet_dead_letters", "Records dead-lettered, by stage and kind of reason",
                             ["component", "stage", "kind"], registry=r)
        self._lag = Gauge("gpufleet_consumer_lag", "Messages between the consumer's position and the end "
                          "of each partition it owns", ["component", "topic", "partition"], registry=r)
        self._lagging: set[tuple[str, int]] = set()
        self._consume_errors = Counter("gpufleet_consume_errors", "Errors the Kafka consumer reported, by code",
                                       ["component", "code"], registry=r)

    # -- the common metrics -------------------------------------------------------------

    def records_in(self, topic: str, n: int = 1) -> None:
        self._in.labels(self.component, topic).inc(n)

    def records_out(self, topic: str, n: int = 1) -> None:
        self._out.labels(self.component, topic).inc(n)

    def dead_letter(self, stage: str, reason: str) -> None:
        self._dead.labels(self.component, stage, reason_kind(reason)).inc()

    def consume_error(self, code: str) -> None:
        self._consume_errors.labels(self.component, code).inc()

    def set_lag(self, lags: Mapping[tuple[str, int], int]) -> None:
        """The lag of every partition owned now; the series of those no longer owned go."""
        for topic, partition in self._lagging - set(lags):
            self._lag.remove(self.component, topic, str(partition))
        for (topic, partition), lag in lags.items():
            self._lag.labels(self.component, topic, str(partition)).set(lag)
        self._lagging = set(lags)

    # -- component-specific metrics, in the same registry ----------------------------------

    def counter(self, name: str, doc: str, labels: Iterable[str] = ()) -> Counter:
        return Counter(name, doc, list(labels), registry=self.registry)

    def histogram(self, name: str, doc: str, labels: Iterable[str] = (), buckets=Histogram.DEFAULT_BUCKETS
                  ) -> Histogram:
        return Histogram(name, doc, list(labels), registry=self.registry, buckets=buckets)


def serve(registry: CollectorRegistry, port: int | None, host: str = "0.0.0.0"):
    """``registry`` on ``http://host:port/metrics`` in a thread; nothing where ``port`` is 0 or
    None. Returns the server (``server_address`` has the port taken for port 0 ... in tests,
    give a free port), or None."""
    if not port:
        return None
    server, _thread = start_http_server(port, addr=host, registry=registry)
    log.info("metrics on http://%s:%d/metrics", host, server.server_address[1])
    return server


def consumer_lag(consumer) -> dict[tuple[str, int], int]:
    """A confluent-kafka consumer's lag per owned partition, from what it knows already (its
    position and the cached end of each partition: no request to the brokers)."""
    lags = {}
    try:
        for tp in consumer.position(consumer.assignment()):
            if tp.offset < 0:  # nothing read yet: its position is not known
                continue
            _, high = consumer.get_watermark_offsets(tp, cached=True)
            if high >= 0:
                lags[(tp.topic, tp.partition)] = max(0, high - tp.offset)
    except Exception as exc:  # noqa: BLE001 -- a closed or rebalancing consumer: no figure this time
        log.debug("consumer lag not known now: %s", exc)
    return lags
