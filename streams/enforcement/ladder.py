"""The enforcement ladder: an alert that keeps firing is warned about, warned about again, and
then acted on (the job's GPUs released), as the HPC centres that recover the most GPU-hours do
(Princeton's Job Defense Shield), with exemptions and a dry run by default.

A ladder (``Ladder``, from the ``[[ladder]]`` tables of a TOML policy file) names a detector,
the minutes the condition must have held for each step, the clusters and teams it covers, its
exemptions (teams, owners, workflow patterns, the scheduler's QOS and partitions, interactive
command lines, a share of busy GPUs, a grace period after start), and the action's command
template. The worker climbs it on each closed window of a
workflow (``climb``): it decides on event time alone, from the workflow's state, so a replay
decides alike, and the steps taken are kept in the state (``WorkflowState.ladders``) so that
none is taken twice. What it decides are ``EnforcementEvent`` records: FIRST_WARNING,
SECOND_WARNING and ACTION_DUE; EXEMPT (never acted on, and why); HELD (the action is due but the
data is stale or partial, or an id the command needs is missing; or, before any step, a fact one
of the ladder's exemptions reads is unknown: the job may be exempt, so nothing is done, not even
a warning, until the fact is known); CANCELLED (the alert resolved after a warning).
``gpufleet enforce`` runs the action of an ACTION_DUE (``sinks.enforce_jobs``).

Plain logic: dicts and the state in, records out.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path
from string import Formatter

import msgspec

from streams.windows.right_size import recommend
from streams.windows.workflow_state import WorkflowState

FIRST_WARNING, SECOND_WARNING, ACTION_DUE = "FIRST_WARNING", "SECOND_WARNING", "ACTION_DUE"
EXEMPT, HELD, CANCELLED = "EXEMPT", "HELD", "CANCELLED"
# What a command template may name, filled from the workflow's ids.
PLACEHOLDERS = frozenset({"workflow_id", "scheduler_job_id", "owner", "team", "cluster"})
# An id put into a command: what schedulers and Kubernetes name things with, nothing a program
# could take for an option or a path outside its argument.
SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:+=-]{0,199}")


class PolicyError(ValueError):
    """A policy file that cannot be used; the text says where and why."""


class Ladder(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    detector: str = "idle_allocated"
    clusters: tuple[str, ...] = ()  # empty: every cluster
    teams: tuple[str, ...] = ()  # empty: every team
    first_warning_min: float = 5.0  # minutes the condition has held (event time)
    second_warning_min: float = 10.0
    action_min: float = 15.0
    command: tuple[str, ...] = ()  # argument vector; {workflow_id}, {scheduler_job_id}, ... filled in
    act: bool = False  # False: a dry run, recorded and reported, nothing run
    grace_after_start_min: float = 0.0  # the ladder's clock starts no earlier than this after the job's start
    busy_fraction: float | None = None  # a job with at least this share of its GPUs busy is exempt
    exempt_teams: tuple[str, ...] = ()
    exempt_owners: tuple[str, ...] = ()
    exempt_workflows: tuple[str, ...] = ()  # glob patterns of workflow ids
    exempt_qos: tuple[str, ...] = ()  # the scheduler's quality of service (Slurm SLURM_JOB_QOS)
    exempt_partitions: tuple[str, ...] = ()  # the scheduler's partitions (SLURM_JOB_PARTITION)
    interactive: tuple[str, ...] = ("jupyter", "ipykernel", "code-server")  # in a command line: interactive, exempt

    def covers(self, state: WorkflowState) -> bool:
        return ((not self.clusters or state.cluster in self.clusters)
                and (not self.teams or state.team in self.teams))


def load_ladders(path: str | Path) -> tuple[Ladder, ...]:
    """The ``[[ladder]]`` tables of a TOML policy file, checked: steps in order, a command for
    a ladder that acts, placeholders that exist."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{path}: not valid TOML: {exc}") from None
    from streams.alerts.detectors import DETECTORS

    detectors = sorted(fn.__name__ for fn in DETECTORS)
    if not isinstance(raw.get("ladder", []), list) or not raw.get("ladder"):
        raise PolicyError(f"{path}: no ladder: a policy is [[ladder]] tables (docker/config/enforcement.toml)")
    ladders = []
    for i, table in enumerate(raw["ladder"]):
        try:
            ladder = msgspec.convert(table, Ladder)
        except msgspec.ValidationError as exc:
            raise PolicyError(f"{path}: ladder {i + 1}: {exc}") from None
        if ladder.detector not in detectors:
            raise PolicyError(f"{path}: ladder {ladder.name!r}: no detector {ladder.detector!r}; "
                              f"the detectors are {', '.join(detectors)}")
        for field in ("first_warning_min", "second_warning_min", "action_min", "grace_after_start_min"):
            if getattr(ladder, field) < 0:
                raise PolicyError(f"{path}: ladder {ladder.name!r}: {field} must be 0 or more")
        if not ladder.first_warning_min <= ladder.second_warning_min <= ladder.action_min:
            raise PolicyError(f"{path}: ladder {ladder.name!r}: the first warning, the second and the action "
                              "must come in that order")
        if ladder.act and not ladder.command:
            raise PolicyError(f"{path}: ladder {ladder.name!r} acts but has no command")
        try:
            named = {name for arg in ladder.command for _, name, _, _ in Formatter().parse(arg) if name}
        except ValueError as exc:
            raise PolicyError(f"{path}: ladder {ladder.name!r}: the command {list(ladder.command)} is not a template "
                              f"({exc}; a literal brace is written {{{{ or }}}})") from None
        unknown = named - PLACEHOLDERS
        if unknown:
            raise PolicyError(f"{path}: ladder {ladder.name!r}: the command names {', '.join(sorted(unknown))}; "
                              f"it may name {', '.join(sorted(PLACEHOLDERS))}")
        ladders.append(ladder)
    names = [ladder.name for ladder in ladders]
    if len(set(names)) != len(names):
        raise PolicyError(f"{path}: two ladders have the same name")
    return tuple(ladders)


