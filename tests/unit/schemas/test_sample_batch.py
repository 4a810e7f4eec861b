"""A workflow's samples of a host tick travel as one GpuSampleBatch message."""

from schemas.codec import Codec
from schemas.topics import GPU_SAMPLES, key_of
from schemas.validate_sample import samples_of
from tests.support.samples import BASE_MS, batch_samples, sample


def tick():
    return [sample(host=h, gpu_index=i, gpu_uuid=f"GPU-{h}-{i}", workflow_id=wf)
            for h, wf in (("h1", "wf-a"), ("h1", "wf-b"), ("h2", "wf-a")) for i in range(2)]


def test_samples_are_grouped_by_host_workflow_and_time():
    batches = batch_samples(tick() + [sample(host="h1", workflow_id="wf-a", event_time=BASE_MS + 1000)])
    assert [(b["host"], b["workflow_id"], b["event_time"], len(b["samples"])) for b in batches] == [
        ("h1", "wf-a", BASE_MS, 2), ("h1", "wf-b", BASE_MS, 2), ("h2", "wf-a", BASE_MS, 2),
        ("h1", "wf-a", BASE_MS + 1000, 1)]


def test_a_batch_round_trips_and_keeps_its_workflows_partition():
    codec = Codec()
    batch = batch_samples(tick())[0]
    name, decoded = codec.decode(codec.encode("GpuSampleBatch", batch))
    assert name == "GpuSampleBatch" and GPU_SAMPLES.carries(name)
    assert [s["gpu_uuid"] for s in decoded["samples"]] == ["GPU-h1-0", "GPU-h1-1"]
    assert key_of(GPU_SAMPLES, batch) == key_of(GPU_SAMPLES, batch["samples"][0]) == b"wf-a"


def test_each_sample_of_a_batch_is_checked_on_its_own():
    batch = batch_samples(tick())[0]
    batch["samples"][1] = {**batch["samples"][1], "utilization_pct": -3.0}
    batch["samples"].append({**batch["samples"][0], "workflow_id": "wf-z"})
    (first, ok), (_, bad), (_, stray) = samples_of("GpuSampleBatch", batch)
    assert ok is None and first["gpu_uuid"] == "GPU-h1-0"
    assert bad == "sample 1 of the batch: utilization_pct -3.0 is outside 0..100"
    assert stray == "sample 2 of a batch for workflow 'wf-a' belongs to 'wf-z'"
    assert samples_of("GpuSample", sample(utilization_pct=200.0))[0][1] == "utilization_pct 200.0 is outside 0..100"
