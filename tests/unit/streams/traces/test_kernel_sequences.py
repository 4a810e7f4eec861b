"""Frequent CUDA kernel sequences (``streams.traces.kernel_sequences``): equal to HTA's
``get_frequent_cuda_kernel_sequences`` on a real trace and on a built one, and the rules one by
one on small traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.analyze import analyze_file, run
from producers.traces.read import read_trace
from streams.traces import kernel_sequences as trace_kernel_sequences
from streams.traces.analyze import PENDING_HORIZON_US
from streams.traces.batch import EventBatch
from streams.traces.kernel_sequences import KernelSequences
from tests.support.traces import (
    SHARED_TRACES,
    cpu_op,
    kernel,
    kernel_sequence_trace,
    runtime,
    write_trace,
)

HTA_DATA = Path(__file__).resolve().parents[3] / "data" / "hta"


def sequences(path: Path, operators: list[str], batch: int = 4096) -> dict:
    """The operators' sequences in the trace, its events fed ``batch`` at a time."""
    ks = KernelSequences(operators, PENDING_HORIZON_US)
    for columns in read_trace(path, cpu_ops=True).events.column_chunks(batch):
        ks.add(EventBatch(*columns))
    return ks.result()


def as_hta(result: dict) -> dict:
    """gpufleet's sequences in HTA's terms: pattern -> (count, GPU time, CPU time)."""
    return {"|".join(s["sequence"]): (s["count"], s["gpu_us"], s["cpu_us"]) for s in result["top"]}


@pytest.mark.parametrize("name", ["simple_add__benchmark_result_493459_1694039959_trace", "kernel-sequences"])
def test_every_sequence_equals_hta(name, tmp_path, monkeypatch):
    """Every operator name stored with HTA's results (convolutions, batch norm forward and
    backward, in-place adds, linear layers, addmm): the same sequences, counts and times, or
    none where HTA finds none. The built trace has aten::linear_backward deeper in another
    thread (HTA counts only the matches at the smallest depth) and operators that start in the
    same microsecond as their parent. However the events are batched, the result is the same."""
    monkeypatch.setattr(trace_kernel_sequences, "TOP", 1000)
    if name == "kernel-sequences":
        path = kernel_sequence_trace(tmp_path / "kernel-sequences.json")
    else:
        path = SHARED_TRACES / f"{name}.json.gz"
        if not path.exists():
            pytest.skip(f"{path} is not here (shared/traces sits beside the checkout)")
    hta = json.loads((HTA_DATA / f"{name}.json").read_text())["kernel_sequences"]
    ours = sequences(path, list(hta))
    assert sequences(path, list(hta), batch=1) == sequences(path, list(hta), batch=7) == ours
    found = 0
    for operator, rows in hta.items():
        expected = {r["pattern"]: (r["count"], r["GPU kernel duration (us)"], r["CPU op duration (us)"])
                    for r in rows or []}
        assert as_hta(ours[operator]) == expected, operator
        # most frequent first, then by the pattern's text, as HTA orders them
        assert ["|".join(s["sequence"]) for s in ours[operator]["top"]] == [r["pattern"] for r in rows or []]
        found += len(expected)
    assert found >= 6  # (the comparison is not of empty results)


def test_resnet_traces_hta_fails_on_have_sequences(monkeypatch):
    """HTA 0.5.0's call graph fails on the ResNet traces (thread ids that are names); gpufleet
    finds the convolutions' sequences there, equal to a brute-force count: for every
    aten::conv2d, the GPU events of the calls made inside it on its thread, in start order."""
    path = SHARED_TRACES / "resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"
    if not path.exists():
        pytest.skip(f"{path} is not here (shared/traces sits beside the checkout)")
    monkeypatch.setattr(trace_kernel_sequences, "TOP", 1000)
    hta = json.loads((HTA_DATA / "resnet50_num_workers_0__worker0.1623143089861.json").read_text())
    assert "hta_error" in hta["kernel_sequences"]
    events = list(read_trace(path, cpu_ops=True).events)
    convs = [e for e in events if e["name"] == "aten::conv2d"]
    calls = [e for e in events if e["kind"] == "runtime" and e["correlation"] >= 0]
    gpu = {}
    for e in events:
        if e["stream"] >= 0 and e["correlation"] >= 0:
            gpu.setdefault(e["correlation"], []).append(e)
    expected: dict = {}
    for c in convs:
        launched = sorted((g for call in calls if call["tid"] == c["tid"] and c["ts"] <= call["ts"] < c["end"]
                           for g in gpu.get(call["correlation"], [])), key=lambda g: g["ts"])
        if len(launched) >= 3:
            row = expected.setdefault("|".join(["aten::conv2d", *(g["name"] for g in launched)]), [0, 0, 0])
            row[0] += 1
            row[1] += sum(g["dur"] for g in launched)
            row[2] += c["dur"]
    assert len(convs) == 5 * 53  # ResNet-50's convolutions in the 5 steps kept
    assert as_hta(sequences(path, ["aten::conv2d"])["aten::conv2d"]) == {k: tuple(v) for k, v in expected.items()}
    assert sum(v[0] for v in expected.values()) >= 50


