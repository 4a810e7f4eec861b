"""Holistic Trace Analysis 0.5.0's results on a trace, as JSON: the reference data the tests
compare gpufleet's trace analysis with (``tests/data/hta/<trace>.json``).

    benchmarks/.venv-hta/bin/python benchmarks/hta_reference.py TRACE > tests/data/hta/NAME.json
    benchmarks/.venv-hta/bin/python benchmarks/hta_reference.py --add critical_path TRACE tests/data/hta/NAME.json

Runs in HTA's own virtualenv (``make bench-hta``), never in gpufleet's.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import tempfile
import warnings
from contextlib import contextmanager
from fractions import Fraction


def _clean(value):
    """JSON-able, NaN as None."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item"):
        return _clean(value.item())
    return value


def _rows(df) -> list[dict]:
    return [{k: _clean(v) for k, v in row.items()} for row in df.to_dict("records")]


def _temporal(a) -> dict:
    tb = a.get_temporal_breakdown(visualize=False).iloc[0]
    return {k: _clean(tb[k]) for k in ("kernel_time(us)", "idle_time(us)", "compute_time(us)", "non_compute_time(us)")}


def _overlap(a) -> float | None:
    overlap = a.get_comm_comp_overlap(visualize=False)
    return _clean(overlap.iloc[0]["comp_comm_overlap_pctg"]) if len(overlap) else None


def _idle(a) -> list[dict]:
    idle = a.get_idle_time_breakdown(visualize=False)
    return _rows((idle[0] if isinstance(idle, tuple) else idle)[["stream", "idle_category", "idle_time"]])


def _launch(a) -> dict:
    launch = a.get_cuda_kernel_launch_stats(visualize=False)[0]
    return {"launches": len(launch), "launch_delay_total": _clean(launch["launch_delay"].sum()),
            "launch_delay_max": _clean(launch["launch_delay"].max())}


def _kernel_breakdown(a) -> dict:
    kernel_types, kernels = a.get_gpu_kernel_breakdown(visualize=False)
    return {"kernel_types": _rows(kernel_types), "top_kernels": _rows(kernels)}


def _memory_bw(a) -> list[dict] | None:
    summary = a.get_memory_bw_summary()
    if summary is None:
        return None
    summary.columns = [c[1] for c in summary.columns]  # ("memory_bw_gbps", "mean") -> "mean"
    return _rows(summary.reset_index())


def _annotations(a) -> list[dict] | None:
    df = a.get_gpu_user_annotation_breakdown(visualize=False)
    return None if df is None else _rows(df)


def _queues(a) -> dict | None:
    summary = a.get_queue_length_summary(ranks=[0])
    if summary is None:
        return None
    summary.columns = [c[1] for c in summary.columns]
    series = a.get_queue_length_time_series(ranks=[0])
    blocked = a.get_time_spent_blocked_on_full_queue(series)
    return {"summary": _rows(summary.reset_index()),
            "blocked": None if blocked is None else _rows(blocked)}


def _critical_path(a) -> dict:
    """HTA's critical path of the first profiler step: its length and the time of its edges by
    what bounds them and by the event they are charged to."""
    graph, ok = a.critical_path_analysis(rank=0, annotation="ProfilerStep", instance_id=0)
    if not ok:
        return {"hta_error": "critical_path_analysis returned False"}
    edges = graph.get_critical_path_breakdown()
    by_bound = edges.groupby("bound_by").duration.sum()
    charged = edges[edges.type == "critical_path_operator"].groupby("s_name").duration.sum()
    return {"path_us": _clean(edges.duration.sum()),
            "bound_by": {k: _clean(v) for k, v in by_bound.items() if k},
            "by_event": {k: _clean(v) for k, v in charged.items()}}


# Operators whose frequent kernel sequences are stored: the shared traces' common convolution,
# batch norm (forward and backward), element-wise and linear layers.
SEQUENCE_OPERATORS = ("aten::conv2d", "aten::batch_norm", "CudnnBatchNormBackward", "aten::add_", "aten::linear",
                      "aten::addmm")


def _kernel_sequences(a) -> dict:
    """HTA's frequent CUDA kernel sequences of rank 0 for each of ``SEQUENCE_OPERATORS``
    (minimum length 3): every pattern with its count and durations; None where HTA finds none."""
    out = {}
    for name in SEQUENCE_OPERATORS:
        df = a.get_frequent_cuda_kernel_sequences(name, tempfile.mkdtemp(), min_pattern_len=3, visualize=False)
        out[name] = None if df is None or not len(df) else _rows(df)
    return out


