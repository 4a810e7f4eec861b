"""One rank's trace analysis: feeds time-ordered events to each analyser and gathers the results.

The same object serves the command line (``gpufleet analyze``, fed from a file) and the
stream worker (fed from ``KernelEvent`` records, its state checkpointed with
``to_state``/``from_state``). Events are dicts with ``kind, cat, name, ts, dur, stream,
correlation`` (``end`` is derived when absent), in start order.

State: the analysers' own (per stream at most) and the CUDA runtime calls whose GPU event
has not arrived yet; a call is dropped when its GPU event arrives or ``pending_horizon_us``
after it started.
"""

from __future__ import annotations

from collections import deque

from schemas.gpu_peaks import peak_tflops
from streams.traces.annotations import GpuAnnotations
from streams.traces.antipatterns import AntipatternCollector
from streams.traces.collectives import Collectives
from streams.traces.coverage import Coverage
from streams.traces.critical_path import CriticalPath
from streams.traces.idle_breakdown import IdleBreakdown, StreamIdle
from streams.traces.kernel_breakdown import (
    COMMUNICATION_BIT,
    COMPUTATION_BIT,
    MEMORY_BIT,
    KernelBreakdown,
)
from streams.traces.kernel_sequences import KernelSequences
from streams.traces.launch_stats import Call, LaunchStats
from streams.traces.memory_copies import MemoryCopies
from streams.traces.operators import OperatorRoofline
from streams.traces.queue_length import QueueLength
from streams.traces.rules import detect_antipatterns
from streams.traces.steps import Steps
from streams.traces.temporal_breakdown import TemporalBreakdown

# A GPU event starting this long after its runtime call is not joined to it.
PENDING_HORIZON_US = 10_000_000


