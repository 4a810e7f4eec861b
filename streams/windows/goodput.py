"""Goodput: where every allocated GPU-second of a workflow went, one bucket per sample.

Each sample counts for its interval times the workflow's share of the GPU (as everywhere in
the windows), and goes to exactly one bucket, the first that applies:

==============  ===========================================================================
``unhealthy``   the GPU reported an XID, an uncorrected ECC error or a pending row
                remapping, or ran under a power or thermal clock limit
``startup``     before the workflow's GPUs first did any work (a sample at ``busy_pct`` or
                more), for at most ``startup_max_s`` after its first sample: loading,
                compiling, waiting for peers
``idle``        the GPU at 0 % while the workflow holds it
``input_bound`` under the input-bound detector's utilisation in a window that the live
                input-bound detector judges starved (the job's processes keep a core per GPU
                busy, or its hosts wait on I/O)
``low_util``    under the low-utilisation detector's threshold for any other reason
``productive``  the rest
==============  ===========================================================================

So the buckets of a window, and of a workflow, sum to its GPU-seconds exactly. Beside them,
``unobserved``: the time the scheduler says the job held its GPUs and no sample came (its
agent was not running), which is part of the GPU-seconds and of no other bucket. With each
bucket the energy its samples used: from the GPU's energy counter where it reports one (the
counter's rise since the GPU's previous sample, times the workflow's share), else its power
times its weight; idle power is charged to whoever holds the allocation, like its time.
Carbon and cost are the reports' (``sinks/job_report.py``): prices and grid intensities
change, the GPU-seconds and joules do not.

The buckets do not depend on how samples are grouped into messages or in which order they
arrive within a window: start-up is judged on event time when the window is emitted (a
sample before the workflow's first busy one), and input-bound on the whole window.
"""

from __future__ import annotations

from operator import mul

import msgspec

from schemas.goodput_buckets import BUCKETS, JOULES_FIELDS, OBSERVED_BUCKETS, SECONDS_FIELDS
from streams.alerts.detectors import DetectorConfig, input_bound
from streams.windows.efficiency import THROTTLE_MASK
from streams.windows.workflow_state import WorkflowState

UNHEALTHY, STARTUP, IDLE, INPUT_BOUND, LOW_UTIL, PRODUCTIVE = range(len(OBSERVED_BUCKETS))
UNOBSERVED = len(OBSERVED_BUCKETS)  # no sample decides it: ``UnobservedTime`` adds to it (``add_unobserved``)


class GoodputConfig(msgspec.Struct, frozen=True):
    busy_pct: float = 1.0  # start-up ends at the first sample this busy
    startup_max_s: float = 900.0  # a workflow that did nothing for 15 minutes is idle, not starting


def new_goodput() -> dict:
    return {
        # GPU-milliseconds and joules, per bucket where a sample alone decides it (unhealthy),
        # else per utilisation class (``_classes``), decided when the window is emitted
        "ms": [0.0] * 4, "j": [0.0] * 4,
        # samples under ``busy_pct`` by event time: start-up or not depends on when the
        # workflow first got busy, which a later sample can tell: [ms at 0 %, J, ms above, J]
        "quiet": {},
        "metered": False,  # an energy counter measured some of it
        "unobserved_ms": 0.0,  # GPU-ms held that no sample stands for (UnobservedTime)
    }


def add_unobserved(g: dict, gpu_ms: float) -> None:
    """GPU-milliseconds the job held that no sample stands for."""
    g["unobserved_ms"] = g.get("unobserved_ms", 0.0) + gpu_ms


def _power_joules(c: dict, w: list[float]) -> list[float]:
    """Each sample's power times its weight, in joules (0 where the GPU reports no power)."""
    power = c["power_watts"]
    return [0.0] * len(w) if power is None else [p * wi / 1000.0 for p, wi in zip(power, w)]


def _metered_joules(c: dict, w: list[float], state: WorkflowState) -> list[float]:
    """Each sample's energy for the workflow from its GPU's energy counter: the rise since
    the GPU's previous reading times the workflow's share; its power times its weight where
    the counter cannot tell (a first reading, a counter that went back after a reset or a
    sample out of order, or one that rose more than twice the power limit allows)."""
    joules = _power_joules(c, w)
    last, share, limit = state.energy_counters, c["share"], c["power_limit_watts"]
    for i, (uuid, total, interval) in enumerate(zip(c["gpu_uuid"], c["energy_joules_total"], c["interval_ms"])):
        before = last.get(uuid)
        last[uuid] = total
        ceiling = 2.0 * (limit[i] if limit is not None else 1500.0) * interval / 1000.0
        if before is not None and 0.0 <= total - before <= ceiling:
            joules[i] = (total - before) * (1.0 if share is None else share[i])
    return joules


def _unhealthy(c: dict) -> list[bool] | None:
    """Per sample, whether the GPU was unhealthy; None where no sample of the block was."""
    marks = None
    xids = c["xids"]
    if any(xids):
        marks = [bool(x) for x in xids]
    for name in ("ecc_uncorrected_volatile", "remapped_rows_pending"):
        col = c[name]
        if col is not None and any(col):
            marks = [bool(v) or m for v, m in zip(col, marks or [False] * len(col))]
    reasons = c["clock_event_reasons"]
    if reasons is not None and any(reasons):  # most samples have no clock event at all
        throttled = [bool(r & THROTTLE_MASK) for r in reasons]
        if any(throttled):
            marks = [a or b for a, b in zip(throttled, marks or throttled)]
    return marks


