"""GpuSampleColumns: samples column by column, checked a column at a time, and windows that
come out the same whichever way the samples travelled."""

import json
import math
import random

import pytest

from schemas import sample_columns
from schemas.codec import Codec
from schemas.sample_columns import (
    COLUMNS,
    NULLABLE,
    blocks_of,
    columns_of,
    merged,
    rows_of,
    samples_checked,
)
from schemas.topics import GPU_SAMPLES, key_of
from schemas.validate_sample import BOUNDS, validate_sample
from streams.windows.batches import Incoming, WindowConfig
from streams.windows.utilization import WindowAggregator
from tests.support.samples import BASE_MS, batch_samples, sample

CODEC = Codec()


def tick(t: int = 0, host: str = "h1", workflow: str = "wf-a", gpus: int = 3, **extra) -> list[dict]:
    return [sample(host=host, workflow_id=workflow, gpu_index=g, gpu_uuid=f"{host}-GPU-{g}",
                   event_time=BASE_MS + t * 1000, utilization_pct=10.0 * g, **extra) for g in range(gpus)]


def full(s: dict) -> dict:
    """A GpuSample as it decodes: every field, null where not reported."""
    return {**dict.fromkeys(NULLABLE), "xids": [], **s}


def test_blocks_are_per_host_workflow_tick_and_set_of_reported_fields():
    samples = tick(0) + tick(0, host="h2") + tick(1) + tick(1, sm_active_pct=40.0)[:1]
    blocks = columns_of(samples)
    assert [(b["host"], b["event_time"][0], len(b["event_time"])) for b in blocks] == [
        ("h1", BASE_MS, 3), ("h2", BASE_MS, 3), ("h1", BASE_MS + 1000, 3), ("h1", BASE_MS + 1000, 1)]
    assert blocks[2]["sm_active_pct"] is None and blocks[3]["sm_active_pct"] == [40.0]
    merged = columns_of(tick(0) + tick(1) + tick(2), per_tick=False, max_samples=4)
    assert [len(b["event_time"]) for b in merged] == [4, 4, 1]


@pytest.mark.parametrize("seed", range(20))
def test_merging_blocks_gives_the_blocks_of_their_samples(seed):
    """The forwarder merges the blocks of one send column by column: the same blocks as
    grouping their samples again, whichever hosts, ticks and reported fields they mix."""
    rng = random.Random(seed)
    samples = []
    for t in range(rng.randint(1, 6)):
        for host in rng.sample(["h1", "h2", "h3"], rng.randint(1, 3)):
            extra = {"sm_active_pct": 40.0} if rng.random() < 0.3 else {}
            samples += tick(t, host=host, gpus=rng.randint(1, 4), **extra)
    limit = rng.randint(1, 12)
    blocks = columns_of(samples)
    assert merged(blocks, limit) == columns_of(samples, per_tick=False, max_samples=limit)


def test_a_block_round_trips_through_avro_to_the_same_samples():
    samples = tick(0, share=0.5, xids=[79], rank=3) + tick(1, share=0.5, rank=3)
    for s in samples:
        s.setdefault("xids", [])
    (block,) = columns_of(samples, per_tick=False)
    name, decoded = CODEC.decode(CODEC.encode("GpuSampleColumns", block))
    assert name == "GpuSampleColumns" and GPU_SAMPLES.carries(name)
    assert key_of(GPU_SAMPLES, block) == b"wf-a"
    assert rows_of(decoded) == [full(s) for s in samples]
    # Fewer bytes than the same samples row by row.
    (batch,) = batch_samples(samples, per_tick=False)
    assert len(CODEC.encode("GpuSampleColumns", block)) < len(CODEC.encode("GpuSampleBatch", batch))


def test_a_valid_block_is_used_as_it_is():
    (block,) = columns_of(tick(0))
    blocks, reasons = blocks_of("GpuSampleColumns", block)
    assert blocks == [block] and blocks[0] is block and reasons == []


