"""Per-trace analysis sessions over the ``KernelEvent`` stream -> ``TraceAnalysis`` records.

Plain logic, no Faust: the worker feeds decoded records per partition and persists the
states this reports as changed. A trace's session starts with its first event, applies
events in ``seq`` order (``KernelEventColumns`` batches, or ``KernelEvent`` records of older
agents; a replay after a crash is skipped, a gap is remembered), and ends
with its ``TraceEnd`` marker, or after ``timeout_ms`` of wall time without events. An ended
trace leaves a small "done" marker for ``done_retention_ms`` so that a replayed tail does
not start it again.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field

from streams.alerts.detectors import DEFAULTS, DetectorConfig
from streams.traces.analyze import TraceAnalyzer, findings_records, trace_analysis_record
from streams.traces.batch import EventBatch


@dataclass(frozen=True)
class TraceSessionConfig:
    timeout_ms: int = 300_000
    done_retention_ms: int = 3_600_000


@dataclass
class SessionResult:
    analyses: list[dict] = field(default_factory=list)
    findings: list[dict] = field(default_factory=list)
    changed: set[str] = field(default_factory=set)
    removed: dict[str, int] = field(default_factory=dict)  # trace id -> its changelog partition
    replayed: int = 0


class TraceSessions:
    def __init__(self, config: TraceSessionConfig, store: MutableMapping[str, dict],
                 thresholds: DetectorConfig = DEFAULTS.default) -> None:
        self.config = config
        self.thresholds = thresholds  # the trace rules' (the worker's: the site's default)
        self.store = store
        self._live: dict[str, TraceAnalyzer] = {}  # analysers of open traces, rebuilt from the store on demand

    def forget(self) -> None:
        """Drop in-memory analysers (after a rebalance); they are rebuilt from the store."""
        self._live.clear()

    def _analyzer(self, trace_id: str, state: dict) -> TraceAnalyzer:
        a = self._live.get(trace_id)
        if a is None:
            a = TraceAnalyzer.from_state(state["analyzer"]) if state.get("analyzer") else TraceAnalyzer()
            self._live[trace_id] = a
        return a

    def apply(self, partition: int, records: list[tuple[str, dict]], now_ms: int) -> SessionResult:
        """Apply ``(schema name, record)`` pairs of one partition, in offset order. A trace's events
        are analysed a batch at a time: those the records bring for it, up to its end."""
        result = SessionResult()
        waiting: dict[str, list] = {}  # trace id -> its events not yet analysed (batches and KernelEvent records)
        for name, r in records:
            tid = r["trace_id"]
            state = self.store.get(tid)
            if state is not None and state.get("done"):
                result.replayed += 1
                continue
            if state is None:
                state = {"partition": partition, "workflow_id": r["workflow_id"], "rank": r["rank"],
                         "next_seq": 0, "missing": 0, "analyzer": None}
                self.store[tid] = state
            state["updated_ms"] = now_ms
            result.changed.add(tid)
            if name == "TraceEnd":
                self._analyse(tid, state, waiting.pop(tid, ()))
                state["missing"] += max(0, r["events"] - state["next_seq"])
                self._finish(tid, state, now_ms, result, end=r)
                continue
            first, n = (r["seq"], 1) if name == "KernelEvent" else (r["first_seq"], len(r["ts"]))
            if first + n <= state["next_seq"]:
                result.replayed += 1
                continue
            skip = max(0, state["next_seq"] - first)  # (events of a batch seen before a crash)
            state["missing"] += max(0, first - state["next_seq"])
            state["next_seq"] = first + n
            waiting.setdefault(tid, []).append(r if name == "KernelEvent" else EventBatch.of_columns(r, skip))
        for tid, events in waiting.items():
            self._analyse(tid, self.store[tid], events)
        for tid in result.changed:
            state = self.store[tid]
            if not state.get("done"):
                state["analyzer"] = self._analyzer(tid, state).to_state()
        return result

    def _analyse(self, tid: str, state: dict, events: list) -> None:
        """Feed a trace's waiting events to its analyser: runs of KernelEvent records as one batch each."""
        analyzer, records = self._analyzer(tid, state), []
        for e in events:
            if isinstance(e, EventBatch):
                if records:
                    analyzer.add_batch(EventBatch.of_records(records))
                    records = []
                analyzer.add_batch(e)
            else:
                records.append(e)
        if records:
            analyzer.add_batch(EventBatch.of_records(records))

    def expire(self, now_ms: int) -> SessionResult:
        """End traces silent for longer than the timeout; forget old done markers."""
        result = SessionResult()
        cfg = self.config
        for tid, state in list(self.store.items()):
            if not isinstance(state, dict):
                continue
            if state.get("done"):
                if now_ms - state["updated_ms"] > cfg.done_retention_ms:
                    result.removed[tid] = state["partition"]
                    del self.store[tid]
            elif now_ms - state["updated_ms"] > cfg.timeout_ms:
                reason = (f"no end-of-trace marker within {cfg.timeout_ms / 1000:g} s; analysed the "
                          f"{state['next_seq'] - state['missing']} events received")
                self._finish(tid, state, now_ms, result, timeout_reason=reason)
                result.changed.add(tid)
        return result

    def _finish(self, tid: str, state: dict, now_ms: int, result: SessionResult, end: dict | None = None,
                timeout_reason: str | None = None) -> None:
        analyzer = self._analyzer(tid, state)
        reasons = []
        if end is not None and end.get("error"):
            reasons.append(end["error"])
        if state["missing"]:
            reasons.append(f"{state['missing']} events never arrived")
        if timeout_reason:
            reasons.append(timeout_reason)
        partial = bool(reasons) or bool(end and end["partial"])
        analysis = analyzer.result(end.get("gpu_name") if end else None)
        record = trace_analysis_record(
            analysis, trace_id=tid, workflow_id=state["workflow_id"], rank=state["rank"],
            source=end["source"] if end else None, partial=partial,
            error="; ".join(reasons) if reasons else None, analyzed_at=now_ms,
            system=end.get("system") if end else None,
            flops=end.get("flops") if end else None, gpu_name=end.get("gpu_name") if end else None,
        )
        memory = None
        if end is not None and end.get("memory_peak_bytes") is not None:
            memory = {"peak_bytes": end["memory_peak_bytes"], "total_bytes": end.get("memory_total_bytes")}
        result.analyses.append(record)
        result.findings.extend(findings_records(analysis, record, memory, now_ms, self.thresholds))
        self._live.pop(tid, None)
        partition = state["partition"]
        state.clear()
        state.update(done=True, updated_ms=now_ms, partition=partition)