def render(command: tuple[str, ...], ids: dict[str, str | None]) -> list[str]:
    """The argument vector with the workflow's ids; ValueError naming an id that is missing or
    not safe to pass."""
    for name in {n for arg in command for _, n, _, _ in Formatter().parse(arg) if n}:
        value = ids.get(name)
        if value is None:
            raise ValueError(f"the command needs {name}, which this workflow does not have")
        if not SAFE_ID.fullmatch(value):
            raise ValueError(f"{name} {value!r} is not safe to put in a command")
    return [arg.format_map(ids) for arg in command]


def climb(state: WorkflowState, window: dict, ladders: tuple[Ladder, ...], now_ms: int) -> list[dict]:
    """The ladder events the closed ``window`` leads to for its workflow (after its alerts were
    raised), the steps taken marked in ``state.ladders``."""
    out = []
    for ladder in ladders:
        if ladder.covers(state):
            out += _climb_one(state, window, ladder, now_ms)
    return out


def stand_down(state: WorkflowState, workflow_id: str, ladders: tuple[Ladder, ...], reason: str, at_ms: int,
               now_ms: int) -> list[dict]:
    """The workflow ended: each ladder that warned it and did not act stands down (CANCELLED),
    so that no action falls due for a job that is gone."""
    out = []
    window = {"workflow_id": workflow_id, "gpu_count": (state.job or {}).get("max_gpus", 0), "window_end": at_ms}
    for ladder in ladders:
        taken = state.ladders.get(ladder.name)
        if not taken or not taken["warned"] or taken.get("cancelled"):
            continue
        due = ACTION_DUE in taken["steps"]
        if taken["closed"] and not due:
            continue  # exempt, or stood down already
        taken["closed"] = taken["cancelled"] = True
        out.append(_event(ladder, state, window, taken, CANCELLED, at_ms, now_ms,
                          reason=f"the workflow ended ({reason})" + (": the action due is not run" if due
                                                                     else " before the action")))
    return out


