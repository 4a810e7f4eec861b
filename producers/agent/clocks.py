"""The agent's two clocks: its loop times the ticks on the monotonic clock (``run_agent`` gives
each tick the seconds since the last, as measured), and its samples are placed on the wall clock,
as the scheduler's start and end of a job are. Where the wall clock steps between two ticks (NTP,
a VM's time sync), the two disagree, and a sample of the measured interval would leave the step
uncovered (forward) or cover time twice (back) against the scheduler's times: a job charged
short of, or past, the GPU-seconds its scheduler accounts."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def tick_interval(last_tick_ms: int | None, now_ms: int, measured_ms: int) -> int:
    """The time a tick's samples stand for, on the wall clock that places them. A step within
    one interval is absorbed: the samples run from the last tick's time to this one's. A longer
    one (a clock set by hours, or back past the last tick) is no GPU time: the samples keep the
    measured interval, and the log says how far the clock moved."""
    if last_tick_ms is None:
        return measured_ms
    since = now_ms - last_tick_ms
    if 0 < since <= 2 * measured_ms:
        return since
    log.warning("the wall clock moved %+.1f s in %.1f s since the agent's last tick: its samples stand for the "
                "%.1f s that passed; the time between is no sample's", (since - measured_ms) / 1000,
                measured_ms / 1000, measured_ms / 1000)
    return measured_ms
