"""`gpufleet agent --source sim` as a process: it publishes, and SIGTERM sends everything before exit."""

from __future__ import annotations

import signal
import subprocess
import sys

from schemas.sample_columns import rows_of
from schemas.topics import GPU_SAMPLES, HOST_SAMPLES
from tests.support.integration import read_topic, wait_until


def test_sim_agent_publishes_and_flushes_on_sigterm(kafka, prefix, tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", "--data-dir", str(tmp_path), "agent", "--source", "sim",
         "--bootstrap", kafka.bootstrap, "--topic-prefix", prefix, "--interval", "0.2",
         "--hosts", "2", "--gpus-per-host", "4", "--workflows", "3", "--host", "gpu-host-001"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    # One host sample per tick, sent with the rest every 5 s: five on the topic, five ticks done.
    wait_until(lambda: len(read_topic(kafka.bootstrap, prefix + HOST_SAMPLES.name, HOST_SAMPLES.partitions)) >= 5
               or proc.poll() is not None, 60, "five ticks of the agent")
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    ticks = int(out.split("agent stopped after ")[1].split(" ticks")[0])
    assert ticks >= 5
    batches = [r for *_, n, r in read_topic(kafka.bootstrap, prefix + GPU_SAMPLES.name, GPU_SAMPLES.partitions)
               if n == "GpuSampleColumns"]
    samples = [s for b in batches for s in rows_of(b)]
    assert len(samples) == 4 * ticks and {s["host"] for s in samples} == {"gpu-host-001"}
    # Sent every 5 s (and at SIGTERM): each message holds a workflow's samples of many ticks.
    assert len(batches) < ticks and max(len(set(b["event_time"])) for b in batches) > 1
    hosts = read_topic(kafka.bootstrap, prefix + HOST_SAMPLES.name, HOST_SAMPLES.partitions)
    assert len(hosts) == ticks