def _climb_one(state: WorkflowState, window: dict, ladder: Ladder, now_ms: int) -> list[dict]:
    life = state.alerts.get(ladder.detector) or {}
    taken = state.ladders.get(ladder.name)
    if life.get("status") != "firing":
        if taken and taken["warned"] and not taken["closed"]:  # warned, and the alert resolved: stand down
            taken["closed"] = taken["cancelled"] = True
            return [_event(ladder, state, window, taken, CANCELLED, window["window_end"], now_ms,
                           reason=f"the {ladder.detector.replace('_', ' ')} alert resolved before the action")]
        return []
    since = life["since"]
    alert_id = f"{ladder.detector}:{window['workflow_id']}:{since}"  # the alert's own id (alert_lifecycle)
    if taken is None or taken["alert_id"] != alert_id:  # a new episode
        taken = state.ladders[ladder.name] = {"alert_id": alert_id, "since": since, "steps": [], "warned": False,
                                              "closed": False, "held": False}
    if taken["closed"]:
        return []
    unknown = _unknown_facts(ladder, state)
    if unknown:  # the job may be exempt: no step at all while a fact an exemption reads is unknown
        if taken.get("held_unknown") != unknown:
            taken["held_unknown"] = unknown
            return [_event(ladder, state, window, taken, HELD, window["window_end"], now_ms, reason=unknown)]
        return []
    start = since
    if state.first_sample_at >= 0:
        start = max(since, state.first_sample_at + round(ladder.grace_after_start_min * 60_000))
    held_min = (window["window_end"] - start) / 60_000
    out = []
    for step, after in ((FIRST_WARNING, ladder.first_warning_min), (SECOND_WARNING, ladder.second_warning_min),
                        (ACTION_DUE, ladder.action_min)):
        if step in taken["steps"] or held_min < after:
            continue
        due = start + round(after * 60_000)
        exemption = _exemption(ladder, state, window)
        if exemption:
            taken["closed"] = True
            return [*out, _event(ladder, state, window, taken, EXEMPT, due, now_ms, reason=exemption)]
        if step == ACTION_DUE:
            hold = _stale(state, window) or _missing_id(ladder, state, window)
            if hold:  # the action waits for a window that is whole; said once per episode
                if not taken["held"]:
                    taken["held"] = True
                    out.append(_event(ladder, state, window, taken, HELD, due, now_ms, reason=hold))
                return out
            taken["closed"] = True
        taken["steps"].append(step)
        taken["warned"] = True
        action_at = start + round(ladder.action_min * 60_000)
        out.append(_event(ladder, state, window, taken, step, due, now_ms, action_at=action_at,
                          reason=_why(ladder, window, step, action_at) + _advice(state, step)))
    return out


# A ladder's exemptions and the facts they read: (fact as the scheduler names it, the state's field,
# whether only a scheduler's job has it).
_EXEMPTION_FACTS = (("exempt_owners", "user", "owner", False), ("exempt_teams", "account", "team", False),
                    ("exempt_qos", "qos", "scheduler_qos", True), ("exempt_partitions", "partition",
                                                                   "scheduler_partition", True))


def _unknown_facts(ladder: Ladder, state: WorkflowState) -> str | None:
    """Why the ladder cannot tell whether the job is exempt: a fact one of its exemptions reads
    that the job's state does not have (the scheduler could not be asked, or an older agent did
    not say). None when every such fact is known."""
    missing = []
    for exemption, fact, attribute, scheduled in _EXEMPTION_FACTS:
        if not getattr(ladder, exemption) or getattr(state, attribute) is not None:
            continue
        if fact in state.unknown_facts or not scheduled or state.scheduler_job_id is not None:
            missing.append(fact)
    if not missing:
        return None
    why = f" ({state.scheduler_problem})" if state.scheduler_problem else ""
    return (f"ladder {ladder.name} has exemptions by {', '.join(missing)}, and the scheduler did not say "
            f"its {', '.join(missing)}{why}: nothing is done until it is known")


