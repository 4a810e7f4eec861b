"""The host agent's Prometheus metrics: its own health, and each GPU's latest reading, so a site
that scrapes dcgm-exporter today can scrape the agent instead.

Health: ``gpufleet_agent_tick_seconds`` (what one tick cost: NVML, processes, host counters,
spooling), ``gpufleet_agent_spool_records`` (records waiting to be sent),
``gpufleet_agent_spool_dropped_total`` (records the spool dropped when full), and, once a
forwarder is attached, ``gpufleet_agent_records_sent_total`` and
``gpufleet_agent_records_refused_total`` (records the brokers refused for good); with serving
endpoints, ``gpufleet_agent_serving_errors_total`` (readings that failed, by endpoint and reason).

GPUs: ``gpufleet_gpu_utilization_percent``, ``_memory_used_bytes``, ``_power_watts``,
``_temperature_celsius``, ``_sm_active_percent``, ``_tensor_active_percent``, labelled with
``host``, ``gpu`` (index), ``uuid``, ``model``, ``workflow``, ``owner`` and ``team``. The label
cardinality is bounded by the host: each scrape shows the latest tick only (a collector reads
it then), one series per GPU and workflow using it, so a workflow that leaves a GPU leaves no
series behind; readings the GPU does not have (SM activity before Hopper's GPM) are left out
rather than shown as 0.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

LABELS = ["host", "gpu", "uuid", "model", "workflow", "owner", "team"]
# metric name, help, the sample's field
GPU_READINGS = (
    ("gpufleet_gpu_utilization_percent", "GPU utilisation (NVML), latest tick", "utilization_pct"),
    ("gpufleet_gpu_memory_used_bytes", "GPU memory used, latest tick", "memory_used_bytes"),
    ("gpufleet_gpu_power_watts", "GPU power draw, latest tick", "power_watts"),
    ("gpufleet_gpu_temperature_celsius", "GPU temperature, latest tick", "temperature_c"),
    ("gpufleet_gpu_sm_active_percent", "SM activity (GPM, Hopper and later), latest tick", "sm_active_pct"),
    ("gpufleet_gpu_tensor_active_percent", "Tensor core activity (GPM), latest tick", "tensor_active_pct"),
)


class AgentMetrics(Collector):
    """The metrics of one ``HostAgent`` (``producers.agent.host_agent``), in a registry of their own;
    the agent calls ``ticked`` after each tick."""

    def __init__(self, spool, forwarder=None, serving=None) -> None:
        self.spool = spool
        self.forwarder = forwarder  # a producers.agent.spool.forward.Forwarder, for what it sent
        self.serving = serving  # a producers.serving.scrape.ServingReader, for its endpoints' failures
        self.latest: list[dict] = []  # replaced whole by each tick: a scrape reads one tick's samples
        self.registry = CollectorRegistry()
        self.tick_seconds = Histogram("gpufleet_agent_tick_seconds", "What one tick of the agent cost",
                                      registry=self.registry,
                                      buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
        self.registry.register(self)

    def ticked(self, samples: list[dict], seconds: float) -> None:
        self.latest = samples
        self.tick_seconds.observe(seconds)

    def collect(self):
        waiting = GaugeMetricFamily("gpufleet_agent_spool_records", "Records spooled, waiting to be sent")
        waiting.add_metric([], self.spool.pending())
        yield waiting
        yield CounterMetricFamily("gpufleet_agent_spool_dropped", "Records the spool dropped when full",
                                  value=self.spool.dropped)
        if self.forwarder is not None:
            yield CounterMetricFamily("gpufleet_agent_records_sent", "Spooled records sent to Kafka",
                                      value=self.forwarder.sent)
            yield CounterMetricFamily("gpufleet_agent_records_refused", "Records the brokers refused for good",
                                      value=self.forwarder.failed)
        if self.serving is not None:
            errors = CounterMetricFamily("gpufleet_agent_serving_errors", "Serving endpoint readings that failed, "
                                         "by endpoint and reason (unreachable, timeout, garbage, models)",
                                         labels=["endpoint", "reason"])
            for (url, reason), n in sorted(self.serving.failures().items()):
                errors.add_metric([url, reason], n)
            yield errors
        samples = self.latest
        for name, doc, field in GPU_READINGS:
            family = GaugeMetricFamily(name, doc, labels=LABELS)
            for s in samples:
                value = s.get(field)
                if value is not None:
                    family.add_metric([s["host"], str(s["gpu_index"]), s["gpu_uuid"], s.get("gpu_model") or "",
                                       s["workflow_id"], s.get("owner") or "", s.get("team") or ""], value)
            yield family
