"""Roofline per operator: FLOPs and bytes from the trace, GPU time from the kernels each
operator launched, against the GPU's peaks (schemas/gpu_peaks.json)."""

from __future__ import annotations

import pytest

from gpufleet.analyze import analyze_file, run
from producers.traces.read import operator_bytes
from schemas.gpu_peaks import peak_memory_gbps, peak_tflops
from tests.support.traces import synthetic_operator_trace

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def operators(tmp_path_factory):
    path = synthetic_operator_trace(tmp_path_factory.mktemp("t") / "ops.json")
    return {o["name"]: o for o in analyze_file(path)["operators"]}


def test_each_operator_gets_the_kernels_launched_from_inside_it(operators):
    # aten::relu counts no FLOPs; aten::linear's kernel is its addmm's (the innermost operator
    # with FLOPs); aten::mm runs on another thread. 3 steps (the 4th, last, is dropped).
    assert set(operators) == {"aten::mm", "aten::addmm", "aten::add"}
    assert {name: o["calls"] for name, o in operators.items()} == {"aten::mm": 3, "aten::addmm": 3, "aten::add": 3}
    # The kernels' durations, rounded to whole microseconds as HTA's loading rules do.
    assert {name: o["gpu_time_us"] for name, o in operators.items()} == {
        "aten::mm": 3 * 343, "aten::addmm": 3 * 171, "aten::add": 3 * 100}


def test_a_large_matmul_is_compute_bound_and_measured_against_the_tensor_core_peak(operators):
    mm = operators["aten::mm"]
    flops, nbytes = 3 * 2 * 4096 ** 3, 3 * 3 * 4096 * 4096 * 2  # two bf16 inputs and the output, per call
    assert (mm["flops"], mm["bytes"], mm["precision"]) == (flops, nbytes, "bf16")
    assert mm["achieved_tflops"] == pytest.approx(flops / (3 * 343e-6) / 1e12)
    assert mm["intensity"] == pytest.approx(4096 / 3)
    assert mm["peak_tflops"] == peak_tflops(H100, "bf16") == 989.5 and mm["peak_gbps"] == peak_memory_gbps(H100)
    assert mm["bound"] == "compute" and mm["roof_tflops"] == 989.5
    assert mm["roof_pct"] == pytest.approx(100 * mm["achieved_tflops"] / 989.5)
    # At 70 % of 989.5 TFLOP/s the three calls would take flops / (0.7 * peak).
    assert mm["at_stake_us"] == pytest.approx(3 * 343 - flops / (0.7 * 989.5e12) * 1e6)


def test_an_elementwise_add_is_memory_bound(operators):
    add = operators["aten::add"]
    assert add["bytes"] == 3 * 3 * (1 << 24) * 4  # two fp32 inputs and the output (the scalar has no shape)
    assert add["intensity"] == pytest.approx(1 / 12)
    assert add["bound"] == "memory"
    assert add["roof_tflops"] == pytest.approx(add["intensity"] * 3350 / 1e3)
    assert add["achieved_gbps"] == pytest.approx(add["bytes"] / 300e-6 / 1e9)


def test_without_a_known_gpu_there_is_no_roof(tmp_path):
    ops = analyze_file(synthetic_operator_trace(tmp_path / "t.json", gpu="Some Future GPU"))["operators"]
    assert ops and all(o["peak_tflops"] is None and o["bound"] is None and o["at_stake_us"] == 0 for o in ops)


def test_bytes_of_an_operator_from_its_shapes():
    import msgspec

    def raw(x):
        return msgspec.Raw(msgspec.json.encode(x))

    assert operator_bytes("aten::addmm", raw([[64], [32, 128], [128, 64]]), ["float"] * 3) == 4 * (64 + 32 * 128
                                                                                                 + 128 * 64 + 32 * 64)
    assert operator_bytes("aten::conv2d", raw([[8, 3, 32, 32], [16, 3, 3, 3], []]), ["c10::Half", "c10::Half", ""]) \
        == 2 * (8 * 3 * 32 * 32 + 16 * 3 * 3 * 3)  # inputs only: a convolution's output shape needs its strides
    assert operator_bytes("aten::mm", msgspec.Raw(b""), ["float"]) is None  # no shapes recorded
    assert operator_bytes("aten::mm", raw([[2, -1]]), ["float"]) is None  # nothing usable


def test_the_roofline_is_printed(tmp_path):
    text, rc = run([str(synthetic_operator_trace(tmp_path / "t.json"))], as_json=False)
    assert rc == 0 and "roofline" in text and "aten::mm" in text and "compute" in text