@pytest.mark.parametrize(
    "field,value,reason",
    [
        ("utilization_pct", -3.0, "sample 1 of the block: utilization_pct -3.0 is outside 0..100"),
        ("utilization_pct", math.nan, "sample 1 of the block: utilization_pct nan is outside 0..100"),
        ("power_watts", -1.0, "sample 1 of the block: power_watts -1.0 is negative"),
        (
            "memory_used_bytes",
            81 * 1024**3,
            "sample 1 of the block: memory_used_bytes 86973087744 exceeds memory_total_bytes 85899345920",
        ),
        ("interval_ms", 0, "sample 1 of the block: interval_ms 0 is outside 1..3600000"),
        (
            "event_time",
            1_700_000,
            "sample 1 of the block: event_time 1700000 is outside 2000-01-01..2299-12-31 (expected epoch milliseconds)",
        ),
    ],
)
def test_a_bad_sample_is_refused_with_its_reason_and_the_others_kept(field, value, reason):
    (block,) = columns_of(tick(0))
    block[field][1] = value
    blocks, reasons = blocks_of("GpuSampleColumns", block)
    assert reasons == [reason]
    (kept,) = blocks
    assert kept["gpu_uuid"] == ["h1-GPU-0", "h1-GPU-2"]


def edge_values(bounds):
    """Values just inside and just outside ``bounds``, and NaN: (value, allowed)."""
    inside = [bounds.low + 1 if bounds.low_open else bounds.low]
    outside = [bounds.low - 1, math.nan] + ([bounds.low] if bounds.low_open else [])
    if bounds.high != math.inf:
        inside.append(bounds.high)
        outside.append(bounds.high + 1)
    return [(v, True) for v in inside] + [(v, False) for v in outside]


def test_every_bounded_field_is_a_column():
    assert {b.field for b in BOUNDS} <= set(COLUMNS)


@pytest.mark.parametrize("bounds", BOUNDS, ids=lambda b: b.field)
def test_the_column_check_and_the_sample_check_agree_on_every_rule(bounds):
    """Both read BOUNDS: a rule added there applies to blocks and to single samples alike."""
    for value, allowed in edge_values(bounds):
        (block,) = columns_of(tick(0, share=0.5, model_tflops=100.0, allocator_peak_bytes=1 << 30,
                                   allocator_reserved_bytes=2 << 30, workflow_memory_bytes=1 << 33))
        block[bounds.field][1] = value
        per_sample = [validate_sample(s) for s in rows_of(block)]
        assert (per_sample[1] is None) is allowed, (value, per_sample[1])
        assert per_sample[0] is None and per_sample[2] is None
        assert sample_columns._passes(block) is allowed, value
        if not allowed:
            assert f"{bounds.field} {value} {bounds.says}" in per_sample[1]


def test_a_share_outside_0_1_is_refused():
    (block,) = columns_of(tick(0, share=0.5))
    block["share"][2] = 0.0
    assert blocks_of("GpuSampleColumns", block)[1] == ["sample 2 of the block: share 0.0 is outside (0, 1]"]


def test_a_block_whose_columns_disagree_is_refused_whole():
    (block,) = columns_of(tick(0))
    block["power_watts"] = block["power_watts"][:2]
    assert blocks_of("GpuSampleColumns", block) == (
        [], ["column power_watts has 2 values, event_time has 3: a block has one value per sample"])
    assert samples_checked("GpuSampleColumns", block) == [
        (None, "column power_watts has 2 values, event_time has 3: a block has one value per sample")]
    (block,) = columns_of(tick(0))
    block["workflow_id"] = ""
    assert blocks_of("GpuSampleColumns", block)[1] == [
        "empty workflow_id: the samples cannot be attributed to a workflow"]


def test_older_formats_become_blocks():
    samples = tick(0) + tick(1)
    (batch,) = batch_samples(samples, per_tick=False)
    batch["samples"][4] = {**batch["samples"][4], "utilization_pct": 101.0}
    blocks, reasons = blocks_of("GpuSampleBatch", CODEC.decode(CODEC.encode("GpuSampleBatch", batch))[1])
    assert reasons == ["sample 4 of the batch: utilization_pct 101.0 is outside 0..100"]
    assert [len(b["event_time"]) for b in blocks] == [5]
    blocks, reasons = blocks_of("GpuSample", full(samples[0]))
    assert reasons == [] and rows_of(blocks[0]) == [full(samples[0])]


