"""The host agent's loop: a tick every interval, faster while a profile is captured, with the
forwarder sending the spool to Kafka in a thread."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from producers.agent.host_agent import HostAgent

log = logging.getLogger(__name__)


def run_agent(agent: HostAgent, forwarder, stop, drain_timeout_s: float = 30.0,
              profiling: Callable[[], bool] | None = None, clock: Callable[[], float] = time.monotonic,
              wake=None) -> None:
    """Tick every interval until ``stop`` is set, with the forwarder sending in a thread;
    then send everything spooled (up to ``drain_timeout_s``). While ``profiling()`` says a
    profile is being captured here, tick at the settings' ``profile_interval_s`` instead, so
    the analysis sees GPU and host metrics at the trace's time scale.

    Each tick's samples stand for the time since the previous tick, measured: a host whose
    tick takes longer than the interval (eight pre-Hopper GPUs spend ~0.4 s in NVML's PCIe
    counters alone, too slow for 10 Hz) samples less often instead of under-counting its
    GPU-seconds, and a late tick is not followed by a burst of catch-up ticks. (Measured on the
    monotonic clock; where the wall clock that places the samples stepped meanwhile, the agent
    reconciles the two: ``producers.agent.clocks``.)

    ``wake`` (a ``threading.Event``): set when a capture starts, it ends the wait for the next
    tick at once, so a capture shorter than the normal interval is still sampled at 10 Hz.

    Build the agent with the forwarder's ``hurry`` in its links (``AgentLinks``), so that a
    job's end goes out at once rather than at the next send."""
    import threading

    sending = threading.Event()
    thread = threading.Thread(target=forwarder.run, args=(sending,), name="forwarder", daemon=True)
    thread.start()
    next_tick = clock()
    last = None
    fast = False
    try:
        while not stop.is_set():
            was_fast, fast = fast, bool(profiling and profiling())
            if fast != was_fast:
                log.info("profile %s: sampling every %gs", "started" if fast else "ended",
                         agent.settings.profile_interval_s if fast else agent.settings.interval_s)
            interval = agent.settings.profile_interval_s if fast else agent.settings.interval_s
            now = clock()
            agent.tick(interval if last is None else now - last)
            last = now
            next_tick = max(next_tick + interval, clock())
            delay = max(0.0, next_tick - clock())
            if wake is None:
                stop.wait(delay)
            elif wake.wait(delay):
                wake.clear()
                next_tick = clock()  # a capture started: sample it from now on
    finally:
        agent.stop()  # what it holds is spooled: the samples stand for the time they were taken
        sending.set()
        thread.join(10)
        if not forwarder.drain(drain_timeout_s):
            log.warning("%d records are still spooled; they will be sent when the agent starts again",
                        agent.spool.pending())
        agent.spool.close()
