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
            faulthandler.dump_traceback_later(self.stall_s * 1.1, exit=True, file=sys.stderr)
            self._set_at = now

    def stop(self) -> None:
        """The loop ended as asked: no timer is left."""
        faulthandler.cancel_dump_traceback_later()
        self._set_at = None