def _op_with_kernels(name: str, ts: int, kernels: list[str], corr: int, tid: int = 1, gpu_at: int | None = None):
    """An operator launching ``kernels`` (one call each), their GPU events ``gpu_at`` on."""
    events = [{**cpu_op(name, ts, 10 * len(kernels) + 10), "tid": tid}]
    gpu_at = ts + 5 if gpu_at is None else gpu_at
    for i, k in enumerate(kernels):
        events.append({**runtime("cudaLaunchKernel", ts + 1 + 10 * i, 2, corr + i), "tid": tid})
        events.append(kernel(k, gpu_at + 10 * i, 5, corr=corr + i))
    return events


def test_a_match_inside_a_match_counts_once_and_short_sequences_not_at_all(tmp_path):
    events = [cpu_op("aten::linear", 0, 200),  # an outer match: its inner one and all its kernels
              *_op_with_kernels("aten::linear", 10, ["gemm", "bias", "relu"], corr=1),
              *_op_with_kernels("aten::linear", 300, ["gemm", "bias"], corr=10),  # two: too short
              *_op_with_kernels("aten::linear", 400, ["gemm", "bias", "relu"], corr=20)]
    result = sequences(write_trace(tmp_path / "t.json", events), ["aten::linear"])["aten::linear"]
    assert as_hta(result) == {"aten::linear|gemm|bias|relu": (2, 30, 200 + 40)}


def test_only_the_shallowest_matches_count(tmp_path):
    """A match one level down anywhere in the trace is not counted once one sits at the top."""
    events = [cpu_op("autograd", 0, 100), *_op_with_kernels("aten::mm_backward", 10, ["a", "b", "c"], corr=1),
              *_op_with_kernels("aten::mm", 200, ["x", "y", "z"], corr=10, tid=2)]
    result = sequences(write_trace(tmp_path / "t.json", events), ["aten::mm"])["aten::mm"]
    assert result["depth"] == 0 and as_hta(result) == {"aten::mm|x|y|z": (1, 15, 40)}


def test_kernels_that_start_after_their_operator_ended_are_its(tmp_path):
    """A busy GPU runs what an operator launched long after it returned; a trace cut before
    they ran still counts what came."""
    late = _op_with_kernels("aten::mm", 0, ["a", "b", "c"], corr=1, gpu_at=5000)
    events = [*late, cpu_op("aten::other", 100, 10), *_op_with_kernels("aten::mm", 200, ["a", "b", "c"], corr=10,
                                                                       gpu_at=6000)]
    path = write_trace(tmp_path / "t.json", events)
    assert as_hta(sequences(path, ["aten::mm"])["aten::mm"]) == {"aten::mm|a|b|c": (2, 30, 80)}
    cut = write_trace(tmp_path / "cut.json", [e for e in events if not (e["cat"] == "kernel" and e["ts"] >= 6010)])
    assert as_hta(sequences(cut, ["aten::mm"])["aten::mm"]) == {"aten::mm|a|b|c": (1, 15, 40)}


def test_calls_that_launch_nothing_hold_nothing_for_long(tmp_path):
    """Runtime calls with a correlation id and no GPU event (cudaGetDevice, ...) inside the
    matches: each match still counts its kernels, and what waits for their GPU events is let
    go a horizon later, so that a long trace holds only its recent matches."""
    events = []
    for n in range(50):
        t = n * 1_000_000  # a second apart: the 10 s horizon passes during the trace
        events += _op_with_kernels("aten::mm", t, ["a", "b", "c"], corr=100 * n + 1)
        events.append({**runtime("cudaGetDevice", t + 2, 1, 100 * n + 50), "tid": 1})
    ks = KernelSequences(["aten::mm"], PENDING_HORIZON_US)
    held = 0
    trace = read_trace(write_trace(tmp_path / "t.json", sorted(events, key=lambda e: e["ts"])), cpu_ops=True)
    for columns in trace.events.column_chunks(1):
        ks.add(EventBatch(*columns))
        held = max(held, len(ks.by_call))
    assert held <= 12  # a horizon's worth of cudaGetDevice calls, not all 50
    assert as_hta(ks.result()["aten::mm"]) == {"aten::mm|a|b|c": (50, 50 * 15, 50 * 40)}


def test_gpufleet_analyze_prints_the_sequences(tmp_path):
    path = kernel_sequence_trace(tmp_path / "t.json")
    text, rc = run([str(path)], as_json=False, kernel_sequences=["aten::linear", "aten::nothing"])
    assert rc == 0
    assert "kernel sequences of aten::linear: 6 distinct" in text
    assert "kernel sequences of aten::nothing: none of 3 or more GPU operations (no operator of that name)" in text
    record = analyze_file(path, kernel_sequences=["aten::linear"])
    assert record["kernel_sequences"]["aten::linear"]["top"][0]["count"] == 11
    assert "kernel_sequences" not in analyze_file(path)
