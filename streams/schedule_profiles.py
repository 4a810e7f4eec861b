"""Which running workflows to profile now: each at most once per interval, never more than a
budget of profiles at once, deterministic under a seed, and restartable from its state.

Plain logic over a JSON-able state, like the alert life cycle, so the worker can keep it in
its changelog table and a restarted worker does not profile again what was just profiled.
Order of preference: workflows never profiled, the longest-known first; then the ones
profiled longest ago; ties broken by a hash of (seed, workflow), so a fleet's schedule is
reproducible and not biased by workflow names. A profile holds its slot until its status
says it ended (``finished``) or, if no status comes, for ``timeout_s``.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduleConfig:
    interval_s: float = 6 * 3600.0  # each workflow at most once per interval
    budget_fraction: float = 0.02  # of the running workflows, profiled at the same time
    min_budget: int = 1  # a small fleet still gets profiled
    timeout_s: float = 600.0  # a profile with no final status frees its slot after this
    seed: int = 0


def _tie(seed: int, workflow: str) -> str:
    return hashlib.blake2b(f"{seed}:{workflow}".encode(), digest_size=8).hexdigest()


class ProfileScheduler:
    def __init__(self, config: ScheduleConfig, state: dict | None = None) -> None:
        self.config = config
        # first_seen: when a workflow was first seen running; last: when it was last
        # profiled; active: profiles holding a slot, with the time they give it back.
        self.state = state if state is not None else {"first_seen": {}, "last": {}, "active": {}}

    def budget(self, running: int) -> int:
        return max(self.config.min_budget, math.floor(self.config.budget_fraction * running))

    def finished(self, workflow: str) -> None:
        """The workflow's profile ended (analysed or failed): its slot is free."""
        self.state["active"].pop(workflow, None)

    def due(self, running: set[str], now_ms: int) -> list[str]:
        """The workflows to profile now (recorded as profiled at ``now_ms``)."""
        cfg = self.config
        state = self.state
        for wf in running:
            state["first_seen"].setdefault(wf, now_ms)
        for wf in [wf for wf in state["first_seen"] if wf not in running]:  # it ended
            del state["first_seen"][wf]
        active = state["active"]
        for wf in [wf for wf, until in active.items() if until <= now_ms or wf not in running]:
            del active[wf]
        free = self.budget(len(running)) - len(active)
        if free <= 0:
            return []
        interval_ms = cfg.interval_s * 1000
        candidates = [wf for wf in running
                      if wf not in active and now_ms - state["last"].get(wf, -math.inf) >= interval_ms]
        candidates.sort(key=lambda wf: (wf in state["last"], state["last"].get(wf, state["first_seen"][wf]),
                                        _tie(cfg.seed, wf)))
        chosen = candidates[:free]
        for wf in chosen:
            state["last"][wf] = now_ms
            active[wf] = now_ms + int(cfg.timeout_s * 1000)
        # Forget when long-gone workflows were profiled, so the state stays the size of the fleet.
        horizon = now_ms - 2 * interval_ms
        for wf in [wf for wf, t in state["last"].items() if t < horizon and wf not in running]:
            del state["last"][wf]
        return chosen
