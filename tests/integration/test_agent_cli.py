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


def test_the_agent_reads_a_serving_endpoint_beside_its_gpus(kafka, prefix, tmp_path):
    """`gpufleet agent --serving-endpoint`: the agent's ticks ask the engine's page at its rate and
    each two readings become a ServingSample on the GPU samples' topic, with the traffic between."""
    from tests.support.serving_pages import DATA, serve

    page, served = (DATA / "vllm-0.6.prom").read_text(), [0]
    stop = 'vllm:request_success_total{finished_reason="stop",model_name="meta-llama/Llama-3.1-8B-Instruct"}'

    def moving() -> bytes:  # 5 more requests finished at each reading
        served[0] += 1
        return page.replace(f"{stop} 990.0", f"{stop} {990 + 5 * served[0]}.0").encode()

    httpd = serve(moving)
    url = f"http://127.0.0.1:{httpd.server_address[1]}/metrics"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", "--data-dir", str(tmp_path), "agent", "--source", "sim",
         "--bootstrap", kafka.bootstrap, "--topic-prefix", prefix, "--interval", "0.2", "--hosts", "1",
         "--gpus-per-host", "2", "--workflows", "1", "--host", "gpu-host-000",
         "--serving-endpoint", f"0={url};service=sd-xl", "--serving-interval-s", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def serving():
            return [r for *_, n, r in read_topic(kafka.bootstrap, prefix + GPU_SAMPLES.name, GPU_SAMPLES.partitions)
                    if n == "ServingSample"]
        wait_until(lambda: len(serving()) >= 3 or proc.poll() is not None, 90, "three serving samples")
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        httpd.shutdown()
    assert proc.returncode == 0, out
    samples = serving()
    assert {(s["service"], s["engine"], s["host"]) for s in samples} == {("sd-xl", "vllm", "gpu-host-000")}
    # the traffic between two readings: 5 requests a reading, however many readings a sample spans
    assert all(s["requests"] > 0 and s["requests"] % 5 == 0 for s in samples)
    assert sum(s["requests"] for s in samples) <= 5 * served[0]
