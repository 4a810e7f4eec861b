"""The worker's stages and the topics between them, in flow order. Each stage is a module of
``streams.stages`` with a ``register`` (its agents, timers and tables on the Faust app) that
reads its topics, calls the stage's plain logic and sends what it returns; ``streams.stages.io``
is what they share.

    gpu-samples ─┐                      ┌─▶ workflow-windows, workflow-summaries
    workflow-events ─▶ windows ─────────┼─▶ alerts, profile-requests (automatic)
    profile-results ─┘ (stages.windows) └─▶ profile-schedule (what runs where)
    kernel-events ───▶ traces ──────────▶ trace-analyses, findings, profile-results, profile-statuses
                        (stages.traces)
    trace-analyses ──▶ comparison ──────▶ findings (slower than the rank's previous profile; a straggler rank)
                        (stages.comparison)
    profile-schedule ▶ scheduler ───────▶ profile-requests (periodic)
                        (stages.profile_schedule)

Every stage sends what it cannot use to dead-letters, with the reason.
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable

import faust

from kafka_client.watchdog import Progress, Watchdog
from schemas.codec import Codec
from streams import faust_fixes
from streams.settings import StreamSettings
from streams.stages import comparison as profile_comparison
from streams.stages import profile_schedule as scheduler
from streams.stages import traces, windows
from streams.stages.io import METRICS

log = logging.getLogger(__name__)

STAGES = (windows, traces, profile_comparison, scheduler)


LAG_EVERY_S = 5.0


def register(app: faust.App, settings: StreamSettings) -> None:
    """Add every stage's agents, timers and tables to ``app``, and the timer that keeps the
    worker's consumer lag metric (``streams.stages.io.METRICS``) current."""
    codec = Codec()
    for stage in STAGES:
        stage.register(app, settings, codec)

    @app.timer(interval=LAG_EVERY_S)
    async def consumer_lag() -> None:
        if not app.rebalancing:
            METRICS.set_lag(worker_lag(app))

    if settings.stall_exit_s > 0:
        watchdog = Watchdog(settings.stall_exit_s)
        watchdog.alive()  # (from here: a worker whose loop never starts its timers ends too)
        watch = stalls(app, watchdog, Progress(settings.stall_exit_s))
        app.timer(interval=min(LAG_EVERY_S, settings.stall_exit_s / 10))(watch)


def stalls(app: faust.App, watchdog: Watchdog, progress: Progress) -> Callable[[], Awaitable[None]]:
    """The timer that ends a worker that no longer moves (``kafka_client.watchdog``): each time it
    runs it says the loop is alive (where it stops running, the watchdog ends the process), and
    where a partition has had messages waiting without moving on for the stall time, or a
    rebalance has lasted it, it logs what is stuck with every task's stack and ends the process
    (exit status 1) for its supervisor to start it again: its partitions then go to the group."""

    async def watch() -> None:
        watchdog.alive()
        moving = app.rebalancing or app.in_recovery
        stuck = progress.check(time.monotonic(), None if moving else worker_positions(app))
        if stuck is None:
            return
        log.error("the worker no longer moves: %s; it ends for its supervisor to start it again", stuck)
        stderr = sys.__stderr__  # (the process's own: Faust's sys.stderr is a proxy to its log, with no file)
        for task in asyncio.all_tasks():
            print(f"Task {task.get_name()} waits in (outermost first):", *awaiting(task), sep="\n", file=stderr)
        stderr.flush()
        faulthandler.dump_traceback(file=stderr, all_threads=True)
        os._exit(1)

    return watch


def awaiting(task: asyncio.Task) -> list[str]:
    """Where ``task`` waits, each coroutine of its chain of awaits (into the tasks it awaits),
    outermost first, as a traceback says them (``Task.print_stack`` shows a waiting task's
    outermost frame only)."""
    lines, coro = [], task.get_coro()
    for _ in range(100):  # (a chain is a few deep; a cycle is not followed for good)
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if frame is None:
            break
        lines.append(f'  File "{frame.f_code.co_filename}", line {frame.f_lineno}, in {frame.f_code.co_name}')
        coro = _awaited(coro)
    return lines


def _awaited(coro) -> object | None:
    """What ``coro`` awaits, as a coroutine (or generator) with a frame, or None. An awaitable
    object's ``__await__`` (Faust's actors) and a future's are iterators that say nothing of what
    they wrap: the coroutine, or the task's, is found among what they hold."""
    awaited = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)
    if awaited is None or any(hasattr(awaited, a) for a in ("cr_frame", "gi_frame", "ag_frame")):
        return awaited
    for held in [awaited, *gc.get_referents(awaited)]:
        if isinstance(held, asyncio.Task):
            return held.get_coro()
        if asyncio.iscoroutine(held):
            return held
    return None


def worker_lag(app: faust.App) -> dict[tuple[str, int], int]:
    """Per stream partition this worker owns: the messages past its committed offset."""
    return {tp: lag for tp, (lag, _) in worker_positions(app).items()}


def worker_positions(app: faust.App) -> dict[tuple[str, int], tuple[int, int]]:
    """Per stream partition this worker owns: the messages past its committed offset, and that
    offset (the tables' changelogs, which it only reads while it recovers, are left out)."""
    consumer, changelogs = app.consumer, app.tables.changelog_topics
    positions = {}
    for tp in consumer.assignment():
        if tp.topic in changelogs:
            continue
        high, start = consumer.highwater(tp), faust_fixes.start_offset(consumer, tp)
        if high is not None and high >= 0 and start is not None and start >= 0:
            positions[(tp.topic, tp.partition)] = (max(0, high - start), start)
    return positions
