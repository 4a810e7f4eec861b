"""GPU time of the user's annotations (``torch.profiler.record_function`` ranges as the
profiler projects them onto the GPU: ``gpu_user_annotation`` events), as Holistic Trace
Analysis 0.5.0 summarises them (``get_gpu_user_annotation_breakdown``): per name the count,
total, min, max, mean and standard deviation of the ranges' durations, by total time; at most
1000 names, and, past that, only those within the 0.8 quantile of the running total, the rest
as "others". State: one entry per annotation name."""

from __future__ import annotations

from streams.traces.analysis import Finished, Options
from streams.traces.batch import EventBatch
from streams.traces.kernel_breakdown import grouped_rows

GPU_ANNOTATION = "gpu_user_annotation"
TOP_ANNOTATIONS = 1000


class GpuAnnotations:
    def __init__(self) -> None:
        self.stats: dict[str, list] = {}  # name -> [count, total, min, max, sum of squares]

    @classmethod
    def create(cls, options: Options) -> GpuAnnotations:
        return cls()

    def add(self, batch: EventBatch) -> None:
        """The batch's GPU annotations (on the CPU side, and as projected onto a stream)."""
        if GPU_ANNOTATION not in batch.cat:
            return
        stats, kinds, names, starts, ends = self.stats, batch.kind, batch.name, batch.ts, batch.end
        for i, cat in enumerate(batch.cat):
            if cat != GPU_ANNOTATION or kinds[i] != "annotation":
                continue
            dur = ends[i] - starts[i]
            k = stats.get(names[i])
            if k is None:
                stats[names[i]] = [1, dur, dur, dur, dur * dur]
            else:
                k[0] += 1
                k[1] += dur
                k[2] = min(k[2], dur)
                k[3] = max(k[3], dur)
                k[4] += dur * dur

    def result(self, finished: Finished) -> dict:
        return {"gpu_annotations": grouped_rows(self.stats, TOP_ANNOTATIONS)}

    def to_state(self) -> dict:
        return {"annotations": self.stats}

    @classmethod
    def from_state(cls, state: dict, options: Options) -> GpuAnnotations:
        a = cls()
        a.stats = {name: list(k) for name, k in state.get("annotations", {}).items()}
        return a
