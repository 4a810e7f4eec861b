"""What a trace analysis is: the protocol every analysis of ``ANALYSES`` (``streams.traces.analyze``)
follows, so that ``TraceAnalyzer`` feeds, checkpoints and reads them all the same way.

An analysis owns its state. It is fed ``EventBatch`` es (a run of the trace's events in start
order, as columns, with each GPU-side event joined to its runtime call), reads the columns it
needs and keeps what it needs of them; its ``to_state`` is its part of a session's checkpoint
(the top-level keys it owns, JSON-able), ``from_state`` reads them back (from a checkpoint of any
release still supported: a key missing from an older one starts the analysis empty), and
``result`` gives its entries of the trace's result. An analysis that says something of the runtime
calls the GPU-side events are joined to (the operator a call was made from, the step it was made
in) does so in ``label_calls``, which the analyzer runs on a batch before the join.

Adding an analysis: its module (the class, with these methods), its entry in ``ANALYSES``, its
figures in ``trace_analysis_record`` if they go on the wire, and its test.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, Self

import msgspec

from streams.traces.batch import EventBatch


class Options(msgspec.Struct, frozen=True):
    """What an analysis may be configured by."""

    horizon_us: float  # a runtime call whose GPU event has not come within this long never will


class Finished(msgspec.Struct):
    """What an analysis' ``result`` may read besides its own state."""

    gpu_name: str | None  # the trace's GPU (the roofline's peaks)
    analyses: dict[type, Any]  # every analysis of the trace, by class (one may read another's figures)


class TraceAnalysis(Protocol):
    @classmethod
    def create(cls, options: Options) -> Self: ...

    def add(self, batch: EventBatch) -> None: ...

    def result(self, finished: Finished) -> dict: ...

    def to_state(self) -> dict: ...

    @classmethod
    def from_state(cls, state: dict, options: Options) -> Self: ...


class CallLabels(Protocol):
    """An analysis that says something of runtime calls: ``label_calls`` sets
    ``batch.labels[label]`` (row -> value, CPU-side rows) before the join."""

    label: ClassVar[str]

    def label_calls(self, batch: EventBatch) -> None: ...
