"""What the window aggregator (``streams.windows.utilization``) is configured with, is given
(``Incoming`` blocks of samples) and gives back (``BatchResult``), and the reasons it refuses
samples with."""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.sample_columns import columns_of
from streams.windows.goodput import GoodputConfig
from streams.windows.record import DEFAULT_GOODPUT

Record = dict


@dataclass(frozen=True)
class WindowConfig:
    size_ms: int = 60_000
    allowed_lateness_ms: int = 10_000
    # Workflows with no open window whose newest sample is this far behind the partition's
    # newest are forgotten (their offsets are too old to be replayed).
    retention_ms: int = 3_600_000
    # A sample this far ahead of the wall clock is refused (a wrong clock or unit).
    max_future_skew_ms: int = 300_000
    # A closed window stays updatable by late samples this long behind the watermark.
    update_horizon_ms: int = 3_600_000
    goodput: GoodputConfig = DEFAULT_GOODPUT  # where each GPU-second went (``streams.windows.goodput``)

    def __post_init__(self) -> None:
        if (self.size_ms <= 0 or self.allowed_lateness_ms < 0 or self.retention_ms <= self.allowed_lateness_ms
                or self.max_future_skew_ms < 0 or self.update_horizon_ms < 0
                or self.retention_ms < self.update_horizon_ms):
            raise ValueError(f"invalid window config {self}")


@dataclass(frozen=True)
class Incoming:
    """A block of samples (``schemas.sample_columns``) with where it came from: its message's
    offset and its index among the blocks of that message; or, ``unobserved``, an
    ``UnobservedTime`` record (GPU time of the job no sample stands for)."""

    offset: int
    record: Record
    index: int = 0
    unobserved: bool = False

    @classmethod
    def row(cls, offset: int, sample: Record, index: int = 0) -> Incoming:
        """One ``GpuSample`` dict as a block of one."""
        (block,) = columns_of([sample])
        return cls(offset, block, index)


@dataclass
class BatchResult:
    closed: list[Record] = field(default_factory=list)
    # Windows completed by late samples, emitted again with a higher version: (new, previous
    # emission or None where the window never closed before, e.g. all its samples were late).
    updated: list[tuple[Record, Record | None]] = field(default_factory=list)
    refused: list[tuple[Incoming, str]] = field(default_factory=list)  # for the dead-letter topic
    replayed: int = 0
    changed: set[str] = field(default_factory=set)  # workflow ids whose state must be persisted
    removed: set[str] = field(default_factory=set)  # workflow ids whose state must be deleted
    # History keys (``history_key``) whose closed window must be persisted, or deleted.
    history_changed: set[str] = field(default_factory=set)
    history_removed: set[str] = field(default_factory=set)


def history_key(workflow_id: str, start: int) -> str:
    return f"{workflow_id}@{start}"


def start_of_key(key: str) -> int:
    return int(key.rpartition("@")[2])


def which(times: list[int], what: str) -> str:
    return (f"{what} sample: event time {times[0]}" if len(times) == 1
            else f"{len(times)} {what} samples: event times {min(times)}..{max(times)}")


def late_reason(times: list[int], start: int, size: int, wf: str, watermark: int, partition: int,
          horizon: int) -> str:
    return (f"{which(times, 'late')} fall{'s' if len(times) == 1 else ''} in window [{start}, {start + size}) "
            f"of workflow {wf}, more than the update horizon ({horizon} ms) behind the watermark {watermark} "
            f"of partition {partition}: no window takes {'it' if len(times) == 1 else 'them'} (a true measurement, "
            f"kept in gpu_samples by the sink)")


def unobserved_late_reason(span: Record, start: int, size: int, watermark: int, horizon: int) -> str:
    return (f"unobserved time of workflow {span['workflow_id']} on {span['host']} from {span['from_time']} to "
            f"{span['to_time']} falls in window [{start}, {start + size}), more than the update horizon "
            f"({horizon} ms) behind the watermark {watermark}: no window takes it")


def future_reason(times: list[int], wf: str, now: int, skew: int) -> str:
    return (f"{which(times, 'future')} of workflow {wf} {'is' if len(times) == 1 else 'are'} "
            f"{max(times) - now} ms ahead of the worker's clock ({now}), more than the allowed "
            f"{skew} ms: the host's clock is wrong or the time is not in epoch milliseconds")
