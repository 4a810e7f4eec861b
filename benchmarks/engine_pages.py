"""Serving engines' metrics pages as large as the engines make them, for the agent's benchmarks:
the reading's cost grows with the page it is sent (``bench_agent_serving.py``)."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "serving"


def vllm_page() -> str:
    """A vLLM endpoint as large as vLLM makes it: the documented metrics, and 14 histograms of 25
    buckets each (vLLM's latency and token histograms), for one model."""
    page = (DATA / "vllm-0.6.prom").read_text()
    label = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
    for h in range(14):
        name = f"vllm:histogram_{h}_seconds"
        page += f"# HELP {name} A latency histogram.\n# TYPE {name} histogram\n"
        page += "".join(f'{name}_bucket{{le="{2 ** (b - 10):g}",{label}}} {b * 7}.0\n' for b in range(24))
        page += f'{name}_bucket{{le="+Inf",{label}}} 200.0\n{name}_count{{{label}}} 200.0\n{name}_sum{{{label}}} 31.5\n'
    return page


def tgi_page(max_total_tokens: int = 4096) -> str:
    """A TGI endpoint as TGI 2.x's router makes it (its ``server.rs`` sets each histogram's buckets):
    the histograms of durations 35 buckets each (a geometric series from 0.15 ms), the batch's
    durations per method (prefill, decode), the requests' input length and generated and maximum
    new tokens 100 buckets each, and the next batch's size 1,024; then its counters and gauges.
    The whole page is sent whatever is asked: no ``name[]``."""
    out: list[str] = []

    def histogram(name: str, buckets: list[float], label_sets: tuple[str, ...] = ("",)) -> None:
        out.append(f"# TYPE {name} histogram")
        for labels in label_sets:
            inner = f"{labels}," if labels else ""
            out.extend(f'{name}_bucket{{{inner}le="{b:g}"}} {min(i * 40, 5000)}' for i, b in enumerate(buckets))
            out.append(f'{name}_bucket{{{inner}le="+Inf"}} 5000')
            braces = f"{{{labels}}}" if labels else ""
            out.extend([f"{name}_sum{braces} 7431.25", f"{name}_count{braces} 5000"])

    durations = [0.0001 * 1.5 ** (i + 1) for i in range(35)]
    tokens = [max_total_tokens / 100 * (i + 1) for i in range(100)]
    for name in ("tgi_request_duration", "tgi_request_validation_duration", "tgi_request_queue_duration",
                 "tgi_request_inference_duration", "tgi_request_mean_time_per_token_duration"):
        histogram(name, durations)
    for name in ("tgi_batch_forward_duration", "tgi_batch_decode_duration", "tgi_batch_filter_duration",
                 "tgi_batch_inference_duration"):
        histogram(name, durations, ('method="prefill"', 'method="decode"'))
    histogram("tgi_batch_concat_duration", durations, ('method="decode"',))
    for name in ("tgi_request_input_length", "tgi_request_generated_tokens", "tgi_request_max_new_tokens"):
        histogram(name, tokens)
    histogram("tgi_batch_next_size", [float(i + 1) for i in range(1024)])
    for name, kind, value in (("tgi_request_count", "counter", 5010), ("tgi_request_success", "counter", 5000),
                              ("tgi_request_failure", "counter", 10), ("tgi_queue_size", "gauge", 3),
                              ("tgi_batch_current_size", "gauge", 16), ("tgi_batch_current_max_tokens", "gauge", 9000)):
        out += [f"# TYPE {name} {kind}", f"{name} {value}"]
    return "\n".join(out) + "\n"
