"""Per profiler step: how long the step took on the CPU, and the GPU timeline of the work it
launched (its span, busy, idle and compute time), so that one slow step (a data-loading
stall, a checkpoint, a recompilation) stands out from the others.

A GPU event belongs to the step during which its launch call was made (the ``ProfilerStep#N``
range open on the CPU at the call's start). Per step, the GPU events are fed in start order to
the same interval unions as the temporal breakdown. State: per step a few numbers.
"""

from __future__ import annotations

from streams.traces.analysis import Finished, Options
from streams.traces.batch import EventBatch
from streams.traces.coverage import Coverage
from streams.traces.kernel_breakdown import COMPUTATION_BIT

MAX_STEPS = 10_000


class Steps:
    def __init__(self) -> None:
        self.current: list | None = None  # [name, start, end] of the step open on the CPU
        # name -> [start, CPU duration, kernels, busy Coverage fields, compute Coverage fields]
        self.steps: dict[str, list] = {}
        self.names: set[str] = set()  # every ProfilerStep seen (``steps`` holds the first MAX_STEPS)

    @classmethod
    def create(cls, options: Options) -> Steps:
        return cls()

    label = "step"

    def label_calls(self, batch: EventBatch) -> None:
        """The batch's profiler steps, and for each runtime call the step it was made in
        (``batch.labels[label]``)."""
        current, names, starts = self.current, batch.name, batch.ts
        if current is None and not any(name.startswith("ProfilerStep#") for name in names):
            return  # (no step open, none opening)
        steps: dict[int, str] = {}
        for i, (stream, corr) in enumerate(zip(batch.stream, batch.correlation)):
            if stream >= 0:
                continue
            if corr >= 0 and current is not None and starts[i] < current[2]:
                steps[i] = current[0]
            name = names[i]
            if name.startswith("ProfilerStep#"):  # an annotation (cpu_op in older traces)
                ts, dur = starts[i], batch.dur[i]
                current = [name, ts, ts + dur]
                self.names.add(name)
                if name not in self.steps and len(self.steps) < MAX_STEPS:
                    self.steps[name] = [ts, dur, 0, Coverage(), Coverage()]
        self.current = current
        batch.labels[self.label] = steps

    def add(self, batch: EventBatch) -> None:
        """The batch's GPU-side events launched in a step, and whether each is a computation kernel."""
        steps = self.steps
        if not steps:
            return
        for call, ts, end, bit in zip(batch.calls, batch.g_ts, batch.g_end, batch.bits):
            if call is None or call.step is None:
                continue
            s = steps.get(call.step)
            if s is None:
                continue
            s[2] += 1
            s[3].add(ts, end)
            if bit == COMPUTATION_BIT:
                s[4].add(ts, end)

    def result(self, finished: Finished) -> dict:
        out = []
        for name, (start, cpu_us, kernels, busy, compute) in sorted(self.steps.items(), key=lambda kv: kv[1][0]):
            span = busy.span
            out.append({"step": name, "cpu_us": float(cpu_us), "gpu_events": kernels, "gpu_span_us": float(span),
                        "gpu_busy_us": float(busy.covered), "gpu_idle_us": float(span - busy.covered),
                        "compute_us": float(compute.covered)})
        return {"profiler_steps": len(self.names), "steps": out}

    # -- checkpoints (JSON-able) ---------------------------------------------------------------
    def to_state(self) -> dict:
        return {"per_step": {"current": self.current,
                             "steps": {name: [s[0], s[1], s[2], s[3].to_state(), s[4].to_state()]
                                       for name, s in self.steps.items()}},
                "steps": sorted(self.names)}

    @classmethod
    def from_state(cls, state: dict, options: Options) -> Steps:
        st = cls()
        if "per_step" not in state:  # (a session checkpointed before the steps)
            return st
        st.current = state["per_step"]["current"]
        for name, (start, cpu_us, kernels, busy, compute) in state["per_step"]["steps"].items():
            st.steps[name] = [start, cpu_us, kernels, Coverage.from_state(busy), Coverage.from_state(compute)]
        st.names = set(state["steps"])
        return st
