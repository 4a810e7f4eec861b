"""The agent keeps sampling while Kafka is down for 20 s; every sample arrives once and in order."""

from __future__ import annotations

import threading
import time

from gpufleet.local import kafka as local_kafka
from kafka_client.admin import ensure_topics
from producers.agent.gpus.attribute_process import ProcessAttributor
from producers.agent.gpus.sample_nvml import NvmlSampler
from producers.agent.host_agent import AgentSettings, HostAgent
from producers.agent.run import run_agent
from producers.agent.spool.disk import Spool
from producers.agent.spool.forward import Forwarder
from schemas.sample_columns import rows_of
from schemas.topics import GPU_SAMPLES, HOST_SAMPLES
from tests.support.fake_nvml import FakeGpu, FakeNvml, FakeProcess
from tests.support.integration import CODEC, read_topic, running_sink, wait_until
from tests.support.proc_tree import make_process

OUTAGE_S = 20


def test_samples_survive_a_broker_outage(tmp_path, chdb_client, database):
    broker_dir = tmp_path / "kafka"
    broker = local_kafka.start(broker_dir)
    try:
        prefix = "outage."
        ensure_topics(broker.bootstrap, prefix=prefix)
        proc = tmp_path / "proc"
        make_process(proc, 11, {"GPUFLEET_WORKFLOW_ID": "wf-x"})
        make_process(proc, 12, {"GPUFLEET_WORKFLOW_ID": "wf-y"})
        nvml = NvmlSampler(FakeNvml([FakeGpu("GPU-0", processes=[FakeProcess(11, sm_util=50)]),
                                     FakeGpu("GPU-1", processes=[FakeProcess(12, sm_util=70)])]))
        nvml.open()
        spool = Spool(tmp_path / "spool", max_bytes=64 << 20, segment_bytes=1 << 20)
        agent = HostAgent(AgentSettings("node-1", interval_s=0.2, topic_prefix=prefix), spool, CODEC,
                          nvml=nvml, attributor=ProcessAttributor(proc=proc))
        stop = threading.Event()
        thread = threading.Thread(target=run_agent, args=(agent, Forwarder(spool, broker.bootstrap), stop),
                                  kwargs={"drain_timeout_s": 60}, daemon=True)
        thread.start()
        time.sleep(4)
        local_kafka.stop(broker_dir)
        down_from = time.time() * 1000
        ticks_before = agent.ticks
        time.sleep(OUTAGE_S)
        down_until = time.time() * 1000
        assert agent.ticks - ticks_before >= OUTAGE_S * 4, "the agent kept sampling while the broker was down"
        assert spool.pending() > 0
        local_kafka.start(broker_dir)
        time.sleep(4)
        stop.set()
        thread.join(90)
        assert not thread.is_alive()
        assert spool.pending() == 0 and spool.dropped == 0

        samples = [s for *_, n, r in read_topic(broker.bootstrap, prefix + GPU_SAMPLES.name, GPU_SAMPLES.partitions)
                   if n == "GpuSampleColumns" for s in rows_of(r)]
        assert len(samples) == agent.samples == 2 * agent.ticks
        for gpu in ("GPU-0", "GPU-1"):
            times = [s["event_time"] for s in samples if s["gpu_uuid"] == gpu]  # topic order per partition
            assert times == sorted(set(times)), f"{gpu}: samples out of order or doubled"
            assert len(times) == agent.ticks
            assert sum(1 for t in times if down_from <= t <= down_until) >= OUTAGE_S * 4
        hosts = [r for *_, n, r in read_topic(broker.bootstrap, prefix + HOST_SAMPLES.name, HOST_SAMPLES.partitions)
                 if n == "HostSample"]
        assert len(hosts) == agent.ticks

        # The agent's records land in ClickHouse: GPU samples (v2 fields), host samples, life cycle.
        with running_sink(broker.bootstrap, prefix, chdb_client, database):
            wait_until(lambda: chdb_client.query(f"SELECT count() FROM {database}.host_samples").result_rows[0][0]
                       == agent.ticks, 60, "host samples in ClickHouse")
            wait_until(lambda: chdb_client.query(f"SELECT count() FROM {database}.gpu_samples").result_rows[0][0]
                       == agent.samples, 60, "GPU samples in ClickHouse")
        rows = chdb_client.query(
            f"SELECT workflow_id, event, gpu_uuids FROM {database}.workflow_events FINAL ORDER BY workflow_id"
        ).result_rows
        assert rows == [("wf-x", "STARTED", ["GPU-0"]), ("wf-y", "STARTED", ["GPU-1"])]
        shares = chdb_client.query(
            f"SELECT DISTINCT workflow_id, share, power_limit_watts FROM {database}.gpu_samples ORDER BY workflow_id"
        ).result_rows
        assert shares == [("wf-x", 1.0, 400.0), ("wf-y", 1.0, 400.0)]
    finally:
        local_kafka.stop(broker_dir)