@contextmanager
def stable_sort():
    """pandas' ``sort_values`` stable while inside (HTA passes no ``kind``)."""
    import pandas as pd

    unstable = pd.DataFrame.sort_values

    def stable(self, *args, **kwargs):
        kwargs.setdefault("kind", "stable")
        return unstable(self, *args, **kwargs)

    pd.DataFrame.sort_values = stable
    try:
        yield
    finally:
        pd.DataFrame.sort_values = unstable


@contextmanager
def exact_cumsum():
    """pandas' ``Series.cumsum`` of floats exact while inside: each running value the float
    nearest the exact sum of the values so far (``fractions.Fraction`` holds a float exactly)."""
    import pandas as pd

    inexact = pd.Series.cumsum

    def exact(self, *args, **kwargs):
        if self.dtype.kind != "f":
            return inexact(self, *args, **kwargs)
        running, out = Fraction(0), []
        for value in self.to_list():
            running += Fraction(value)
            out.append(float(running))
        return pd.Series(out, index=self.index, name=self.name, dtype=self.dtype)

    pd.Series.cumsum = exact
    try:
        yield
    finally:
        pd.Series.cumsum = inexact


def main(path: str) -> None:
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    from hta.trace_analysis import TraceAnalysis

    d = tempfile.mkdtemp()
    os.symlink(os.path.abspath(path), os.path.join(d, os.path.basename(path)))
    a = TraceAnalysis(trace_dir=d)
    out: dict = {"hta": "0.5.0", "trace": os.path.basename(path)}
    for key, analysis in (("temporal", _temporal), ("comp_comm_overlap_pctg", _overlap), ("idle", _idle),
                          ("launch", _launch), ("kernel_breakdown", _kernel_breakdown),
                          ("memory_bw", _memory_bw), ("gpu_annotations", _annotations),
                          ("queue_length", _queues)):
        try:
            out[key] = analysis(a)
        except Exception as exc:  # noqa: BLE001 - HTA fails on some traces (no GPU kernel): recorded as such
            out[key] = {"hta_error": f"{type(exc).__name__}: {exc}"}
    # HTA sorts with pandas' default (unstable) sort: a launch and a kernel start in the same
    # microsecond on a stream land in either order, and so do a copy's start and end and those
    # of other copies, and two events that start together on a stream (one of them of 0 us).
    # Its figures with a stable sort (the file's order among equal times):
    with stable_sort():
        for key, analysis in (("queue_length_stable_sort", _queues), ("memory_bw_stable_sort", _memory_bw),
                              ("idle_stable_sort", _idle)):
            try:
                out[key] = analysis(TraceAnalysis(trace_dir=d))
            except Exception as exc:  # noqa: BLE001
                out[key] = {"hta_error": f"{type(exc).__name__}: {exc}"}
        # ... and with its running sum of bandwidths exact (a float sum drifts: it does not return
        # to 0 when the copies have ended, and those drifts are counted as values): HTA with both
        # fixes, the figures gpufleet's equal.
        with exact_cumsum():
            try:
                out["memory_bw_fixed"] = _memory_bw(TraceAnalysis(trace_dir=d))
            except Exception as exc:  # noqa: BLE001
                out["memory_bw_fixed"] = {"hta_error": f"{type(exc).__name__}: {exc}"}
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()


def add(key: str, path: str, reference: str) -> None:
    """Add one analysis (``critical_path``, ``kernel_sequences``) to a stored reference file."""
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    from hta.trace_analysis import TraceAnalysis

    d = tempfile.mkdtemp()
    os.symlink(os.path.abspath(path), os.path.join(d, os.path.basename(path)))
    with open(reference) as fh:
        out = json.load(fh)
    try:
        out[key] = {"critical_path": _critical_path,
                    "kernel_sequences": _kernel_sequences}[key](TraceAnalysis(trace_dir=d))
    except Exception as exc:  # noqa: BLE001 - recorded as HTA's failure, as above
        out[key] = {"hta_error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    with open(reference, "w") as fh:
        json.dump(out, fh, indent=1, sort_keys=True)
        fh.write("\n")


if __name__ == "__main__":
    if sys.argv[1] == "--add":
        add(*sys.argv[2:5])
    else:
        main(sys.argv[1])
