"""The trace analysis benchmark's measure of memory: each side's own peak, in a fresh process,
whatever the size of the benchmark that starts it (docs/benchmarks.md's "of HTA's memory")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_trace_analysis

    return bench_trace_analysis


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="the peak is read from /proc")
def test_a_childs_peak_is_its_own_not_the_benchmarks(bench, tmp_path):
    """Linux keeps a process's high-water mark across exec: a child's ``ru_maxrss`` starts from
    the size of the process that forked it. The benchmark holding 200 MiB must not make a small
    program look 200 MiB large, nor hide what a large one takes."""
    trace = tmp_path / "t.json"
    trace.write_text("{}")
    held = bytearray(200 * 2**20)  # the benchmark, grown (its HTA results, its traces)
    _, _, _, small, error = bench.measure(sys.executable, "print('{}')", trace, ROOT)
    assert not error and small < 100
    _, _, _, large, error = bench.measure(sys.executable, "x = bytearray(300 * 2**20)\nprint('{}')", trace, ROOT)
    assert not error and large >= 300
    assert held[-1] == 0


def test_a_failing_program_is_named_by_its_error_not_its_peak_line(bench, tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text("{}")
    result, _, _, peak, error = bench.measure(sys.executable, "print(1 / 0)", trace, ROOT)
    assert result is None and error == "ZeroDivisionError: division by zero" and peak > 0
