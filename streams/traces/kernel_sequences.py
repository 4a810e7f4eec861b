"""Frequent CUDA kernel sequences (HTA's ``get_frequent_cuda_kernel_sequences``): for a CPU
operator name, the sequences of GPU operations its calls launched, how often each came, and
their GPU and CPU time. A sequence that comes again and again is a candidate for fusion
(``torch.compile``, a fused kernel) or for a CUDA graph.

HTA's definition, in our words: the operators are the CPU events whose name contains the given
name; of them only those at the smallest nesting depth any of them has on its thread count (a
match inside another match is never counted twice), and only those that launched at least
``min_length`` GPU operations. An operator's sequence is its name and the names of every GPU
event launched from inside it (kernels, copies, memsets, a stream's wait for an event), in start
order; sequences are counted, and each one's GPU time (the sum of its GPU events) and CPU time
(the operator's duration) added up.

In one pass: each thread keeps its stack of open CPU events, a runtime call is charged to the
open match of each name on its thread, and a match is folded into its sequence's counts once its
CPU event has ended and every call it made has its GPU event; what is held is the open matches
and the counts, per nesting depth until the smallest is known. The depth counts the CPU events
the reader keeps (operators, annotations, runtime calls), not Python function events: in a
trace recorded ``with_stack=True`` HTA's depths count those too, which matters only where
matches sit at different depths.
"""

from __future__ import annotations

from collections import deque

from streams.traces.batch import EventBatch

MIN_LENGTH = 3
TOP = 10


class _Match:
    __slots__ = ("calls", "cpu_us", "depth", "ended", "gpu", "gpu_us", "name", "op")

    def __init__(self, op: _Operator, name: str, depth: int, cpu_us: float) -> None:
        self.op, self.name, self.depth, self.cpu_us = op, name, depth, cpu_us
        self.gpu: list[str] = []
        self.gpu_us = 0.0
        self.calls = 0  # its runtime calls whose GPU event has not come
        self.ended = False


class _Operator:
    """The counts of one operator name."""

    def __init__(self, name: str, min_length: int) -> None:
        self.name, self.min_length = name, min_length
        self.min_depth: int | None = None
        # depth -> sequence -> [count, GPU us, CPU us]; only depths not above the smallest seen
        self.sequences: dict[int, dict[tuple[str, ...], list[float]]] = {}

    def seen_at(self, depth: int) -> None:
        if self.min_depth is None or depth < self.min_depth:
            self.min_depth = depth
            for d in [d for d in self.sequences if d > depth]:  # deeper: never counted
                del self.sequences[d]

    def fold(self, m: _Match) -> None:
        if len(m.gpu) < self.min_length or m.depth > self.min_depth:
            return
        row = self.sequences.setdefault(m.depth, {}).setdefault((m.name, *m.gpu), [0, 0.0, 0.0])
        row[0] += 1
        row[1] += m.gpu_us
        row[2] += m.cpu_us


class KernelSequences:
    """The analyser: fed every event of a rank in start order (CPU operators included)."""

    def __init__(self, operators: list[str], horizon_us: float, min_length: int = MIN_LENGTH) -> None:
        """``horizon_us``: how long after a call its GPU event is waited for (trace time), as the
        analysis joins a kernel to its launch (``TraceAnalyzer``'s horizon): many runtime calls
        launch nothing (cudaGetDevice, cudaEventRecord...), and their matches must not wait for ever."""
        self.horizon_us = horizon_us
        self.operators = [_Operator(name, min_length) for name in dict.fromkeys(operators) if name]
        # tid -> the open CPU events: (end, the open match of each name, the matches the event opened)
        self.stacks: dict[int, list[tuple[float, list[_Match | None], list[_Match]]]] = {}
        self.by_call: dict[int, list[_Match]] = {}  # correlation -> the matches its call was made in
        self.call_order: deque[tuple[float, int]] = deque()  # (ts, correlation) of the calls in by_call

    def add(self, b: EventBatch) -> None:
        """The next events of the trace, in start order: one by one (an operator's sequence is
        what its calls launched, in order), over the batch's columns."""
        for kind, name, ts, dur, stream, corr, tid in zip(b.kind, b.name, b.ts, b.dur, b.stream, b.correlation, b.tid):
            if stream >= 0:
                if corr >= 0:
                    self._launched(corr, name, dur)
            elif kind != "sync":  # (a device-wide sync event: on no stream, launched by no operator)
                self._cpu(name, ts, dur, corr, tid)

    def _launched(self, corr: int, name: str, dur: float) -> None:
        """A GPU event: it belongs to the matches its runtime call was made in."""
        for m in self.by_call.pop(corr, ()):
            m.gpu.append(name)
            m.gpu_us += dur
            m.calls -= 1
            if m.ended and not m.calls:
                m.op.fold(m)

    def _cpu(self, name: str, ts: float, dur: float, corr: int, tid: int) -> None:
        """A CPU event (operator, annotation or runtime call): it ends what ended before it on its
        thread, and is charged to the open matches it was made in."""
        self._expire(ts)
        stack = self.stacks.setdefault(tid, [])
        while stack and stack[-1][0] <= ts:
            self._end(stack.pop()[2])
        inherited = stack[-1][1] if stack else [None] * len(self.operators)
        if corr >= 0:
            calling = [m for m in inherited if m is not None]
            if calling:
                self.by_call[corr] = calling
                self.call_order.append((ts, corr))
                for m in calling:
                    m.calls += 1
        own, opened = inherited, []
        for i, op in enumerate(self.operators):
            if op.name in name:
                op.seen_at(len(stack))
                if inherited[i] is None:  # (a match inside a match is deeper: never counted)
                    if own is inherited:
                        own = list(inherited)
                    own[i] = _Match(op, name, len(stack), dur)
                    opened.append(own[i])
        stack.append((ts + dur, own, opened))

    def _expire(self, now: float) -> None:
        """Calls made more than the horizon ago with no GPU event: nothing to wait for."""
        order = self.call_order
        while order and order[0][0] < now - self.horizon_us:
            for m in self.by_call.pop(order.popleft()[1], ()):
                m.calls -= 1
                if m.ended and not m.calls:
                    m.op.fold(m)

    @staticmethod
    def _end(opened: list[_Match]) -> None:
        """An event ended: the matches it opened are folded once their GPU events have come."""
        for m in opened:
            m.ended = True
            if not m.calls:
                m.op.fold(m)

    def result(self) -> dict:
        """Per operator name: its sequences, most frequent first (at most ``TOP``). Matches
        whose calls' GPU events never came (a trace cut short) are counted as they are."""
        for stack in self.stacks.values():
            while stack:
                for m in stack.pop()[2]:
                    m.op.fold(m)
        self.stacks.clear()
        waiting = {id(m): m for matches in self.by_call.values() for m in matches}
        self.by_call.clear()
        self.call_order.clear()
        for m in waiting.values():
            m.calls = 0
            if m.ended:
                m.op.fold(m)
        out = {}
        for op in self.operators:
            rows = op.sequences.get(op.min_depth, {}) if op.min_depth is not None else {}
            ordered = sorted(rows.items(), key=lambda kv: (-kv[1][0], "|".join(kv[0])))
            out[op.name] = {
                "depth": op.min_depth,
                "sequences": len(rows),
                "top": [{"sequence": list(seq), "count": int(c), "gpu_us": g, "cpu_us": cpu}
                        for seq, (c, g, cpu) in ordered[:TOP]],
            }
        return out
