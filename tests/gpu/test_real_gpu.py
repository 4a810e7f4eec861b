"""The real NVML and CUDA paths, on a machine with NVIDIA GPUs (skipped elsewhere, so in CI).

Needs nvidia-ml-py, psutil and fastavro (the agent's records), and PyTorch with CUDA (the load
and the profiling hook); nothing of Kafka or ClickHouse. Run there with

    python -m pytest --noconftest -p no:cacheprovider tests/gpu -s

With ``GPUFLEET_GPU_CHECK_OUT=<dir>`` the profile trace captured on the GPU is kept there
(gzipped) for the trace-analysis tests.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from producers.agent.gpus.sample_nvml import NvmlSampler, NvmlUnavailable

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sampler():
    s = NvmlSampler()
    try:
        s.open()
    except NvmlUnavailable as exc:
        pytest.skip(f"no NVIDIA GPU here: {exc}")
    yield s
    s.close()


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _load(seconds: float, workflow: str) -> subprocess.Popen:
    from gpufleet.nvml_check import LOAD

    env = {**os.environ, "GPUFLEET_WORKFLOW_ID": workflow, "GPUFLEET_OWNER": "gpu-test", "GPUFLEET_TEAM": "infra"}
    return subprocess.Popen([sys.executable, "-c", LOAD, str(seconds)], env=env)


def test_agent_records_from_real_nvml_encode_and_attribute(sampler, tmp_path):
    """Real readings go through the agent's whole tick (attribution, batching, Avro, spool)."""
    if not _cuda():
        pytest.skip("PyTorch with CUDA is needed for the load")
    from producers.agent.host_agent import AgentSettings, HostAgent
    from producers.agent.spool.disk import Position, Spool
    from schemas.codec import Codec
    from schemas.sample_columns import samples_checked

    codec = Codec()
    spool = Spool(tmp_path / "spool")
    agent = HostAgent(AgentSettings(host="gpu-test-host", interval_s=1.0), spool, codec, nvml=sampler)
    load = _load(12, "gpu-test-load")  # ends well before the agent stops: its ENDED event is seen
    try:
        for _ in range(25):
            t0 = time.monotonic()
            agent.tick()
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
    finally:
        load.wait(60)
    records = spool.read(Position(0, 0), limit=100_000, max_bytes=1 << 30)
    decoded = Counter()
    samples, events, reasons = [], [], []
    for rec in records:
        name, record = codec.decode(rec.value)
        decoded[name] += 1
        if name in ("GpuSample", "GpuSampleBatch", "GpuSampleColumns"):
            for sample, reason in samples_checked(name, record):
                samples.append(sample)
                if reason:
                    reasons.append(reason)
        elif name == "WorkflowEvent":
            events.append(record)
    print(f"\nmessages by schema: {dict(decoded)}; samples {len(samples)}")
    print("one sample of the load:", next((s for s in samples if s["workflow_id"] == "gpu-test-load"), None))
    assert len(samples) == agent.samples > 0
    assert reasons == [], reasons[:5]
    ours = [s for s in samples if s["workflow_id"] == "gpu-test-load"]
    assert ours, f"the load was not attributed; workflows seen: {Counter(s['workflow_id'] for s in samples)}"
    assert max(s["utilization_pct"] for s in ours) > 0
    assert {s["owner"] for s in ours} == {"gpu-test"} and {s["team"] for s in ours} == {"infra"}
    kinds = {(e["workflow_id"], e["event"]) for e in events}
    assert ("gpu-test-load", "STARTED") in kinds
    assert ("gpu-test-load", "ENDED") in kinds
    started = next(e for e in events if e["workflow_id"] == "gpu-test-load" and e["event"] == "STARTED")
    assert started["framework"] == "pytorch" and started["framework_version"], started
    filled = {f for s in ours for f, v in s.items() if v is not None}
    print("fields with values:", sorted(filled))
    for f in ("power_watts", "energy_joules_total", "temperature_c", "sm_clock_mhz", "memory_used_bytes",
              "memory_total_bytes", "power_limit_watts", "sm_clock_max_mhz"):
        assert f in filled, f
    if any("H100" in s["gpu_model"] or "H200" in s["gpu_model"] for s in ours):
        # Hopper: the GPM metrics are there, and SM activity saw the matrix multiplies.
        assert {"sm_active_pct", "tensor_active_pct", "dram_bw_pct", "pcie_tx_bytes_per_s"} <= filled
        assert max(s["sm_active_pct"] for s in ours if s["sm_active_pct"] is not None) > 0


def test_profile_hook_captures_cuda_kernels(tmp_path):
    """The one-line hook in a CUDA training loop: a trace with kernels and ProfilerStep spans."""
    if not _cuda():
        pytest.skip("PyTorch with CUDA is needed")
    env = {**os.environ, "GPUFLEET_WORKFLOW_ID": "gpu-test-train", "GPUFLEET_PROFILE_DIR": str(tmp_path),
           "PYTHONUNBUFFERED": "1"}
    train = subprocess.Popen([sys.executable, str(ROOT / "tests/integration/small_training.py"), "--seconds", "90"],
                             env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert train.stdout.readline().strip() == "ready"
        hook = tmp_path / f"hook-{train.pid}.json"
        deadline = time.monotonic() + 30
        while not hook.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert json.loads(hook.read_text())["cuda"] is True
        (tmp_path / f"request-{train.pid}.json").write_text(json.dumps({"request_id": "gpu-test", "steps": 30}))
        trace = tmp_path / f"trace-gpu-test-{train.pid}.json"
        deadline = time.monotonic() + 60
        while not trace.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert trace.exists(), list(tmp_path.iterdir())
    finally:
        train.kill()
        train.wait()
    events = json.loads(trace.read_text())["traceEvents"]
    cats = Counter(e.get("cat") for e in events)
    steps = {e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
    print(f"\ntrace: {trace.stat().st_size} bytes, events by category {dict(cats)}, {len(steps)} steps")
    assert cats["kernel"] > 0 and cats["gpu_memcpy"] > 0
    assert len(steps) == 30
    out = os.environ.get("GPUFLEET_GPU_CHECK_OUT")
    if out:
        with trace.open("rb") as src, gzip.open(Path(out) / "hook-trace-h200.json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
