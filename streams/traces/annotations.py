"""GPU time of the user's annotations (``torch.profiler.record_function`` ranges as the
profiler projects them onto the GPU: ``gpu_user_annotation`` events), as Holistic Trace
Analysis 0.5.0 summarises them (``get_gpu_user_annotation_breakdown``): per name the count,
total, min, max, mean and standard deviation of the ranges' durations, by total time; at most
1000 names, and, past that, only those within the 0.8 quantile of the running total, the rest
as "others". State: one entry per annotation name."""

from __future__ import annotations

from streams.traces.kernel_breakdown import grouped_rows

GPU_ANNOTATION = "gpu_user_annotation"
TOP_ANNOTATIONS = 1000


class GpuAnnotations:
    def __init__(self) -> None:
        self.stats: dict[str, list] = {}  # name -> [count, total, min, max, sum of squares]

    def add(self, event: dict) -> None:
        """Any event; only the GPU annotations count."""
        if event["cat"] != GPU_ANNOTATION:
            return
        dur = event["end"] - event["ts"] if "end" in event else event["dur"]
        k = self.stats.get(event["name"])
        if k is None:
            self.stats[event["name"]] = [1, dur, dur, dur, dur * dur]
        else:
            k[0] += 1
            k[1] += dur
            k[2] = min(k[2], dur)
            k[3] = max(k[3], dur)
            k[4] += dur * dur

    def result(self) -> list[dict]:
        return grouped_rows(self.stats, TOP_ANNOTATIONS)

    def to_state(self) -> dict:
        return self.stats

    @classmethod
    def from_state(cls, state: dict) -> GpuAnnotations:
        a = cls()
        a.stats = {name: list(k) for name, k in state.items()}
        return a
