"""Roofline per operator: where the trace counts an operator's FLOPs (the profiler's
``with_flops=True``; its bytes from ``record_shapes=True``), its achieved TFLOP/s and
bandwidth on the GPU against the GPU's peaks, whether it is compute- or memory-bound, and the
GPU time at stake if it reached 70 % of its roof.

An operator's GPU time is that of the kernels launched from inside it: a CUDA runtime call
belongs to the innermost operator with FLOPs open on its CPU thread when it was made (the
operators of a thread nest), and the kernel of that call (by correlation id) to the call.
The roof of an operator is ``min(peak TFLOP/s at its precision, intensity x peak bandwidth)``,
intensity being its FLOPs per byte; it is compute-bound at or above the ridge point
(peak TFLOP/s over peak bandwidth), memory-bound below. Bytes are those of its inputs and,
for matrix multiplications and element-wise operators, its output (``read_trace.operator_bytes``):
a lower bound, so an intensity may read high.

State: per operator name its totals, and per CPU thread the operators still open.
"""

from __future__ import annotations

from schemas.gpu_peaks import peak_memory_gbps, peak_tflops
from streams.traces.analysis import Finished, Options
from streams.traces.batch import EventBatch

# What an operator should reach: the time at stake is what it would save at this share of its roof.
ROOF_TARGET = 0.7
TOP_OPERATORS = 10


class OperatorRoofline:
    def __init__(self) -> None:
        self.open: dict[int, list[list]] = {}  # thread -> [[end, name], ...], innermost last
        # name -> [calls, flops, bytes (0 where unknown), calls with bytes, GPU time, {precision: flops}]
        self.ops: dict[str, list] = {}

    @classmethod
    def create(cls, options: Options) -> OperatorRoofline:
        return cls()

    label = "op"

    def label_calls(self, batch: EventBatch) -> None:
        """The operators of the batch that count their FLOPs, and for each runtime call the
        operator it was made from (``batch.labels[label]``)."""
        extras = batch.extras
        counted = [i for i, x in extras.items() if x.get("flops")]
        if not counted and not self.open:
            return  # (no operator open, none opening: the rows need not be looked at)
        ops: dict[int, str] = {}
        kinds, names, starts, durs, tids = batch.kind, batch.name, batch.ts, batch.dur, batch.tid
        for i, stream in enumerate(batch.stream):
            if stream >= 0:
                continue
            kind = kinds[i]
            if kind == "runtime":
                if self.open:
                    op = self._call(tids[i], starts[i])
                    if op is not None:
                        ops[i] = op
            elif kind == "cpu_op":
                x = extras.get(i)
                if x is not None and x.get("flops"):
                    self._operator(names[i], starts[i], durs[i], tids[i], x)
        batch.labels[self.label] = ops

    def _operator(self, name: str, ts: float, dur: float, tid: int, x: dict) -> None:
        """An operator that counts its FLOPs: opened on its thread, counted."""
        flops = x["flops"]
        stack = self.open.setdefault(tid, [])
        _close(stack, ts)
        stack.append([ts + dur, name])
        op = self.ops.get(name)
        if op is None:
            op = self.ops[name] = [0, 0, 0, 0, 0.0, {}]
        op[0] += 1
        op[1] += flops
        if x.get("op_bytes"):
            op[2] += x["op_bytes"]
            op[3] += 1
        precision = x.get("precision") or "unknown"
        op[5][precision] = op[5].get(precision, 0) + flops

    def _call(self, tid: int, ts: float) -> str | None:
        """A runtime call: the innermost operator open on its thread."""
        stack = self.open.get(tid)
        if not stack:
            return None
        _close(stack, ts)
        return stack[-1][1] if stack else None

    def add(self, batch: EventBatch) -> None:
        """The batch's GPU-side events launched from inside an operator: its GPU time."""
        ops = self.ops
        if not ops:
            return
        for call, ts, end in zip(batch.calls, batch.g_ts, batch.g_end):
            if call is not None and call.op is not None:
                ops[call.op][4] += end - ts

    def result(self, finished: Finished) -> dict:
        return {"operators": self.rows(finished.gpu_name)}

    def rows(self, gpu_name: str | None) -> list[dict]:
        rows = []
        bandwidth = peak_memory_gbps(gpu_name)
        for name, (calls, flops, nbytes, with_bytes, gpu_us, precisions) in self.ops.items():
            if gpu_us <= 0:
                continue
            precision = max(precisions, key=precisions.get)
            peak = peak_tflops(gpu_name, precision)
            tflops = flops / (gpu_us * 1e-6) / 1e12
            known_bytes = nbytes if with_bytes == calls else None  # every call's shapes, or no bytes
            row = {"name": name, "calls": calls, "flops": flops, "bytes": known_bytes, "gpu_time_us": float(gpu_us),
                   "precision": precision, "achieved_tflops": tflops,
                   "achieved_gbps": None if known_bytes is None else known_bytes / (gpu_us * 1e3),
                   "intensity": None if not known_bytes else flops / known_bytes,
                   "peak_tflops": peak, "peak_gbps": bandwidth, "bound": None, "roof_tflops": None,
                   "roof_pct": None, "at_stake_us": 0.0}
            if peak:
                roof = peak
                if row["intensity"] is not None and bandwidth:
                    memory_roof = row["intensity"] * bandwidth / 1e3  # FLOP/B x GB/s = GFLOP/s -> TFLOP/s
                    row["bound"] = "compute" if memory_roof >= peak else "memory"
                    roof = min(peak, memory_roof)
                row["roof_tflops"] = roof
                row["roof_pct"] = 100.0 * tflops / roof
                target_us = flops / (ROOF_TARGET * roof * 1e12) * 1e6
                row["at_stake_us"] = max(0.0, gpu_us - target_us)
            rows.append(row)
        rows.sort(key=lambda r: (-r["gpu_time_us"], r["name"]))
        return rows[:TOP_OPERATORS]

    # -- checkpoints (JSON-able) ---------------------------------------------------------------
    def to_state(self) -> dict:
        return {"roofline": {"open": {str(t): s for t, s in self.open.items() if s}, "ops": self.ops}}

    @classmethod
    def from_state(cls, state: dict, options: Options) -> OperatorRoofline:
        r = cls()
        state = state.get("roofline")
        if state is None:  # (a session checkpointed before the roofline)
            return r
        r.open = {int(t): [list(x) for x in s] for t, s in state["open"].items()}
        r.ops = {name: list(op) for name, op in state["ops"].items()}
        return r


def _close(stack: list[list], now: float) -> None:
    """Pop the operators that ended before ``now``."""
    while stack and stack[-1][0] <= now:
        stack.pop()
