"""The samples of GPUs a scheduler allocates, held for a few seconds before they are spooled, so
that each GPU-millisecond is charged to whoever held the GPU then, as the scheduler says.

The scheduler's word comes a moment late: Slurm runs the epilog after the job's end (0.4–1.1 s
after it on a quiet node) and the agent reads its record at its next tick, so the samples of
the ticks between would charge the job past its end; a job's prolog record, likewise, is read
after its start, while the agent still counts its GPUs as nobody's. Held ``hold_ms``, a tick's
samples are cut when an end or a start becomes known:

- a job's samples after its end are cut to end there; what is cut off is the GPU's
  ``unallocated`` time;
- ``unallocated`` samples after a job's start on the GPUs it was given (and the job's own,
  where its processes named it before its allocation was read) are cut to end there (the job's
  first sample reaches back to its start: ``host_agent``).

A sample covers ``(event_time - interval_ms, event_time]``; a cut one ends at the cut. Samples
held when the agent dies are never spooled: the time they stood for is counted as the job's
unobserved time when it starts again (``producers.agent.checkpoint``). Past ``hold_ms`` a sample
is spooled as it is: an end the scheduler tells later than that cannot trim it (the agent logs
how much it charged past the end).
"""

from __future__ import annotations

from collections import deque

from schemas.validate_sample import UNALLOCATED

# What an unallocated sample knows of no job: the fields a cut-off part drops.
_JOB_FIELDS = ("owner", "team", "rank", "foreign_workflow_id", "model_tflops", "allocator_peak_bytes",
               "allocator_reserved_bytes", "workflow_cpu_pct", "workflow_memory_bytes")


def _cut(sample: dict, at: int) -> tuple[dict | None, dict | None]:
    """``sample`` split at ``at``: (the part up to it, the part after it); None where empty."""
    end, interval = sample["event_time"], sample["interval_ms"]
    begin = end - interval
    if at >= end:
        return sample, None
    if at <= begin:
        return None, sample
    return {**sample, "event_time": at, "interval_ms": at - begin}, {**sample, "interval_ms": end - at}


def _unallocated(part: dict) -> dict:
    return {**part, **dict.fromkeys(_JOB_FIELDS), "workflow_id": UNALLOCATED, "process_count": 0,
            "process_memory_bytes": 0, "process_sm_util_pct": None}


class HeldSamples:
    """The samples of the last ``hold_ms``, by tick, oldest first."""

    def __init__(self, hold_ms: int) -> None:
        self.hold_ms = hold_ms
        self._ticks: deque[tuple[int, list[dict]]] = deque()
        self.charged_past_end_ms = 0.0  # GPU-ms an end told too late could not trim (a metric, and a log)

    def add(self, tick_ms: int, samples: list[dict]) -> None:
        self._ticks.append((tick_ms, samples))

    def release(self, now_ms: int) -> list[dict]:
        """The samples whose hold is over, oldest first."""
        out = []
        while self._ticks and self._ticks[0][0] <= now_ms - self.hold_ms:
            out += self._ticks.popleft()[1]
        return out

    def release_all(self) -> list[dict]:
        return self.release(2**62)

    def ended(self, workflow_id: str, end_ms: int) -> list[dict]:
        """A job's end: its held samples cut at ``end_ms`` (the rest of their time is nobody's)
        and taken out, to be spooled before its end; the cut-off parts stay held."""
        out = []
        for _, samples in self._ticks:
            kept = []
            for s in samples:
                if s["workflow_id"] != workflow_id:
                    kept.append(s)
                    continue
                before, after = _cut(s, end_ms)
                if before is not None:
                    out.append(before)
                if after is not None:
                    kept.append(_unallocated(after))
            samples[:] = kept
        return out

    def started(self, workflow_id: str, gpu_uuids: set[str], start_ms: int) -> None:
        """A job's start on ``gpu_uuids``: what held samples counted there after it, as nobody's
        or as the job's by its processes alone (before its allocation was read), is cut off:
        the job's first sample stands for it."""
        for _, samples in self._ticks:
            kept = []
            for s in samples:
                if s["workflow_id"] in (UNALLOCATED, workflow_id) and s["gpu_uuid"] in gpu_uuids:
                    s = _cut(s, start_ms)[0]
                if s is not None:
                    kept.append(s)
            samples[:] = kept

    def newest(self, workflow_id: str) -> int | None:
        """The end of the newest held sample of ``workflow_id`` (None: none held)."""
        times = [s["event_time"] for _, samples in self._ticks for s in samples if s["workflow_id"] == workflow_id]
        return max(times) if times else None
