"""Model FLOPs utilisation of a profiled rank: the FLOPs the profiler counted (with_flops=True),
by the precision of their inputs, against the GPU's dense peak from one table with its sources."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.analyze import analyze_file_with_findings, format_record
from producers.traces.read import read_trace
from schemas.codec import Codec
from schemas.gpu_peaks import PRECISIONS, peak_tflops
from tests.support.traces import cpu_op, kernel, runtime, write_trace

BF16 = ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar"]


def op(name: str, ts: float, flops: int, types: list[str] | None) -> dict:
    e = cpu_op(name, ts, 10.0)
    e["args"]["flops"] = flops
    if types is not None:
        e["args"]["Input type"] = types
    return e


def trace(tmp_path: Path, gpu: str = "NVIDIA H100 80GB HBM3") -> Path:
    """One second of GPU timeline (the first kernel starts at 0, the last ends at 1 s), with
    494.75 TFLOP counted at bf16, 1 TFLOP at fp32 and 1 without input types."""
    events = [
        runtime("cudaLaunchKernel", 0.0, 5.0, corr=1), kernel("ampere_bf16_gemm", 0.0, 400_000.0, corr=1),
        runtime("cudaLaunchKernel", 500_000.0, 5.0, corr=2), kernel("ampere_bf16_gemm", 600_000.0, 400_000.0, corr=2),
        op("aten::addmm", 1.0, 400_000_000_000_000, BF16), op("aten::mm", 2.0, 94_750_000_000_000, BF16),
        op("aten::mm", 3.0, 1_000_000_000_000, ["float", "float"]), op("aten::conv2d", 4.0, 1_000_000_000_000, None),
        op("aten::add", 5.0, 0, BF16),  # counted as no FLOPs: left out
    ]
    path = write_trace(tmp_path / "t.json", events)
    doc = json.loads(path.read_text())  # deviceProperties before the events, as the profiler writes them
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": gpu, "totalGlobalMem": 80 << 30}],
           **{k: v for k, v in doc.items() if k != "schemaVersion"}}
    path.write_text(json.dumps(doc))
    return path


def test_the_reader_counts_flops_by_precision_and_names_the_gpu(tmp_path):
    t = read_trace(trace(tmp_path))
    assert t.flops == {"bf16": 494_750_000_000_000, "fp32": 1_000_000_000_000, "unknown": 1_000_000_000_000}
    assert t.gpu_name == "NVIDIA H100 80GB HBM3"


def test_mfu_is_the_flops_over_the_gpu_timeline_against_the_dense_peak(tmp_path):
    record, _ = analyze_file_with_findings(trace(tmp_path))
    assert record["model_flops_precision"] == "bf16" and record["peak_tflops"] == 989.5
    assert record["model_flops"] == 496_750_000_000_000
    # 496.75 TFLOP in one second against 989.5 TFLOPS
    assert record["mfu_pct"] == pytest.approx(100 * 496.75 / 989.5)
    assert "MFU                50.20 % (496.750 TFLOP at bf16 against 989.5 TFLOPS" in format_record(record)
    _, decoded = Codec().decode(Codec().encode("TraceAnalysis", record))
    assert decoded["mfu_pct"] == record["mfu_pct"]


def test_without_a_known_peak_or_counted_flops_mfu_is_not_made_up(tmp_path):
    record, _ = analyze_file_with_findings(trace(tmp_path, gpu="NVIDIA Future GPU"))
    assert record["model_flops"] == 496_750_000_000_000 and record["mfu_pct"] is None
    assert "no peak known for NVIDIA Future GPU" in format_record(record)
    plain = write_trace(tmp_path / "plain.json", [kernel("k", 0.0, 10.0)])
    record, _ = analyze_file_with_findings(plain)
    assert record["model_flops"] is None and record["mfu_pct"] is None
    assert "the trace counts no FLOPs" in format_record(record)


def test_the_peak_table_names_its_source_and_matches_the_most_specific_model():
    raw = json.loads((Path(__file__).resolve().parents[4] / "schemas" / "gpu_peaks.json").read_text())
    for g in raw["gpus"]:
        assert g["source"] and set(g["tflops"]) <= set(PRECISIONS), g["match"]
        assert all(v > 0 for v in g["tflops"].values())
    assert peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.5
    assert peak_tflops("NVIDIA H200", "fp8") == 1979.0
    assert peak_tflops("Tesla V100-SXM2-32GB", "bf16") is None  # Volta has no bf16
    assert peak_tflops(None, "bf16") is None


def test_a_window_gives_the_mfu_of_the_model_work_its_job_reported():
    from schemas.sample_columns import columns_of
    from streams.windows.batches import Incoming, WindowConfig
    from streams.windows.utilization import WindowAggregator
    from tests.support.samples import BASE_MS, sample

    def window(**extra) -> dict:
        agg = WindowAggregator(WindowConfig(), {}, {}, clock=lambda: BASE_MS + 10**9)
        samples = [sample(gpu_index=g, gpu_uuid=f"GPU-{g}", gpu_model=model, event_time=BASE_MS + t * 1000, **extra)
                   for t in range(60) for g, model in enumerate(["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"])]
        agg.process(0, [Incoming(i, b) for i, b in enumerate(columns_of(samples))], closed_at=0)
        (w,) = agg.advance(0, BASE_MS + 200_000, closed_at=0).closed
        return w

    # 247.375 TFLOPS on an H100 (989.5 at bf16) and on an A100 (312): (2 x 247.375) / (989.5 + 312)
    assert window(model_tflops=247.375)["model_mfu_pct"] == pytest.approx(100 * 494.75 / 1301.5)
    assert window()["model_mfu_pct"] is None  # the job reports nothing