def _mark_started(state: WorkflowState, c: dict, busy_pct: float) -> None:
    """Note the workflow's first sample and its first busy one, by event time."""
    if state.first_sample_at < 0 <= state.max_event_time:
        # Samples of it were applied by a release before goodput: it is past its start-up.
        state.first_sample_at = state.busy_since = 0
    times, util = c["event_time"], c["utilization_pct"]
    first = min(times)
    if state.first_sample_at < 0 or first < state.first_sample_at:
        state.first_sample_at = first
    if state.busy_since is not None and first >= state.busy_since:
        return  # busy before any of these
    busy = [t for t, u in zip(times, util) if u >= busy_pct]
    if busy and (state.busy_since is None or min(busy) < state.busy_since):
        state.busy_since = min(busy)


_SICK = 0  # index in "ms"/"j": unhealthy; then the utilisation classes 1, 2, 3


def _classes(d: DetectorConfig) -> tuple[float, float]:
    """The two utilisation thresholds that matter (low utilisation, input-bound), in order:
    a busy sample's class is 1 under the first, 2 under the second, else 3."""
    return min(d.low_util_warn_pct, d.input_bound_util_pct), max(d.low_util_warn_pct, d.input_bound_util_pct)


def add_goodput(g: dict, c: dict, w: list[float], state: WorkflowState, config: GoodputConfig,
                d: DetectorConfig) -> None:
    """The samples of block ``c`` weighing ``w`` each (interval x share, ms). Whatever the
    blocks the samples came in, the result is the same."""
    _mark_started(state, c, config.busy_pct)
    util, times = c["utilization_pct"], c["event_time"]
    joules = None
    if c["energy_joules_total"] is not None:
        joules = _metered_joules(c, w, state)
        g["metered"] = True
    sick = _unhealthy(c)
    first, second = _classes(d)
    ms, j = g["ms"], g["j"]
    low, high = min(util), max(util)
    if sick is None and low >= config.busy_pct:
        # The common case: a healthy, busy block whose samples are all of one class.
        k = 3 if low >= second else 1 if high < first else 2 if first <= low and high < second else 0
        if k:
            ms[k] += sum(w)
            if joules is not None:
                j[k] += sum(joules)
            elif c["power_watts"] is not None:
                j[k] += sum(map(mul, c["power_watts"], w)) / 1000.0
            return
    if joules is None:
        joules = _power_joules(c, w)
    quiet = g["quiet"]
    for i, u in enumerate(util):
        if sick is not None and sick[i]:
            k = _SICK
        elif u < config.busy_pct:
            entry = quiet.setdefault(str(times[i]), [0.0, 0.0, 0.0, 0.0])
            at = 0 if u <= 0 else 2
            entry[at] += w[i]
            entry[at + 1] += joules[i]
            continue
        else:
            k = 1 if u < first else 2 if u < second else 3
        ms[k] += w[i]
        j[k] += joules[i]


def goodput_fields(g: dict, window: dict, state: WorkflowState, config: GoodputConfig, d: DetectorConfig) -> dict:
    """The ``WorkflowWindow`` fields of the buckets (GPU-seconds and joules of each) for the
    window whose other fields are ``window``: start-up as the workflow's state knows it now,
    and input-bound where the live input-bound detector judges the window so."""
    ms, j = [0.0] * len(BUCKETS), [0.0] * len(BUCKETS)
    ms[UNHEALTHY], j[UNHEALTHY] = g["ms"][_SICK], g["j"][_SICK]
    ms[UNOBSERVED] = g.get("unobserved_ms", 0.0)  # (accumulators of older releases have none)
    end = state.first_sample_at + config.startup_max_s * 1000
    if state.busy_since is not None:
        end = min(end, state.busy_since)
    below = [g["ms"][1], g["j"][1]]  # busy samples under the lower threshold
    for t, (zero_ms, zero_j, low_ms, low_j) in g["quiet"].items():
        if int(t) < end:
            ms[STARTUP] += zero_ms + low_ms
            j[STARTUP] += zero_j + low_j
        else:
            ms[IDLE] += zero_ms
            j[IDLE] += zero_j
            below[0] += low_ms
            below[1] += low_j
    starved = input_bound(window, d) is not None
    # Class 1 is under both thresholds; class 2 under the higher one only: under the
    # input-bound threshold if that is the higher, else under the low-utilisation one.
    middle = INPUT_BOUND if d.input_bound_util_pct > d.low_util_warn_pct else LOW_UTIL
    for k, (k_ms, k_j) in ((INPUT_BOUND if starved else LOW_UTIL, below),
                           (middle if (starved or middle == LOW_UTIL) else PRODUCTIVE, (g["ms"][2], g["j"][2])),
                           (PRODUCTIVE, (g["ms"][3], g["j"][3]))):
        ms[k] += k_ms
        j[k] += k_j
    return {**{f: v / 1000.0 for f, v in zip(SECONDS_FIELDS, ms)}, **dict(zip(JOULES_FIELDS, j))}
