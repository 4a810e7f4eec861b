"""Detectors over closed ``WorkflowWindow``s: each a plain function window -> ``Violation`` or None.

Thresholds are configurable (``DetectorConfig``); the defaults follow the anchors:
Meta's fleet study (IEEE Micro 2021) flags jobs under 25 % mean utilisation and idle
allocated GPUs; its e-mail rule sends one message per violation per 7 days. How long a
condition must hold before anyone is told is the alert life cycle's job (``streams.alerts.lifecycle``):
``min_duration_s`` below is what each detector asks of it.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from schemas.vocabulary import wasted_seconds


class DetectorConfig(msgspec.Struct, frozen=True):
    low_util_warn_pct: float = 25.0
    low_util_critical_pct: float = 15.0
    low_util_min_s: float = 600.0  # 10 minutes
    idle_min_s: float = 300.0  # a GPU held at 0 % for 5 minutes is a zombie
    partial_min_s: float = 300.0
    imbalance_relative: float = 0.5  # the slowest GPU below half the busiest one's utilisation
    imbalance_floor_pct: float = 20.0  # ... when the busiest is at least this busy
    imbalance_min_s: float = 600.0
    memory_underuse_fraction: float = 0.2
    memory_underuse_min_s: float = 1800.0
    throttle_share: float = 0.2  # of the window's GPU-seconds under power/thermal limits
    throttle_min_s: float = 300.0
    input_bound_util_pct: float = 40.0  # GPUs under this while ...
    input_bound_cpu_per_gpu_pct: float = 90.0  # ... the job's processes keep a core per GPU busy, or
    input_bound_iowait_pct: float = 20.0  # ... its hosts wait on I/O this much
    input_bound_min_s: float = 600.0
    foreign_min_s: float = 60.0  # another workflow's processes on GPUs the scheduler gave this one
    # Serving replicas (streams.serving.traffic): judged by their traffic, not their GPUs' utilisation.
    idle_replica_min_s: float = 1800.0  # a replica that served no request for 30 minutes holds its GPUs for nothing
    queue_target_ms: float = 1000.0  # requests that wait longer than this in the queue, on average ...
    saturated_min_s: float = 300.0  # ... for 5 minutes: the service has too few replicas
    headroom_margin: float = 0.3  # traffic within 30 % of the replica's capacity is busy; below it, headroom


class Thresholds(msgspec.Struct, frozen=True):
    """The site's thresholds: its default and each team's (a team that trains small models may
    accept 40 % utilisation). One object, from the worker's settings, reaches every judge: the
    detectors, the goodput waterfall's input-bound and low-utilisation buckets, and the trace
    rules (which know no team: the default), so a job is judged alike everywhere."""

    default: DetectorConfig = DetectorConfig()
    teams: dict[str, DetectorConfig] = {}

    def for_team(self, team: str | None) -> DetectorConfig:
        return self.teams.get(team or "", self.default)


DEFAULTS = Thresholds()  # a site that sets none


class ThresholdsError(ValueError):
    """A thresholds file that cannot be used: which file, which setting, what it should be."""


def load_thresholds(path) -> Thresholds:
    """Thresholds from a TOML file: ``[default]`` and ``[teams.<name>]`` tables whose keys are
    ``DetectorConfig`` fields; a team's table overrides the default's."""
    import tomllib
    from pathlib import Path

    try:
        raw = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ThresholdsError(f"{path}: not valid TOML: {exc}") from None
    teams_raw = raw.get("teams", {})
    if not isinstance(raw.get("default", {}), dict) or not isinstance(teams_raw, dict):
        raise ThresholdsError(f"{path}: expected a [default] table and [teams.<name>] tables of thresholds")
    for team, values in teams_raw.items():
        if not isinstance(values, dict):
            raise ThresholdsError(f"{path}: teams.{team} = {values!r}: expected a table, [teams.{team}], of thresholds")
    known = set(DetectorConfig.__struct_fields__)
    sections = [("default", raw.get("default", {}))] + [(f"teams.{t}", v) for t, v in teams_raw.items()]
    for section, values in sections:
        unknown = set(values) - known
        if unknown:
            raise ThresholdsError(f"{path}: unknown thresholds in [{section}]: {', '.join(sorted(unknown))}; "
                             f"known: {', '.join(sorted(known))}")
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ThresholdsError(f"{path}: [{section}] {name} must be a number of 0 or more, not {value!r}")
    default = msgspec.convert(raw.get("default", {}), DetectorConfig)
    teams = {team: msgspec.structs.replace(default, **values) for team, values in teams_raw.items()}
    return Thresholds(default, teams)


class Violation(msgspec.Struct, frozen=True):
    detector: str
    severity: str  # WARNING or CRITICAL
    observed: float
    threshold: float
    message: str
    advice: str
    min_duration_s: float


def _minutes(w: dict) -> float:
    return (w["window_end"] - w["window_start"]) / 60_000


NAMED_GPUS = 8  # a message names at most this many GPUs, then says how many more


def _named(names: list[str]) -> str:
    """``names`` for a message: the first ``NAMED_GPUS``, then how many more."""
    shown = ", ".join(names[:NAMED_GPUS])
    return shown + (f" and {len(names) - NAMED_GPUS} more" if len(names) > NAMED_GPUS else "")


def low_utilization(w: dict, c: DetectorConfig) -> Violation | None:
    mean = w["utilization_mean_pct"]
    if mean >= c.low_util_warn_pct:
        return None
    if 0 < w["gpu_count"] <= w["idle_gpus"]:
        return None  # every GPU at 0 %: one cause, the idle allocation, and its alert says it
    critical = mean < c.low_util_critical_pct
    return Violation(
        "low_utilization", "CRITICAL" if critical else "WARNING", mean,
        c.low_util_critical_pct if critical else c.low_util_warn_pct,
        f"The job's {w['gpu_count']} GPU(s) stayed under {c.low_util_warn_pct:g}% mean utilisation "
        f"({mean:.1f}% in its last {_minutes(w):g}-min window, "
        f"{wasted_seconds(w) / 3600:.2f} GPU-hours wasted in it).",
        "Look for an input-bound loop (DataLoader num_workers, pin_memory), host synchronisations, "
        "or a batch too small for the GPU; or ask for fewer GPUs.",
        c.low_util_min_s,
    )


def _untouched(w: dict) -> str:
    """What the message says of GPUs the scheduler allocated and no process opened."""
    names = w.get("untouched_gpu_names") or []
    return f" No process of the job ever opened {_named(names)}." if names else ""


def idle_allocated(w: dict, c: DetectorConfig) -> Violation | None:
    if w["idle_gpus"] <= 0 or w["idle_gpus"] < w["gpu_count"]:
        return None
    never = len(w.get("untouched_gpu_names") or ()) == w["gpu_count"]
    return Violation(
        "idle_allocated", "CRITICAL", float(w["idle_gpus"]), 0.0,
        (f"All {w['gpu_count']} GPU(s) the scheduler gave the job sat at 0 % and no process opened them"
         f" ({_named(w['untouched_gpu_names'])}): the job holds GPUs it does not use." if never else
         f"All {w['gpu_count']} GPU(s) sat at 0 % utilisation: the job holds GPUs it does not use"
         + (f" ({_named(w['idle_gpu_names'])})." if w.get("idle_gpu_names") else ".") + _untouched(w)),
        ("If the job runs on the CPU only, submit it without GPUs (no --gres=gpu, no nvidia.com/gpu)."
         if never else "")
        + ("" if never else "If the job is stuck or finished, stop it and release the GPUs; if it waits for "
                            "something, release the GPUs while it waits."),
        c.idle_min_s,
    )


def partial_use(w: dict, c: DetectorConfig) -> Violation | None:
    if not 0 < w["idle_gpus"] < w["gpu_count"]:
        return None
    idle, untouched = w.get("idle_gpu_names") or [], w.get("untouched_gpu_names") or []
    never = bool(idle) and set(idle) == set(untouched)
    return Violation(
        "partial_use", "WARNING", float(w["idle_gpus"]), 0.0,
        f"{w['idle_gpus']} of the job's {w['gpu_count']} GPUs sat at 0 % while the others worked"
        + (", and no process of the job ever opened them" if never else "")
        + (f": {_named(idle)}." if idle else ".") + ("" if never else _untouched(w)),
        "Check that every rank gets work (device placement, world size, data sharding); release GPUs "
        "the job does not use" + (" and ask for only the GPUs it opens." if _untouched(w) else "."),
        c.partial_min_s,
    )


def foreign_process(w: dict, c: DetectorConfig) -> Violation | None:
    others = w.get("foreign_workflows") or []
    if not others:
        return None
    return Violation(
        "foreign_process", "WARNING", float(len(others)), 0.0,
        f"Processes of another workflow ({_named(others)}) run on GPUs the scheduler gave {w['workflow_id']}.",
        "One of the jobs uses GPUs it was not given: check how both bind their GPUs (CUDA_VISIBLE_DEVICES, "
        "the rank-to-device mapping) and have the scheduler confine jobs to their devices (Slurm's "
        "ConstrainDevices=yes).",
        c.foreign_min_s,
    )


def imbalance(w: dict, c: DetectorConfig) -> Violation | None:
    gap = w.get("gpu_imbalance_pct")
    busiest = w["utilization_max_pct"]
    if gap is None or w["gpu_count"] < 2 or w["idle_gpus"] or busiest < c.imbalance_floor_pct:
        return None
    relative = gap / busiest if busiest else 0.0
    if relative < c.imbalance_relative:
        return None
    return Violation(
        "imbalance", "WARNING", relative, c.imbalance_relative,
        f"The job's GPUs are unevenly busy: the per-GPU mean utilisation spans {gap:.0f} points "
        f"({relative:.0%} of the busiest){_straggler(w)}.",
        "A straggling rank slows every collective: balance the data shards and sequence lengths, "
        "and check the slow rank's host (CPU, input, thermals).",
        c.imbalance_min_s,
    )


def _straggler(w: dict) -> str:
    slowest = w.get("slowest_gpu")
    if not slowest:
        return ""
    low = w["slowest_gpu_pct"]
    return f"; the straggler is {slowest} at {low:.0f}% against {low + w['gpu_imbalance_pct']:.0f}% on the busiest"


def memory_underuse(w: dict, c: DetectorConfig) -> Violation | None:
    # Job to date where the caller knows it (raise_alerts does): one busy window clears the job.
    peak = w.get("job_memory_peak_fraction", w.get("memory_peak_fraction"))
    if peak is None or peak >= c.memory_underuse_fraction:
        return None
    return Violation(
        "memory_underuse", "WARNING", peak, c.memory_underuse_fraction,
        f"The job never used more than {peak:.0%} of its GPUs' memory.",
        "A smaller GPU or a MIG slice would do; or raise the batch size to use the GPU you have.",
        c.memory_underuse_min_s,
    )


def throttling(w: dict, c: DetectorConfig) -> Violation | None:
    share = w["throttled_gpu_seconds"] / w["gpu_seconds"] if w["gpu_seconds"] else 0.0
    if share < c.throttle_share:
        return None
    return Violation(
        "throttling", "WARNING", share, c.throttle_share,
        f"The GPUs ran under power or thermal clock limits for {share:.0%} of the window.",
        "Ask the operators to check cooling and power capping on the host; the job runs slower than it should.",
        c.throttle_min_s,
    )


def hardware_fault(w: dict, c: DetectorConfig) -> Violation | None:
    ecc = w.get("ecc_uncorrected_max") or 0
    if not w["xid_count"] and not ecc:
        return None
    return Violation(
        "hardware_fault", "CRITICAL", float(w["xid_count"] + ecc), 0.0,
        f"The GPUs reported {w['xid_count']} XID error(s) and {ecc} uncorrected ECC error(s).",
        "Results may be wrong and the job may hang: checkpoint, and ask the operators to drain the host.",
        0.0,
    )


def input_bound(w: dict, c: DetectorConfig) -> Violation | None:
    """Low GPU utilisation while the job's CPU is saturated or its hosts wait on I/O. The job's CPU
    is per GPU (its processes' CPU over its GPUs: one data-loading core per GPU is the usual
    shape of a starved input pipeline)."""
    if w["utilization_mean_pct"] >= c.input_bound_util_pct:
        return None
    cpu, iowait = w.get("workflow_cpu_mean_pct"), w.get("host_iowait_mean_pct")
    per_gpu = None if cpu is None else cpu / max(1, w["gpu_count"])
    cpu_bound = per_gpu is not None and per_gpu >= c.input_bound_cpu_per_gpu_pct
    io_bound = iowait is not None and iowait >= c.input_bound_iowait_pct
    if not (cpu_bound or io_bound):
        return None
    what = (f"its processes keep {per_gpu:.0f}% of a core busy per GPU" if cpu_bound
            else f"its hosts spend {iowait:.0f}% of their CPU time waiting for I/O")
    return Violation(
        "input_bound", "WARNING", per_gpu if cpu_bound else iowait,
        c.input_bound_cpu_per_gpu_pct if cpu_bound else c.input_bound_iowait_pct,
        f"The GPUs ran at {w['utilization_mean_pct']:.1f}% while {what}: the job waits for its input.",
        "Feed the GPUs faster: DataLoader(num_workers=N, pin_memory=True, persistent_workers=True), decode and "
        "augment on more cores or on the GPU, cache or pre-shard the dataset on local disk.",
        c.input_bound_min_s,
    )


def idle_replica(w: dict, c: DetectorConfig) -> Violation | None:
    """A replica that served no request for ``idle_replica_min_s``, as its own traffic counts the
    time (``streams.serving.traffic``: since its last request, across no gap in its readings)."""
    s = w.get("serving")
    if s is None or s["state"] != "IDLE":
        return None
    since = w["window_start"] if s.get("idle_since") is None else s["idle_since"]
    minutes = (w["window_end"] - since) / 60_000
    if minutes * 60 < c.idle_replica_min_s:
        return None
    did = ("served no request" if s.get("judged_by") != "gpus" else
           "did no work on its GPUs (its engine's metrics are not read: a request would have used them)")
    return Violation(
        "idle_replica", "WARNING", minutes, c.idle_replica_min_s / 60,
        f"The replica of {s['service']} {did} for {minutes:.0f} min while it held {w['gpu_count']} "
        f"GPU(s) ({w['gpu_seconds'] / 3600:.2f} GPU-hours in its last {_minutes(w):g}-min window).",
        "Scale the deployment down when traffic is low (fewer replicas, or scale to zero), or send it traffic; "
        "if it is kept warm on purpose, ask for an exemption on its page.",
        0.0,  # the time is the replica's own idle time, above
    )


def saturated(w: dict, c: DetectorConfig) -> Violation | None:
    s = w.get("serving")
    if s is None or s["state"] != "SATURATED":
        return None
    queue = s.get("queue_time_ms")
    said = (f"its requests waited {queue / 1000:.1f} s in the queue on average (target {c.queue_target_ms / 1000:g} s)"
            if queue is not None else f"requests waited at every reading ({s.get('waiting_max') or 0:.0f} at most)")
    return Violation(
        "saturated", "WARNING", queue if queue is not None else float(s.get("waiting_max") or 0),
        c.queue_target_ms if queue is not None else 0.0,
        f"The replica of {s['service']} is saturated: {said}, at {s['requests_per_s']:.2f} requests/s.",
        "Add replicas to the service (or raise its autoscaler's maximum), or raise the batch size the engine takes.",
        c.saturated_min_s,
    )


# A detector: one kind of waste, a function of a closed window and the thresholds that returns
# its violation or None. A new detector is a function here, added to DETECTORS, with a case in
# tests/unit/streams/alerts/test_detectors.py (streams/traces/rules.py's rules work alike).
DETECTORS: tuple[Callable[[dict, DetectorConfig], Violation | None], ...] = (
    low_utilization, idle_allocated, partial_use, imbalance, memory_underuse, throttling, hardware_fault,
    input_bound, foreign_process, idle_replica, saturated,
)


def detect(w: dict, config: DetectorConfig) -> dict[str, Violation]:
    """Every violation in window ``w``, by detector name."""
    out = {}
    for fn in DETECTORS:
        v = fn(w, config)
        if v is not None:
            out[v.detector] = v
    return out
