"""Per profiler step: how long the step took on the CPU, and the GPU timeline of the work it
launched (its span, busy, idle and compute time), so that one slow step (a data-loading
stall, a checkpoint, a recompilation) stands out from the others.

A GPU event belongs to the step during which its launch call was made (the ``ProfilerStep#N``
range open on the CPU at the call's start). Per step, the GPU events are fed in start order to
the same interval unions as the temporal breakdown. State: per step a few numbers.
"""

from __future__ import annotations

from streams.traces.coverage import Coverage

MAX_STEPS = 10_000


class Steps:
    def __init__(self) -> None:
        self.current: list | None = None  # [name, start, end] of the step open on the CPU
        # name -> [start, CPU duration, kernels, busy Coverage fields, compute Coverage fields]
        self.steps: dict[str, list] = {}

    def add_cpu(self, event: dict) -> str | None:
        """A CPU-side event; for a call, the step it was made in (or None)."""
        name = event["name"]
        if name.startswith("ProfilerStep#"):
            self.current = [name, event["ts"], event["ts"] + event["dur"]]
            if name not in self.steps and len(self.steps) < MAX_STEPS:
                self.steps[name] = [event["ts"], event["dur"], 0, Coverage(), Coverage()]
            return None
        step = self.current
        if step is not None and event["ts"] < step[2] and step[0] in self.steps:
            return step[0]
        return None

    def add_gpu(self, event: dict, step: str, computation: bool) -> None:
        """A GPU event launched in ``step``; ``computation``: a computation kernel."""
        s = self.steps.get(step)
        if s is None:
            return
        s[2] += 1
        s[3].add(event["ts"], event["end"])
        if computation:
            s[4].add(event["ts"], event["end"])

    def result(self) -> list[dict]:
        out = []
        for name, (start, cpu_us, kernels, busy, compute) in sorted(self.steps.items(), key=lambda kv: kv[1][0]):
            span = busy.span
            out.append({"step": name, "cpu_us": float(cpu_us), "gpu_events": kernels, "gpu_span_us": float(span),
                        "gpu_busy_us": float(busy.covered), "gpu_idle_us": float(span - busy.covered),
                        "compute_us": float(compute.covered)})
        return out

    # -- checkpoints (JSON-able) ---------------------------------------------------------------
    def to_state(self) -> dict:
        return {"current": self.current,
                "steps": {name: [s[0], s[1], s[2], s[3].to_state(), s[4].to_state()] for name, s in self.steps.items()}}

    @classmethod
    def from_state(cls, state: dict) -> Steps:
        st = cls()
        st.current = state["current"]
        for name, (start, cpu_us, kernels, busy, compute) in state["steps"].items():
            st.steps[name] = [start, cpu_us, kernels, Coverage.from_state(busy), Coverage.from_state(compute)]
        return st
