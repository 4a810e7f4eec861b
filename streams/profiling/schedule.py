"""Which running workflows to profile now: each at most once per interval, never more than a
budget of profiles at once, deterministic under a seed, and restartable from its state.

Plain logic over JSON-able state, one entry per workflow, so the worker keeps it in a
changelog table (only changed entries are written) and a restarted worker does not profile
again what was just profiled. Order of preference: workflows never profiled, the
longest-known first; then the ones profiled longest ago; ties broken by a hash of (seed,
workflow), so a fleet's schedule is reproducible and not biased by workflow names. A profile
holds its slot until it is reported ``finished`` or, failing that, for ``timeout_s``.

``FleetSchedule`` feeds it: the window stage's partitions each report their running
workflows (``ScheduleReport`` records on a one-partition topic, so one scheduler sees the
whole fleet and the budget is fleet-wide), and it answers with ``ProfileRequest`` records.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import MutableMapping
from dataclasses import dataclass

SCHEDULER = "gpufleet-scheduler"  # the requester of periodic profiles


@dataclass(frozen=True)
class ScheduleConfig:
    enabled: bool = True
    interval_s: float = 6 * 3600.0  # each workflow at most once per interval
    budget_fraction: float = 0.02  # of the running workflows, profiled at the same time
    min_budget: int = 1  # a small fleet still gets profiled
    timeout_s: float = 600.0  # a profile with no final status frees its slot after this
    seed: int = 0
    report_s: float = 30.0  # how often each partition of the window stage reports what runs
    steps: int = 20  # optimizer steps per periodic profile


def _tie(seed: int, workflow: str) -> str:
    return hashlib.blake2b(f"{seed}:{workflow}".encode(), digest_size=8).hexdigest()


class ProfileScheduler:
    def __init__(self, config: ScheduleConfig, state: MutableMapping[str, dict] | None = None) -> None:
        self.config = config
        # workflow -> {"first_seen": ms while it runs, "last": ms of its last profile,
        # "until": ms its profile holds a slot until (None: no profile in progress)}
        self.state = state if state is not None else {}
        self.changed: set[str] = set()  # entries written or deleted since the caller last looked
        self.removed: set[str] = set()

    def budget(self, running: int) -> int:
        return max(self.config.min_budget, math.floor(self.config.budget_fraction * running))

    def _put(self, wf: str, entry: dict) -> None:
        self.state[wf] = entry
        self.changed.add(wf)
        self.removed.discard(wf)

    def finished(self, workflow: str) -> None:
        """The workflow's profile ended (analysed or failed): its slot is free."""
        entry = self.state.get(workflow)
        if entry is not None and entry["until"] is not None:
            self._put(workflow, {**entry, "until": None})

    def due(self, running: set[str], now_ms: int) -> list[str]:
        """The workflows to profile now (recorded as profiled at ``now_ms``)."""
        cfg = self.config
        interval_ms = cfg.interval_s * 1000
        for wf in running:
            entry = self.state.get(wf)
            if entry is None or entry["first_seen"] is None:  # new, or back after it ended
                self._put(wf, {"first_seen": now_ms, "last": entry["last"] if entry else None, "until": None})
        active = 0
        for wf, entry in list(self.state.items()):
            if wf in running:
                if entry["until"] is not None and entry["until"] <= now_ms:
                    self._put(wf, {**entry, "until": None})  # no status came: the slot is free again
                elif entry["until"] is not None:
                    active += 1
            elif entry["last"] is None or entry["last"] < now_ms - 2 * interval_ms:
                # Gone, and long enough ago that its last profile no longer matters: forget it,
                # so the state stays the size of the fleet.
                del self.state[wf]
                self.changed.discard(wf)
                self.removed.add(wf)
            elif entry["first_seen"] is not None or entry["until"] is not None:
                self._put(wf, {**entry, "first_seen": None, "until": None})  # it ended: no slot, new if it returns
        free = self.budget(len(running)) - active
        if free <= 0:
            return []
        candidates = [wf for wf in running if self.state[wf]["until"] is None
                      and (self.state[wf]["last"] is None or now_ms - self.state[wf]["last"] >= interval_ms)]
        candidates.sort(key=lambda wf: (self.state[wf]["last"] is not None,
                                        self.state[wf]["last"] or self.state[wf]["first_seen"], _tie(cfg.seed, wf)))
        chosen = candidates[:free]
        for wf in chosen:
            self._put(wf, {**self.state[wf], "last": now_ms, "until": now_ms + int(cfg.timeout_s * 1000)})
        return chosen


def request_id_for(workflow: str, now_ms: int) -> str:
    return f"periodic-{workflow}-{now_ms}"


def is_periodic(request_id: str) -> bool:
    return request_id.startswith("periodic-")


class FleetSchedule:
    """The periodic scheduler over the reports of the window stage's partitions.

    ``reports``: source partition (as a string) -> {"at": wall ms, "running": [workflow ids]};
    a partition that has not reported for three report intervals (it moved to another worker,
    which will report it) no longer counts.
    """

    def __init__(self, config: ScheduleConfig, reports: MutableMapping[str, dict],
                 workflows: MutableMapping[str, dict]) -> None:
        self.config = config
        self.reports = reports
        self.scheduler = ProfileScheduler(config, workflows)
        self.changed_reports: set[str] = set()

    def take_changes(self) -> tuple[set[str], set[str], set[str]]:
        """(report keys written, workflow entries written, workflow entries deleted) since the
        last call: what the caller must write to its changelog."""
        s = self.scheduler
        out = (self.changed_reports, s.changed, s.removed)
        self.changed_reports, s.changed, s.removed = set(), set(), set()
        return out

    def apply(self, report: dict, now_ms: int) -> list[dict]:
        """Take in one ``ScheduleReport``; return the ``ProfileRequest`` records due now."""
        for wf in report["finished"]:
            self.scheduler.finished(wf)
        if report["source_partition"] is not None:
            key = str(report["source_partition"])
            self.reports[key] = {"at": report["at"], "running": sorted(report["running"])}
            self.changed_reports.add(key)
        fresh_after = now_ms - 3 * self.config.report_s * 1000
        running = {wf for r in self.reports.values() if r["at"] >= fresh_after for wf in r["running"]}
        cfg = self.config
        return [{
            "request_id": request_id_for(wf, now_ms), "workflow_id": wf, "hosts": [], "ranks": [],
            "duration_ms": None, "steps": cfg.steps, "reason": "PERIODIC", "requester": SCHEDULER,
            "requested_at": now_ms, "deadline_ms": now_ms + int(cfg.timeout_s * 1000),
        } for wf in self.scheduler.due(running, now_ms)]