class TraceAnalyzer:
    def __init__(self, pending_horizon_us: float = PENDING_HORIZON_US, critical_path: bool = False,
                 infer_syncs: bool = False, kernel_sequences: list[str] | None = None) -> None:
        """``critical_path``: find each step's critical path too; ``kernel_sequences``: the
        frequent kernel sequences of these operator names. Both need every CPU operator
        (``read_trace(..., cpu_ops=True)``) and are not checkpointed: for a whole trace at once.
        ``infer_syncs``: the trace has no synchronisation events (``TraceRead.sync_events``)."""
        self.critical = CriticalPath(infer_syncs) if critical_path else None
        self.sequences = KernelSequences(kernel_sequences, pending_horizon_us) if kernel_sequences else None
        self._whole_trace = [a for a in (self.critical, self.sequences) if a is not None]
        self.temporal = TemporalBreakdown()
        self.idle = IdleBreakdown()
        self.launch = LaunchStats()
        self.kernels = KernelBreakdown()
        self.copies = MemoryCopies()
        self.collectives = Collectives()
        self.roofline = OperatorRoofline()
        self.annotations = GpuAnnotations()
        self.queues = QueueLength(pending_horizon_us)
        self.per_step = Steps()
        self.antipatterns = AntipatternCollector()
        self.horizon = pending_horizon_us
        self.events = 0
        self.gpu_events = 0
        self.unmatched_gpu_events = 0
        self.out_of_order = 0
        self.steps: set[str] = set()  # names of the ProfilerStep annotations seen
        self._last_ts: float | None = None
        self._calls: dict[int, Call] = {}
        self._call_order: deque[tuple[float, int]] = deque()

    def add(self, event: dict) -> None:
        """One event, in start-time order."""
        ts = event["ts"]
        if "end" not in event:
            event = {**event, "end": ts + event["dur"]}
        if self._last_ts is not None and ts < self._last_ts:
            self.out_of_order += 1
        else:
            self._last_ts = ts
        self.events += 1
        for analyser in self._whole_trace:
            analyser.add(event)
        corr = event["correlation"]
        if event["stream"] < 0:
            self._add_cpu(event, ts, corr)
            return
        self.gpu_events += 1
        if event["kind"] == "annotation":  # projected onto a stream (HTA counts it as a kernel too)
            self.annotations.add(event)
        call = self._calls.pop(corr, None) if corr >= 0 else None
        if call is None:
            self.unmatched_gpu_events += 1
        self.temporal.add(ts, event["end"])
        bit = self.kernels.add(event)
        if bit == MEMORY_BIT:
            self.copies.add(event)
        elif bit == COMMUNICATION_BIT:
            self.collectives.add(event)
        if call is not None:  # (every launch the queue waits for is a call the analyzer holds)
            if call.op is not None:
                self.roofline.add_gpu(event, call.op)
            if call.step is not None:
                self.per_step.add_gpu(event, call.step, bit == COMPUTATION_BIT)
            self.queues.add_gpu(event)
            self.launch.add(call, event)
        self.idle.add(event, None if call is None else call.ts)
        self.antipatterns.add_gpu(event, call)

    def _add_cpu(self, event: dict, ts: float, corr: int) -> None:
        """A CPU-side event: an operator, an annotation, a runtime call."""
        kind, op = event["kind"], None
        if kind == "runtime":
            if self.roofline.open:
                op = self.roofline.add_cpu(event)  # the operator the call was made from
            self.queues.add_cpu(event)
        elif kind == "cpu_op" and event.get("flops"):
            self.roofline.add_cpu(event)
        elif kind == "annotation":
            self.annotations.add(event)
        if corr >= 0:
            step = self.per_step.current  # the step the call is made in
            step = step[0] if step is not None and ts < step[2] else None
            self._calls[corr] = Call(event["name"], ts, event["dur"], op, step)
            self._call_order.append((ts, corr))
            self._evict(ts)
        if event["name"].startswith("ProfilerStep#"):  # an annotation (cpu_op in older traces)
            self.steps.add(event["name"])
            self.per_step.add_cpu(event)
        self.antipatterns.add_cpu(event)

    def _evict(self, now: float) -> None:
        order, calls = self._call_order, self._calls
        while order and order[0][0] < now - self.horizon:
            ts, corr = order.popleft()
            call = calls.get(corr)
            if call is not None and call.ts == ts:
                del calls[corr]

    def result(self, gpu_name: str | None = None) -> dict:
        """The figures of the events so far; ``gpu_name`` (the trace's GPU) gives the roofline its peaks."""
        t = self.temporal.result(*self.kernels.computation_and_communication())
        return {
            "events": self.events,
            "gpu_events": self.gpu_events,
            "gpu_events_without_launch": self.unmatched_gpu_events,
            "profiler_steps": len(self.steps),
            "temporal": {
                "kernel_time_us": t.kernel_us,
                "idle_time_us": t.idle_us,
                "compute_time_us": t.compute_us,
                "non_compute_time_us": t.non_compute_us,
                "idle_pct": t.pct(t.idle_us),
                "compute_pct": t.pct(t.compute_us),
                "non_compute_pct": t.pct(t.non_compute_us),
            },
            "overlap": {
                "communication_time_us": t.communication_us,
                "comp_comm_overlap_us": t.comp_comm_overlap_us,
                "comp_comm_overlap_pct": t.overlap_pct,
            },
            "idle_by_stream": self.idle.result(),
            "launch": self.launch.result(),
            **self.kernels.result(),
            "memory_copies": self.copies.result(),
            "collectives": self.collectives.result(),
            "operators": self.roofline.result(gpu_name),
            "gpu_annotations": self.annotations.result(),
            "queue_lengths": self.queues.result(),
            "steps": self.per_step.result(),
            "antipatterns": self.antipatterns.summary(),
            **({"critical_path": self.critical.result()} if self.critical is not None else {}),
            **({"kernel_sequences": self.sequences.result()} if self.sequences is not None else {}),
        }

    # -- checkpoints (JSON-able) -------------------------------------------------------
    def to_state(self) -> dict:
        return {
            "coverage": {"all": self.temporal.all.to_state()},
            "idle": {str(s): [v.host_wait, v.kernel_wait, v.other] for s, v in self.idle.streams.items()},
            "prev_end": {str(s): e for s, e in self.idle._prev_end.items()},
            "launch": {k: getattr(self.launch, k) for k in LAUNCH_COUNTERS},
            "counters": [self.events, self.gpu_events, self.unmatched_gpu_events, self.out_of_order, self._last_ts],
            "calls": [[corr, c.name, c.ts, c.dur, c.op, c.step] for corr, c in self._calls.items()],
            "horizon": self.horizon,
            "antipatterns": self.antipatterns.to_state(),
            "kernels": self.kernels.to_state(),
            "copies": self.copies.to_state(),
            "collectives": self.collectives.to_state(),
            "roofline": self.roofline.to_state(),
            "annotations": self.annotations.to_state(),
            "queues": self.queues.to_state(),
            "per_step": self.per_step.to_state(),
            "steps": sorted(self.steps),
        }

    @classmethod
    def from_state(cls, state: dict) -> TraceAnalyzer:
        a = cls(state["horizon"])
        a.temporal.all = Coverage.from_state(state["coverage"]["all"])
        for s, (h, k, o) in state["idle"].items():
            a.idle.streams[int(s)] = StreamIdle(h, k, o)
        a.idle._prev_end = {int(s): e for s, e in state["prev_end"].items()}
        for k, v in state["launch"].items():
            setattr(a.launch, k, v)
        a.events, a.gpu_events, a.unmatched_gpu_events, a.out_of_order, a._last_ts = state["counters"]
        a.antipatterns = AntipatternCollector.from_state(state["antipatterns"])
        if "kernels" in state:  # a session checkpointed before the kernel breakdown: it counts from here
            a.kernels = KernelBreakdown.from_state(state["kernels"])
            a.copies = MemoryCopies.from_state(state["copies"])
            a.collectives = Collectives.from_state(state["collectives"])
            a.roofline = OperatorRoofline.from_state(state["roofline"])
            a.annotations = GpuAnnotations.from_state(state["annotations"])
            a.queues = QueueLength.from_state(state["queues"])
            a.per_step = Steps.from_state(state["per_step"])
            a.steps = set(state["steps"])
        else:
            a.kernels = KernelBreakdown.from_temporal_coverage(state["coverage"])
        for corr, name, ts, dur, *rest in sorted(state["calls"], key=lambda c: c[2]):
            op, step = (rest + [None, None])[:2]  # (calls checkpointed before the roofline and steps have neither)
            a._calls[corr] = Call(name, ts, dur, op, step)
            a._call_order.append((ts, corr))
        return a


