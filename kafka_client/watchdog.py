"""A component whose consume loop stops going round ends, with every thread's stack on stderr,
so that its supervisor (systemd, Kubernetes, Docker's restart policy) starts it again: a reader
stuck for good holds its partitions' data back from everyone, and nothing else would tell.

What it is for: librdkafka can wait for good inside a call that confluent-kafka makes while
holding the GIL (a rebalance served while a group coordinator is unreachable: ``leave_group.py``
names the defect). No thread of the process runs then, signal handlers included, so the watchdog
is the interpreter's own ``faulthandler`` timer: a C thread that needs no GIL to write the stacks
and end the process (exit status 1). Its timer is one per process: a ``Watchdog`` belongs to the
one component a ``gpufleet`` command runs, never to a library's threads (a test's, the soak's).

The loop says it is alive at each round (``alive``); the timer is set again at most ten times per
``stall_s`` (setting it starts a thread), to ``1.1 * stall_s``: the process ends between
``stall_s`` and ``1.1 * stall_s`` after the loop last went round.

The Faust worker's loop is asyncio's: a timer of its own says it is alive, and ``Progress`` tells
it where the loop still runs but a partition no longer moves (``streams.topology``).
"""

from __future__ import annotations

import faulthandler
import sys
import time
from collections.abc import Callable


class Watchdog:
    def __init__(self, stall_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not stall_s > 0:
            raise ValueError(f"a watchdog's stall_s must be a positive number of seconds, not {stall_s!r}")
        self.stall_s, self.clock = stall_s, clock
        self._set_at: float | None = None

    def alive(self) -> None:
        """The loop went round: the process ends if it does not again within ``stall_s``."""
        now = self.clock()
        if self._set_at is None or now - self._set_at >= self.stall_s / 10:
            # (the process's own stderr: a Faust worker's sys.stderr is a proxy to its log, with no file)
            faulthandler.dump_traceback_later(self.stall_s * 1.1, exit=True, file=sys.__stderr__)
            self._set_at = now

    def stop(self) -> None:
        """The loop ended as asked: no timer is left."""
        faulthandler.cancel_dump_traceback_later()
        self._set_at = None


class Progress:
    """Whether a consumer that keeps going round still moves its partitions on (the Faust
    worker's, whose loop is asyncio's: a stream that waits for good inside a coroutine leaves
    the loop, its timers and its heartbeats running, so the group keeps the partitions with it).

    Each ``check`` is given, per partition the consumer owns, the messages it has yet to process
    and where they start (its committed offset); a partition is stuck where messages have waited
    ``stall_s`` without that offset moving. A rebalance (or the recovery of its state) that has
    lasted ``stall_s`` is stuck too: its partitions are read by no one meanwhile."""

    def __init__(self, stall_s: float) -> None:
        if not stall_s > 0:
            raise ValueError(f"stall_s must be a positive number of seconds, not {stall_s!r}")
        self.stall_s = stall_s
        self._moved: dict[tuple[str, int], tuple[int, float]] = {}  # partition -> (start offset, since when)
        self._moving_since: float | None = None

    def check(self, now: float, lags: dict[tuple[str, int], tuple[int, int]] | None) -> str | None:
        """What is stuck, said for a log, or None. ``lags``: partition -> (messages not processed,
        the offset they start at); None while the consumer rebalances or recovers its state."""
        if lags is None:
            if self._moving_since is None:
                self._moving_since = now
            self._moved.clear()  # (its partitions are given again, each from its assignment)
            if now - self._moving_since >= self.stall_s:
                return f"a rebalance or the recovery of the state has lasted {now - self._moving_since:.0f} s"
            return None
        self._moving_since = None
        for tp in self._moved.keys() - lags.keys():
            del self._moved[tp]  # (no longer this consumer's)
        stuck = []
        for tp, (lag, start) in lags.items():
            before = self._moved.get(tp)
            if lag <= 0 or before is None or before[0] != start:
                self._moved[tp] = (start, now)
            elif now - before[1] >= self.stall_s:
                stuck.append(f"{tp[0]}[{tp[1]}] ({lag} messages waiting at offset {start} for "
                             f"{now - before[1]:.0f} s)")
        return "partitions stuck: " + ", ".join(sorted(stuck)) if stuck else None
