"""``gpufleet analyze``: what it prints and its exit status for traces that say little or nothing."""

from __future__ import annotations

from gpufleet.analyze import run
from tests.support.traces import cpu_op, kernel, runtime, step, write_trace


def _cpu_then_gpu(n: int = 100) -> list[dict]:
    """A step of CPU work, then kernels: a file cut in its first half holds no GPU event."""
    events = [step(1, 0, 10_000)] + [cpu_op("aten::add", 10 + i * 20, 5) for i in range(n)]
    events += [runtime("cudaLaunchKernel", 5000 + i * 20, 5, corr=i) for i in range(n)]
    events += [kernel("gemm", 5005 + i * 20, 10, corr=i) for i in range(n)]
    return events


def test_a_trace_cut_before_its_first_gpu_event_is_an_error_not_a_clean_bill(tmp_path):
    path = write_trace(tmp_path / "cut.json", _cpu_then_gpu(), kineto_layout=True)
    data = path.read_bytes()
    path.write_bytes(data[: data.find(b'"cudaLaunchKernel"')])
    text, rc = run([str(path)], as_json=False)
    assert rc == 1
    assert "no antipattern found" not in text
    assert "PARTIAL" in text and "no GPU activity was read before the damage" in text


def test_a_damaged_trace_with_gpu_data_is_analysed_and_exits_non_zero(tmp_path):
    path = write_trace(tmp_path / "cut.json", _cpu_then_gpu(), kineto_layout=True)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 2000])
    text, rc = run([str(path)], as_json=False)
    assert rc == 1 and "PARTIAL" in text and "findings:" in text


def test_a_complete_trace_without_gpu_events_says_so(tmp_path):
    path = write_trace(tmp_path / "cpu.json", [step(1, 0, 100), cpu_op("aten::add", 10, 5)])
    text, rc = run([str(path)], as_json=False)
    assert rc == 0
    assert "no GPU activity in this trace" in text and "no antipattern found" not in text


def test_a_file_that_is_not_a_trace_exits_non_zero_with_the_reason(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2, 3]")
    text, rc = run([str(path)], as_json=False)
    assert rc == 2 and "ERROR" in text and "the top level is an array" in text  # the user's file: a usage error


def test_a_healthy_trace_exits_zero(tmp_path):
    path = write_trace(tmp_path / "ok.json", _cpu_then_gpu())
    text, rc = run([str(path)], as_json=False)
    assert rc == 0 and "PARTIAL" not in text and "findings:" in text


def test_the_kernel_breakdown_is_printed_with_short_names(tmp_path):
    from streams.traces.kernel_type import short_kernel_name

    assert short_kernel_name("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float> >(at::native::"
                             "ReduceOp<float>)") == "at::native::reduce_kernel"
    assert short_kernel_name("Memcpy HtoD (Pageable -> Device)") == "Memcpy HtoD (Pageable -> Device)"
    assert short_kernel_name("x" * 100, width=10) == "x" * 9 + "…"
    text, _ = run([str(write_trace(tmp_path / "ok.json", _cpu_then_gpu()))], as_json=False)
    assert "GPU time by kernel type" in text and "COMPUTATION" in text
    assert "    COMP     100      1.000 ms      10.0 us  gemm" in text


def test_a_trace_whose_kernel_and_gpu_names_hold_escape_sequences_prints_them_escaped(tmp_path):
    """Before, the report printed a kernel's name with its escape sequence (the screen cleared)
    and its newline (a line of the trace's own: "Try: rm -rf ~")."""
    events = _cpu_then_gpu()
    for e in events:
        if e["cat"] == "kernel":
            e["name"] = "gemm\x1b[2J\nTry: rm -rf ~"
    path = write_trace(tmp_path / "evil.json", events, device_memory=80 << 30)
    text, rc = run([str(path)], as_json=False)
    assert rc == 0 and r"gemm\x1b[2J\nTry: rm -rf ~" in text
    assert "\x1b" not in text and not any(line.startswith("Try: rm") for line in text.splitlines())
