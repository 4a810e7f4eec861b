"""What the window stage keeps per workflow: one declared type, and how it is written to its
changelog and read back, versioned.

Who writes what:

==============================  ===================================================================
``streams.windows.utilization``          ``partition``, ``owner``/``team``, ``last_offset``/``last_index``
                                (applied through; a replay is skipped), ``max_event_time``,
                                ``windows`` (the open windows' accumulators, by start)
the life cycle (``streams.stages.windows``) ``hosts``, ``ending``; ``ended`` and ``end_reason`` when summarised
``goodput``                     ``first_sample_at``, ``busy_since`` (start-up ends there),
                                ``energy_counters`` (each GPU's last energy counter reading)
``streams.windows.summary``          ``job`` (the totals of its closed windows)
``raise_alerts``                ``alerts`` (each detector's life cycle), ``wasted_s``
``auto_profile``, ``root_cause`` ``auto_profiled_at``, and the profile of an alert in ``alerts``
the life cycle, again           ``scheduler_job_id``, ``cluster``, ``cmdline``, ``scheduler_qos``/``_partition``,
                                ``unknown_facts`` and ``scheduler_problem`` (what the scheduler could not say),
                                ``scheduler``, ``allocated_at``, ``ended_at``, ``end_state`` and the exit
                                (the scheduler's start, end and how the job ended)
``streams.enforcement.ladder``          ``ladders`` (each ladder's steps taken in the current episode)
``streams.serving.traffic``     ``serving`` (a replica's traffic by window, its capacity; None: not serving)
==============================  ===================================================================

The changelog holds ``{"v": STATE_VERSION, "state": {...}}`` (JSON, by msgspec). Version 0 is
what releases before the declared type wrote: the state's dict alone, the same fields, with
``ending``/``ended`` absent when false. Both are read; a new version adds a reader here.
"""

from __future__ import annotations

import logging

import msgspec

from schemas.validate_sample import NOT_WORKFLOWS

STATE_VERSION = 1

log = logging.getLogger(__name__)


class WorkflowState(msgspec.Struct, kw_only=True):
    partition: int
    owner: str | None = None
    team: str | None = None
    last_offset: int = -1
    last_index: int = 0
    max_event_time: int = -1
    windows: dict[str, dict] = {}
    hosts: list[str] = []
    ending: bool = False
    ended: bool = False
    end_reason: str | None = None
    job: dict | None = None
    alerts: dict[str, dict] = {}
    wasted_s: float = 0.0
    auto_profiled_at: int | None = None
    first_sample_at: int = -1
    busy_since: int | None = None
    energy_counters: dict[str, float] = {}
    scheduler_job_id: str | None = None
    cluster: str | None = None
    cmdline: str | None = None  # the first 300 characters: what the enforcement ladder's exemptions look at
    scheduler_qos: str | None = None
    scheduler_partition: str | None = None
    ladders: dict[str, dict] = {}
    # What the scheduler could not be asked (``WorkflowEvent.scheduler_unknown``) and why: facts the
    # enforcement ladders do not act without.
    unknown_facts: list[str] = []
    scheduler_problem: str | None = None
    # The scheduler's word on the job's life (``hear``): who allocated it, when, when it took the
    # resources back and how the job ended.
    scheduler: str | None = None
    allocated_at: int | None = None
    ended_at: int | None = None
    end_state: str | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    cancelled_by: str | None = None
    serving: dict | None = None  # a serving replica's traffic (``streams.serving.traffic``); None: not one


class _Written(msgspec.Struct):
    v: int
    state: WorkflowState


_encoder = msgspec.json.Encoder()
_reader = msgspec.json.Decoder()


class StateError(ValueError):
    """A changelog value that is no workflow state of any version this release reads."""


def encode(state: WorkflowState) -> bytes:
    return _encoder.encode(_Written(STATE_VERSION, state))


def decode(data: bytes) -> WorkflowState:
    try:
        raw = _reader.decode(data)
        if isinstance(raw, dict) and "v" in raw and "state" in raw:
            if raw["v"] != STATE_VERSION:
                raise StateError(f"workflow state of version {raw['v']}; this release reads 0 to {STATE_VERSION}")
            return msgspec.convert(raw["state"], WorkflowState)
        return from_version_0(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise StateError(f"not a workflow state: {exc}") from exc


def from_version_0(raw: dict) -> WorkflowState:
    """A state as releases before the declared type wrote it: the dict alone."""
    if not isinstance(raw, dict):
        raise StateError(f"not a workflow state: a {type(raw).__name__}")
    return msgspec.convert(raw, WorkflowState)


def hear(state: WorkflowState, event: dict) -> None:
    """One life-cycle event (``WorkflowEvent``) into its workflow's state: what the scheduler
    says of the job (what the enforcement ladders look at), which hosts it runs on, and
    whether the last one said it ended."""
    for field in ("scheduler_job_id", "cluster", "scheduler_qos", "scheduler_partition", "scheduler_problem"):
        if event.get(field):
            setattr(state, field, event[field])
    if event.get("scheduler_unknown"):
        state.unknown_facts = sorted(set(state.unknown_facts) | set(event["scheduler_unknown"]))
    if event.get("scheduler"):
        state.scheduler = event["scheduler"]
        if event.get("allocated_at") is not None:  # (every host's prolog tells the same start)
            state.allocated_at = min(event["allocated_at"], state.allocated_at or event["allocated_at"])
        if event["event"] == "ENDED":
            if "end" not in (event.get("scheduler_unknown") or ()):
                state.ended_at = max(event["event_time"], state.ended_at or event["event_time"])
            for field in ("end_state", "exit_code", "exit_signal", "cancelled_by"):
                if event.get(field) is not None:
                    setattr(state, field, event[field])
    if event.get("cmdline"):
        state.cmdline = event["cmdline"][:300]
    hosts = set(state.hosts)
    if event["event"] == "ENDED":
        hosts.discard(event["host"])
        if not hosts:
            state.ending = True
            log.info("workflow %s ended on its last host (%s)", event["workflow_id"], event["host"])
    else:
        hosts.add(event["host"])
        state.ending = False
    state.hosts = sorted(hosts)


def repair_future(state: WorkflowState, limit: int, size_ms: int) -> list[str]:
    """Drop the windows of ``state`` that start after ``limit`` (a sample written before future
    times were refused opened them) and set its clock back to the newest window it keeps; the
    starts dropped."""
    future = [start for start in state.windows if int(start) > limit]
    for start in future:
        del state.windows[start]
    kept = [int(start) + size_ms - 1 for start in state.windows]
    if state.job:
        kept.append(state.job["last"] - 1)
    state.max_event_time = max(kept, default=-1)
    return future


def forgettable(workflow_id: str, state: WorkflowState, horizon: int) -> bool:
    """Whether a workflow silent since before ``horizon`` can be forgotten: it ended, holds no
    workflow's GPUs, or never had a sample; and no traffic of it is still to be judged (a serving
    replica's readings come before its GPU samples: ``streams.serving.traffic``)."""
    return (state.max_event_time < horizon and (state.ended or workflow_id in NOT_WORKFLOWS or state.max_event_time < 0)
            and not (state.serving or {}).get("windows"))