LAUNCH_COUNTERS = ("launches", "cpu_us", "gpu_us", "delay_us", "max_delay_us", "short_kernels",
                   "short_kernel_gpu_us", "runtime_outliers", "delay_outliers")


def analyze_events(events) -> dict:
    """Analyse an iterable of time-ordered events of one rank."""
    analyzer = TraceAnalyzer()
    for e in events:
        analyzer.add(e)
    return analyzer.result()


def model_flops_utilization(flops: dict[str, int] | None, gpu_name: str | None, span_us: float) -> dict:
    """MFU of a rank: the FLOPs the profiler counted over the span of its GPU timeline, against
    the GPU's dense peak at the precision most of them ran at (``schemas/gpu_peaks.json``)."""
    out = {"gpu_name": gpu_name, "model_flops": None, "model_flops_precision": None, "peak_tflops": None,
           "mfu_pct": None}
    if not flops:
        return out
    precision = max(flops, key=flops.get)
    total = sum(flops.values())
    peak = peak_tflops(gpu_name, precision)
    out.update(model_flops=total, model_flops_precision=precision, peak_tflops=peak)
    if peak and span_us > 0:
        out["mfu_pct"] = 100.0 * total / (span_us * 1e-6) / (peak * 1e12)
    return out


def trace_analysis_record(
    result: dict, *, trace_id: str, workflow_id: str, rank: int, source: str | None,
    partial: bool, error: str | None, analyzed_at: int, system: dict | None = None,
    flops: dict[str, int] | None = None, gpu_name: str | None = None,
) -> dict:
    """The ``TraceAnalysis`` record of a result of :meth:`TraceAnalyzer.result`; ``system``:
    what the host saw during the capture (from the ``TraceEnd`` of a requested profile);
    ``flops`` and ``gpu_name``: what the trace counted and ran on (from its ``TraceEnd``)."""
    t, o, launch = result["temporal"], result["overlap"], result["launch"]
    span_us = t["idle_time_us"] + t["compute_time_us"] + t["non_compute_time_us"]
    return {
        "trace_id": trace_id,
        "workflow_id": workflow_id,
        "rank": rank,
        "source": source,
        "partial": partial,
        "error": error,
        "events": result["events"],
        "gpu_events": result["gpu_events"],
        "gpu_events_without_launch": result["gpu_events_without_launch"],
        "profiler_steps": result.get("profiler_steps", 0),
        **{k: float(v) if k.endswith("_us") else v for k, v in t.items()},
        **{k: float(v) if k.endswith("_us") else v for k, v in o.items()},
        "idle_by_stream": [
            {"stream": s, "host_wait_us": float(v["host_wait_us"]), "kernel_wait_us": float(v["kernel_wait_us"]),
             "other_us": float(v["other_us"])}
            for s, v in result["idle_by_stream"].items()
        ],
        "launches": launch["launches"],
        "launch_delay_mean_us": launch["launch_delay_mean_us"],
        "launch_delay_max_us": None if launch["launch_delay_max_us"] is None else float(launch["launch_delay_max_us"]),
        "launch_delay_total_us": float(launch["launch_delay_total_us"]),
        "cpu_duration_mean_us": launch["cpu_duration_mean_us"],
        "gpu_duration_mean_us": launch["gpu_duration_mean_us"],
        "short_kernels": launch["short_kernels"],
        "short_kernel_gpu_us": float(launch["short_kernel_gpu_us"]),
        "runtime_outliers": launch["runtime_outliers"],
        "launch_delay_outliers": launch["launch_delay_outliers"],
        **model_flops_utilization(flops, gpu_name, span_us),
        "kernel_types": [{**k, "time_us": float(k["time_us"])} for k in result.get("kernel_types", [])],
        "top_kernels": result.get("top_kernels", []),
        "memory_copies": result.get("memory_copies", []),
        "collectives": result.get("collectives", []),
        "operators": result.get("operators", []),
        "gpu_annotations": result.get("gpu_annotations", []),
        "queue_lengths": result.get("queue_lengths", []),
        "steps": result.get("steps", []),
        "analyzed_at": analyzed_at,
        "system": system,
    }


def findings_records(result: dict, analysis: dict, memory: dict | None, detected_at: int) -> list[dict]:
    """``Finding`` records of a result of :meth:`TraceAnalyzer.result` and its ``TraceAnalysis`` record."""
    return [
        {
            "finding_id": f"{analysis['trace_id']}:{f['rule']}",
            "trace_id": analysis["trace_id"],
            "workflow_id": analysis["workflow_id"],
            "rank": analysis["rank"],
            **f,
            "detected_at": detected_at,
        }
        for f in detect_antipatterns(result["antipatterns"], analysis, memory, analysis.get("system"),
                                     result.get("critical_path"))
    ]