def random_samples(rng: random.Random, seconds: int) -> list[dict]:
    """Two workflows on two hosts; shares, GPM fields on some GPUs only, throttling, faults,
    a GPU that reports no memory capacity."""
    out = []
    for t in range(seconds):
        for host in ("h1", "h2"):
            for g in range(4):
                extra = {}
                if g < 2:
                    extra.update(sm_active_pct=rng.uniform(0, 100), tensor_active_pct=rng.uniform(0, 100))
                if g == 3:
                    extra.update(share=rng.choice([0.25, 0.5, 1.0]), memory_total_bytes=0, memory_used_bytes=0)
                if rng.random() < 0.1:
                    extra.update(
                        clock_event_reasons=rng.choice([0x4, 0x1, 0x80]),
                        ecc_uncorrected_volatile=rng.randrange(3),
                        xids=[rng.choice([13, 79])],
                    )
                out.append(sample(host=host, workflow_id="wf-a" if g % 2 else "wf-b", gpu_index=g,
                                  gpu_uuid=f"{host}-GPU-{g}", event_time=BASE_MS + t * 1000,
                                  utilization_pct=float(rng.choice([0, 0, rng.randrange(101)])),
                                  workflow_cpu_pct=rng.uniform(0, 800), rank=g, **extra))
    return out


def windows(items: list[Incoming]) -> list[dict]:
    agg = WindowAggregator(WindowConfig(allowed_lateness_ms=10_000), {})
    closed = agg.process(0, items, closed_at=0).closed
    closed += agg.advance(0, BASE_MS + 10 * 60_000, closed_at=0).closed
    return sorted(closed, key=lambda w: (w["workflow_id"], w["window_start"]))


def test_blocks_give_the_windows_of_one_sample_at_a_time():
    samples = random_samples(random.Random(5), 150)
    one_by_one = windows([Incoming.row(i, s) for i, s in enumerate(samples)])
    # As the forwarder sends them (within the allowed lateness): every 7 s, so that some blocks
    # span two windows; a send holds one block per set of reported fields.
    per_send = 7 * 8
    blocks = [b for i in range(0, len(samples), per_send) for b in columns_of(samples[i:i + per_send], per_tick=False)]
    assert any(len({t // 60_000 for t in b["event_time"]}) == 2 for b in blocks)
    by_block = windows([Incoming(i, json.loads(json.dumps(b))) for i, b in enumerate(blocks)])
    assert len(by_block) == len(one_by_one) == 6
    for a, b in zip(by_block, one_by_one):
        assert a.keys() == b.keys()
        for k, v in b.items():
            assert a[k] == (pytest.approx(v, rel=1e-9) if isinstance(v, float) else v), k
    assert all(w["sm_active_mean_pct"] is not None and w["throttled_gpu_seconds"] > 0 for w in by_block)


def test_late_samples_of_a_block_are_reported_together():
    agg = WindowAggregator(WindowConfig(allowed_lateness_ms=0, update_horizon_ms=0), {})
    agg.process(0, [Incoming.row(0, sample(event_time=BASE_MS + 61_000))], closed_at=0)
    (block,) = columns_of(tick(0) + tick(62), per_tick=False)  # 3 in the closed window, 3 in the open one
    result = agg.process(0, [Incoming(1, block)], closed_at=0)
    ((item, reason),) = result.refused
    assert item.offset == 1 and reason.startswith(
        f"3 late samples: event times {BASE_MS}..{BASE_MS} fall in window [{BASE_MS}, {BASE_MS + 60_000})")
    assert agg.store["wf-a"].windows[str(BASE_MS + 60_000)]["n"] == 4


def test_samples_ahead_of_the_time_kafka_received_them_are_refused_with_one_reason():
    """The one judgement of event time (worker and sink): against the record's time, the
    broker's on the samples topic, never a host's own clock or the reader's."""
    from schemas.sample_columns import blocks_of
    from schemas.validate_sample import MAX_AHEAD_OF_KAFKA_MS

    (block,) = columns_of([sample(event_time=BASE_MS + t * 1000) for t in range(10)], per_tick=False)
    received = BASE_MS + 4000 - MAX_AHEAD_OF_KAFKA_MS  # ticks 5..9 are ahead of it by more than allowed
    kept, reasons = blocks_of("GpuSampleColumns", block, received)
    assert [b["event_time"] for b in kept] == [[BASE_MS + t * 1000 for t in range(5)]]
    (reason,) = reasons
    assert reason.startswith(f"5 sample(s) of workflow {block['workflow_id']} from host {block['host']} are ahead "
                             "of the time Kafka received them") and "by up to 305 s" in reason
    assert blocks_of("GpuSampleColumns", block, BASE_MS + 9000 - MAX_AHEAD_OF_KAFKA_MS) == ([block], [])
    assert blocks_of("GpuSampleColumns", block, None) == ([block], [])  # a record of unknown time: not judged
    year_ahead = {**block, "event_time": [t + 365 * 86_400_000 for t in block["event_time"]]}
    assert blocks_of("GpuSampleColumns", year_ahead, BASE_MS)[0] == []