def _exemption(ladder: Ladder, state: WorkflowState, window: dict) -> str | None:
    wf = window["workflow_id"]
    if state.team in ladder.exempt_teams:
        return f"team {state.team} is exempt from ladder {ladder.name}"
    if state.owner in ladder.exempt_owners:
        return f"owner {state.owner} is exempt from ladder {ladder.name}"
    if state.scheduler_qos is not None and state.scheduler_qos in ladder.exempt_qos:
        return f"quality of service {state.scheduler_qos} is exempt from ladder {ladder.name}"
    if state.scheduler_partition is not None and state.scheduler_partition in ladder.exempt_partitions:
        return f"partition {state.scheduler_partition} is exempt from ladder {ladder.name}"
    if any(fnmatch.fnmatchcase(wf, pattern) for pattern in ladder.exempt_workflows):
        return f"workflow {wf} matches an exempt pattern of ladder {ladder.name}"
    if state.cmdline and any(word in state.cmdline for word in ladder.interactive):
        return "an interactive job (its command line runs " + \
            next(w for w in ladder.interactive if w in state.cmdline) + ")"
    if ladder.busy_fraction is not None and window["gpu_count"]:
        busy = 1 - window["idle_gpus"] / window["gpu_count"]
        if busy >= ladder.busy_fraction:
            return (f"{busy:.0%} of its GPUs are busy, at least the {ladder.busy_fraction:.0%} "
                    f"ladder {ladder.name} asks of a job it spares")
    return None


def _stale(state: WorkflowState, window: dict) -> str | None:
    """Why the data cannot be acted on: a GPU of the job missing from the window, or a host the
    job runs on (its life cycle says) that sent no sample in it."""
    most = (state.job or {}).get("max_gpus", 0)
    if window["gpu_count"] < most:
        return f"the window has {window['gpu_count']} of the job's {most} GPUs: partial data, the action waits"
    seen = set(window.get("hosts") or ())
    silent = sorted(set(state.hosts) - seen) if seen else []
    if silent:
        return f"no samples from {', '.join(silent)} in the window: stale data, the action waits"
    return None


def _missing_id(ladder: Ladder, state: WorkflowState, window: dict) -> str | None:
    try:
        render(ladder.command, ids_of(state, window))
    except ValueError as exc:
        return str(exc)
    return None


def ids_of(state: WorkflowState, window: dict) -> dict[str, str | None]:
    return {"workflow_id": window["workflow_id"], "scheduler_job_id": state.scheduler_job_id,
            "owner": state.owner, "team": state.team, "cluster": state.cluster}


def _why(ladder: Ladder, window: dict, step: str, action_at: int) -> str:
    what = ladder.detector.replace("_", " ")
    if step == ACTION_DUE:
        verb = "its GPUs are released" if ladder.act else "(dry run) its GPUs would be released"
        return f"{what} held for {ladder.action_min:g} min: {verb}"
    when = "would be" if not ladder.act else "will be"
    return (f"{what} has held; unless it stops, the job's {window['gpu_count']} GPU(s) {when} released "
            f"{ladder.action_min:g} min after it began")


def _advice(state: WorkflowState, step: str) -> str:
    """On a warning: what the job should ask for instead (``right_size``), the largest saving first."""
    if step == ACTION_DUE or not state.job:
        return ""
    sizes = sorted((r for r in recommend(state.job) if r["gpu_hours_freed"] > 0),
                   key=lambda r: -r["gpu_hours_freed"])
    return f". Right-sizing: ask for {sizes[0]['recommended']} ({sizes[0]['reason']})" if sizes else ""


def _event(ladder: Ladder, state: WorkflowState, window: dict, taken: dict, step: str, due: int, now_ms: int,
           reason: str, action_at: int | None = None) -> dict:
    ids = ids_of(state, window)
    try:
        command = render(ladder.command, ids) if step == ACTION_DUE else []
    except ValueError:
        command = []
    return {
        "event_id": f"{taken['alert_id']}:{step}", "alert_id": taken["alert_id"], "step": step,
        "policy": ladder.name, "detector": ladder.detector, "workflow_id": window["workflow_id"],
        "owner": state.owner, "team": state.team, "cluster": state.cluster,
        "scheduler_job_id": state.scheduler_job_id, "since": taken["since"], "due_at": due,
        "action_at": action_at, "dry_run": not ladder.act, "gpus": window["gpu_count"], "reason": reason,
        "command": command, "exit_code": None, "attempt": 0, "at": now_ms,
    }
