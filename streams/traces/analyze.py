"""One rank's trace analysis: feeds time-ordered events to each analysis and gathers the results.

The same object serves the command line (``gpufleet analyze``, fed a file's events a batch of
columns at a time) and the stream worker (fed the ``KernelEvent`` s a message batch brings, its
state checkpointed with ``to_state``/``from_state``). Every analysis follows one protocol
(``streams.traces.analysis``) and is listed once, in ``ANALYSES``; the analyzer itself only
counts events and joins each GPU-side event to the CUDA runtime call that launched it (by
correlation id), which most analyses read.

State: the analyses' own (per stream at most) and the runtime calls whose GPU event has not
arrived yet; a call is dropped when its GPU event arrives or ``pending_horizon_us`` after it
started.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from schemas.fields import conform
from schemas.gpu_peaks import peak_tflops
from schemas.records.trace_analysis import TRACE_ANALYSIS
from streams.alerts.detectors import DetectorConfig
from streams.traces.analysis import Finished, Options
from streams.traces.annotations import GpuAnnotations
from streams.traces.antipatterns import AntipatternCollector
from streams.traces.batch import EventBatch
from streams.traces.collectives import Collectives
from streams.traces.critical_path import CriticalPath
from streams.traces.idle_breakdown import IdleBreakdown
from streams.traces.kernel_breakdown import KernelBreakdown, kernel_bit
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

# Every analysis of a trace (``streams.traces.analysis.TraceAnalysis``), in the order of their
# entries in the result.
ANALYSES: tuple[type, ...] = (
    Steps, TemporalBreakdown, IdleBreakdown, LaunchStats, KernelBreakdown, MemoryCopies, Collectives,
    OperatorRoofline, GpuAnnotations, QueueLength, AntipatternCollector,
)


class TraceAnalyzer:
    def __init__(self, pending_horizon_us: float = PENDING_HORIZON_US, critical_path: bool = False,
                 infer_syncs: bool = False, kernel_sequences: list[str] | None = None) -> None:
        """``critical_path``: find each step's critical path too; ``kernel_sequences``: the
        frequent kernel sequences of these operator names. Both need every CPU operator
        (``read_trace(..., cpu_ops=True)``) and are not checkpointed: for a whole trace at once.
        ``infer_syncs``: the trace has no synchronisation events (``TraceRead.sync_events``)."""
        self.options = Options(pending_horizon_us)
        self.analyses = {cls: cls.create(self.options) for cls in ANALYSES}
        self._wire()
        self.critical = CriticalPath(infer_syncs) if critical_path else None
        self.sequences = KernelSequences(kernel_sequences, pending_horizon_us) if kernel_sequences else None
        self._whole_trace = [a for a in (self.critical, self.sequences) if a is not None]
        self.events = 0
        self.gpu_events = 0
        self.unmatched_gpu_events = 0
        self.out_of_order = 0
        self._last_ts: float | None = None
        self._calls: dict[int, Call] = {}
        self._call_order: deque[tuple[float, int]] = deque()

    def _wire(self) -> None:
        self._feed = tuple(a.add for a in self.analyses.values())
        self._labellers = tuple(a.label_calls for a in self.analyses.values() if hasattr(a, "label_calls"))

    def add(self, event: dict) -> None:
        """One event, in start-time order (a batch of one: ``add_batch`` is the way to feed many)."""
        self.add_batch(EventBatch.of_records([event]))

    def add_events(self, events: Iterable[dict], size: int = 4096) -> None:
        """Events in start-time order, as dicts, ``size`` at a time."""
        chunk: list[dict] = []
        for e in events:
            chunk.append(e)
            if len(chunk) == size:
                self.add_batch(EventBatch.of_records(chunk))
                chunk = []
        if chunk:
            self.add_batch(EventBatch.of_records(chunk))

    def add_batch(self, batch: EventBatch) -> None:
        """The next events of the trace, in start-time order."""
        for label in self._labellers:
            label(batch)
        self._join(batch)
        for add in self._feed:
            add(batch)
        for analysis in self._whole_trace:
            analysis.add(batch)

    def _join(self, b: EventBatch) -> None:
        """Counts the events and joins each GPU-side one to its runtime call (``EventBatch.join``)."""
        calls, order, horizon = self._calls, self._call_order, self.options.horizon_us
        ops, steps = b.labels.get(OperatorRoofline.label, _NONE), b.labels.get(Steps.label, _NONE)
        last, out_of_order = self._last_ts, 0
        gpu, joined, unmatched = [], [], 0
        for i, (ts, stream, corr) in enumerate(zip(b.ts, b.stream, b.correlation)):
            if last is not None and ts < last:
                out_of_order += 1
            else:
                last = ts
            if stream < 0:
                if corr >= 0:
                    calls[corr] = Call(b.name[i], ts, b.dur[i], ops.get(i), steps.get(i))
                    order.append((ts, corr))
                    while order and order[0][0] < ts - horizon:  # calls whose GPU event never came
                        old_ts, old = order.popleft()
                        call = calls.get(old)
                        if call is not None and call.ts == old_ts:
                            del calls[old]
                continue
            call = calls.pop(corr, None) if corr >= 0 else None
            if call is None:
                unmatched += 1
            gpu.append(i)
            joined.append(call)
        self._last_ts = last
        self.out_of_order += out_of_order
        self.events += len(b)
        self.gpu_events += len(gpu)
        self.unmatched_gpu_events += unmatched
        b.join(gpu, joined)
        b.bits = list(map(kernel_bit, b.g_name))

    def result(self, gpu_name: str | None = None) -> dict:
        """The figures of the events so far; ``gpu_name`` (the trace's GPU) gives the roofline its peaks."""
        out = {"events": self.events, "gpu_events": self.gpu_events,
               "gpu_events_without_launch": self.unmatched_gpu_events}
        finished = Finished(gpu_name, self.analyses)
        for analysis in self.analyses.values():
            out.update(analysis.result(finished))
        if self.critical is not None:
            out["critical_path"] = self.critical.result()
        if self.sequences is not None:
            out["kernel_sequences"] = self.sequences.result()
        return out

    # -- checkpoints (JSON-able) -------------------------------------------------------
    def to_state(self) -> dict:
        state = {
            "counters": [self.events, self.gpu_events, self.unmatched_gpu_events, self.out_of_order, self._last_ts],
            "calls": [[corr, c.name, c.ts, c.dur, c.op, c.step] for corr, c in self._calls.items()],
            "horizon": self.options.horizon_us,
        }
        for analysis in self.analyses.values():
            state.update(analysis.to_state())
        return state

    @classmethod
    def from_state(cls, state: dict) -> TraceAnalyzer:
        a = cls(state["horizon"])
        a.analyses = {c: c.from_state(state, a.options) for c in ANALYSES}
        a._wire()
        a.events, a.gpu_events, a.unmatched_gpu_events, a.out_of_order, a._last_ts = state["counters"]
        for corr, name, ts, dur, *rest in sorted(state["calls"], key=lambda c: c[2]):
            op, step = (rest + [None, None])[:2]  # (calls checkpointed before the roofline and steps have neither)
            a._calls[corr] = Call(name, ts, dur, op, step)
            a._call_order.append((ts, corr))
        return a


_NONE: dict = {}


def analyze_events(events: Iterable[dict]) -> dict:
    """Analyse an iterable of time-ordered events of one rank."""
    analyzer = TraceAnalyzer()
    analyzer.add_events(events)
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
    """The ``TraceAnalysis`` record of a result of :meth:`TraceAnalyzer.result`: each figure of the
    result is the field of its name (``schemas/records/trace_analysis.py`` is the shape; a figure
    with no field there is an error, a field with no figure its default). ``system``: what the
    host saw during the capture (from the ``TraceEnd`` of a requested profile); ``flops`` and
    ``gpu_name``: what the trace counted and ran on (from its ``TraceEnd``)."""
    t, o, launch = result["temporal"], result["overlap"], result["launch"]
    span_us = t["idle_time_us"] + t["compute_time_us"] + t["non_compute_time_us"]
    figures = {k: v for k, v in result.items() if k not in _SECTIONS}  # each a field of the same name
    first = {k: figures.pop(k) for k in _FIRST if k in figures}
    pool = {**t, **o, "idle_by_stream": [{"stream": s, **v} for s, v in result["idle_by_stream"].items()],
            **launch, **model_flops_utilization(flops, gpu_name, span_us), **figures, "analyzed_at": analyzed_at,
            "system": system}
    return conform(TRACE_ANALYSIS, {
        "trace_id": trace_id, "workflow_id": workflow_id, "rank": rank, "source": source, "partial": partial,
        "error": error, **first, **{f.name: pool.pop(f.name) for f in TRACE_ANALYSIS.fields if f.name in pool}, **pool,
    })


# The result's sections whose figures are fields of their own (or of no field: what the rules read).
_SECTIONS = ("temporal", "overlap", "launch", "idle_by_stream", "antipatterns", "critical_path", "kernel_sequences")
_FIRST = ("events", "gpu_events", "gpu_events_without_launch", "profiler_steps")  # (the record's order since v1)


def findings_records(result: dict, analysis: dict, memory: dict | None, detected_at: int,
                     thresholds: DetectorConfig) -> list[dict]:
    """``Finding`` records of a result of :meth:`TraceAnalyzer.result` and its ``TraceAnalysis`` record,
    the input-bound rules on ``thresholds``."""
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
                                     result.get("critical_path"), thresholds)
    ]
