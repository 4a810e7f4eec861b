"""Goodput as people read it: the waterfall of a workflow or a fleet (GPU-hours, share, kWh,
carbon and cost per bucket), and the report an owner gets when a job ends.

The GPU-seconds and joules of each bucket are measured (``streams.windows.goodput``, stored in
ClickHouse); money and carbon are applied here, per GPU model, cluster and hour, from a
rates file, since prices and grid intensities change and the measurements do not. A rates
file (TOML; ``docs/rates.example.toml``)::

    currency = "USD"
    default_price_per_gpu_hour = 2.0
    default_grid_g_per_kwh = 400.0

    [price_per_gpu_hour]            # per GPU model as NVML names it
    "NVIDIA H100 80GB HBM3" = 4.0

    [grid_g_per_kwh]                # gCO2e per kWh, per cluster
    eu-west = 250.0

    [[grid_series]]                 # an intensity from a time on (the latest start before wins)
    cluster = "eu-west"
    start = 2026-06-01T00:00:00Z
    g_per_kwh = 180.0

Without one, cost and carbon are not shown.
"""

from __future__ import annotations

import html
import tomllib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from schemas.goodput_buckets import BUCKETS
from schemas.vocabulary import WASTE_BUCKETS

LABELS = {"unhealthy": "unhealthy (XID, ECC, throttled)", "startup": "start-up", "idle": "idle while allocated",
          "input_bound": "input-bound", "low_util": "low utilisation", "productive": "productive",
          "unobserved": "unobserved (no agent sampled)", "unclassified": "unclassified (before goodput)"}
JOULES_PER_KWH = 3.6e6


@dataclass(frozen=True)
class Rates:
    currency: str | None = None
    default_price: float | None = None  # per GPU-hour
    prices: dict[str, float] = field(default_factory=dict)  # GPU model -> per GPU-hour
    default_grid: float | None = None  # gCO2e per kWh
    grid: dict[str, float] = field(default_factory=dict)  # cluster -> gCO2e per kWh
    series: tuple[tuple[str, float, float], ...] = ()  # (cluster, from epoch s, gCO2e per kWh), by time

    def price(self, model: str) -> float | None:
        return self.prices.get(model, self.default_price)

    def intensity(self, cluster: str, at: datetime) -> float | None:
        seconds = at.replace(tzinfo=at.tzinfo or UTC).timestamp()
        latest = None
        for name, start, value in self.series:
            if name == cluster and start <= seconds:
                latest = value
        return latest if latest is not None else self.grid.get(cluster, self.default_grid)

    @property
    def costed(self) -> bool:
        return self.default_price is not None or bool(self.prices)

    @property
    def carbon(self) -> bool:
        return self.default_grid is not None or bool(self.grid) or bool(self.series)


class RatesError(ValueError):
    """A rates file that cannot be used; the text says where and why."""


def load_rates(path: Path | None) -> Rates:
    if path is None:
        return Rates()
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise RatesError(f"rates file {path}: no such file") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RatesError(f"rates file {path}: {exc}") from exc
    known = {"currency", "default_price_per_gpu_hour", "price_per_gpu_hour", "default_grid_g_per_kwh",
             "grid_g_per_kwh", "grid_series"}
    if set(raw) - known:
        raise RatesError(f"rates file {path}: unknown keys {', '.join(sorted(set(raw) - known))}; "
                         f"known: {', '.join(sorted(known))}")
    for table in ("price_per_gpu_hour", "grid_g_per_kwh"):
        if not isinstance(raw.get(table, {}), dict):
            raise RatesError(f"rates file {path}: {table} must be a table ([{table}] with a number per "
                             f"{'GPU model' if table.startswith('price') else 'cluster'}), not {raw[table]!r}")
    if not isinstance(raw.get("grid_series", []), list) or not all(
        isinstance(p, dict) for p in raw.get("grid_series", [])
    ):
        raise RatesError(f"rates file {path}: grid_series must be [[grid_series]] tables")
    if not isinstance(raw.get("currency", ""), str):
        raise RatesError(f"rates file {path}: currency must be text, such as \"USD\"")

    def number(value, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise RatesError(f"rates file {path}: {where} must be a number >= 0, not {value!r}")
        return float(value)

    series = []
    for i, point in enumerate(raw.get("grid_series", [])):
        start = point.get("start")
        if not isinstance(start, datetime):
            raise RatesError(
                f"rates file {path}: grid_series[{i}].start must be a date and time (2026-06-01T00:00:00Z)"
            )
        series.append((str(point.get("cluster", "")), start.replace(tzinfo=start.tzinfo or UTC).timestamp(),
                       number(point.get("g_per_kwh"), f"grid_series[{i}].g_per_kwh")))
    return Rates(
        currency=raw.get("currency"),
        default_price=None if "default_price_per_gpu_hour" not in raw
        else number(raw["default_price_per_gpu_hour"], "default_price_per_gpu_hour"),
        prices={k: number(v, f"price_per_gpu_hour.{k}") for k, v in raw.get("price_per_gpu_hour", {}).items()},
        default_grid=None if "default_grid_g_per_kwh" not in raw
        else number(raw["default_grid_g_per_kwh"], "default_grid_g_per_kwh"),
        grid={k: number(v, f"grid_g_per_kwh.{k}") for k, v in raw.get("grid_g_per_kwh", {}).items()},
        series=tuple(sorted(series, key=lambda p: p[1])),
    )


@dataclass
class Bucket:
    gpu_seconds: float = 0.0
    joules: float = 0.0
    cost: float = 0.0
    grams: float = 0.0

    def add(self, seconds: float, joules: float, price: float | None, intensity: float | None) -> None:
        self.gpu_seconds += seconds
        self.joules += joules
        self.cost += seconds / 3600 * (price or 0.0)
        self.grams += joules / JOULES_PER_KWH * (intensity or 0.0)


@dataclass
class Waterfall:
    """One group's GPU-seconds, energy, cost and carbon per bucket (``unclassified``: windows
    written before goodput)."""

    key: str
    buckets: dict[str, Bucket] = field(default_factory=lambda: {b: Bucket() for b in (*BUCKETS, "unclassified")})
    unallocated: Bucket = field(default_factory=Bucket)  # a fleet's: GPUs no job held (not in ``allocated``)

    @property
    def allocated(self) -> Bucket:
        total = Bucket()
        for b in self.buckets.values():
            total.gpu_seconds += b.gpu_seconds
            total.joules += b.joules
            total.cost += b.cost
            total.grams += b.grams
        return total

    @property
    def goodput_pct(self) -> float:
        """Productive of the observed, classified GPU-seconds (``schemas.vocabulary.GOODPUT``)."""
        classified = (self.allocated.gpu_seconds - self.buckets["unclassified"].gpu_seconds
                      - self.buckets["unobserved"].gpu_seconds)
        return 100.0 * self.buckets["productive"].gpu_seconds / classified if classified > 0 else 0.0


def _money(value: float, rates: Rates) -> str:
    return f"{value:,.2f} {rates.currency or ''}".rstrip()


def energy_head(rates: Rates) -> list[str]:
    """The headings of ``energy_cells``."""
    return [f"{'kWh':>9}", *([f"{'kg CO2e':>9}"] if rates.carbon else []), *([f"{'cost':>14}"] if rates.costed else [])]


def energy_cells(b: Bucket, rates: Rates) -> list[str]:
    """kWh, and where the rates allow, kg CO2e and cost, of ``b``."""
    return [f"{b.joules / JOULES_PER_KWH:>9,.2f}", *([f"{b.grams / 1000:>9,.2f}"] if rates.carbon else []),
            *([f"{_money(b.cost, rates):>14}"] if rates.costed else [])]


def render_waterfall(w: Waterfall, rates: Rates, title: str) -> str:
    """The waterfall as a table: a row per bucket, GPU-hours and share, kWh, and where the
    rates allow, kg CO2e and cost."""
    total = w.allocated
    head = [f"{'bucket':<32}", f"{'GPU-hours':>10}", f"{'share':>7}", *energy_head(rates)]
    lines = [title, "  ".join(head), "  ".join("-" * len(h) for h in head)]
    rows = [(LABELS[name], b) for name, b in w.buckets.items()
            if name not in ("unclassified", "unobserved") or b.gpu_seconds]
    for label, b in [*rows, ("allocated", total)]:
        share = 100.0 * b.gpu_seconds / total.gpu_seconds if total.gpu_seconds else 0.0
        lines.append("  ".join([f"{label:<32}", f"{b.gpu_seconds / 3600:>10,.2f}", f"{share:>6.1f}%",
                                *energy_cells(b, rates)]))
    free = w.unallocated
    if free.gpu_seconds:
        capacity = Bucket(total.gpu_seconds + free.gpu_seconds, total.joules + free.joules, total.cost + free.cost,
                          total.grams + free.grams)
        lines.append("  ".join("-" * len(h) for h in head))
        for label, b in (("unallocated (no job held them)", free), ("capacity", capacity)):
            share = 100.0 * b.gpu_seconds / capacity.gpu_seconds
            lines.append("  ".join([f"{label:<32}", f"{b.gpu_seconds / 3600:>10,.2f}", f"{share:>6.1f}%",
                                    *energy_cells(b, rates)]))
        lines.append(f"allocated: {100.0 * total.gpu_seconds / capacity.gpu_seconds:.1f}% of the capacity was "
                     "handed to jobs")
    wasted = sum(w.buckets[b].gpu_seconds for b in WASTE_BUCKETS)
    lines.append(f"wasted: {wasted / 3600:,.2f} GPU-hours, the allocated that did no productive work "
                 "(every bucket but productive: docs/vocabulary.md)")
    unseen = w.buckets["unobserved"].gpu_seconds
    lines.append(f"goodput: {w.goodput_pct:.1f}% of the allocated GPU-hours did productive work"
                 + (f" (of those observed: {unseen / 3600:,.2f} GPU-hours no agent sampled)" if unseen else ""))
    return "\n".join(lines)


# -- the job-end report ---------------------------------------------------------------------

_ADVICE = {
    "unhealthy": "GPUs reported faults or ran under a power or thermal limit: tell the cluster's operators "
                 "the hosts (gpufleet workflow shows when).",
    "startup": "Start-up took long: cache the container image and the dataset near the GPUs, load the "
               "checkpoint in parallel, or compile ahead of time.",
    "idle": "GPUs sat at 0 % while held: release them when the job waits, and check for a rank that stopped.",
    "input_bound": "The GPUs waited for input: more DataLoader workers, pin_memory, a faster or local "
                   "dataset, or preprocessing moved off the training hosts.",
    "low_util": "The GPUs were busy but lightly: a larger batch, fewer GPUs, or a profile "
                "(gpufleet profile) to find what keeps them waiting.",
}

# A serving replica's windows are idle where it served no request (``judged_windows``): what its owner can do.
_REPLICA_ADVICE = {
    "idle": "The replica served no request while it held its GPUs: scale the deployment down when traffic is low "
            "(fewer replicas, or scale to zero), or send it traffic.",
}


# The productive GPU-hours of a profiled job, by what its profiles show the GPU doing.
PROFILE_SPLIT = (("compute", "kernel compute"), ("exposed_communication", "exposed communication"),
                 ("other", "other GPU work (copies, overlapped comm.)"),
                 ("launch_overhead", "host launch overhead (GPU idle)"))

RIGHT_SIZE_FIELDS = ("kind", "current", "recommended", "reason", "source", "gpu_hours_freed")


def right_size_of(summary: dict) -> list[dict]:
    """The summary's right-size records as dicts (a stored row has them as tuples)."""
    return [r if isinstance(r, dict) else dict(zip(RIGHT_SIZE_FIELDS, r)) for r in summary.get("right_size") or []]


def summary_waterfall(summary: dict, rates: Rates | None = None, cluster: str = "") -> Waterfall:
    """A ``WorkflowSummary``'s buckets as a waterfall (cost and carbon from ``rates``)."""
    rates = rates or Rates()
    w = Waterfall(summary["workflow_id"])
    end = datetime.fromtimestamp(summary["last_window_end"] / 1000, UTC)
    price, intensity = rates.price(summary.get("gpu_model") or ""), rates.intensity(cluster, end)
    for b in BUCKETS:
        w.buckets[b].add(summary.get(f"{b}_gpu_seconds", 0.0), summary.get(f"{b}_joules", 0.0), price, intensity)
    unclassified = summary["gpu_seconds"] - sum(summary.get(f"{b}_gpu_seconds", 0.0) for b in BUCKETS)
    if unclassified > 1e-6:
        w.buckets["unclassified"].add(unclassified, 0.0, price, intensity)
    return w


def efficiency_line(summary: dict) -> str:
    """The job's efficiency in one line, as schedulers' accounting keeps it (Slurm's
    AdminComment, as the jobstats tools do): GPU-hours, goodput, the largest loss, mean
    utilisation. Lower case and without quotes: Slurm's accounting stores it so."""
    w = summary_waterfall(summary)
    total = max(w.allocated.gpu_seconds, 1e-9)
    losses = sorted(((v.gpu_seconds, b) for b, v in w.buckets.items() if b in WASTE_BUCKETS and v.gpu_seconds > 0),
                    reverse=True)
    loss = f"largest loss {LABELS[losses[0][1]]} {100 * losses[0][0] / total:.1f}%" if losses else "no loss"
    ended = f", ended {ended_as(summary)}" if summary.get("end_state") else ""
    return (f"gpufleet: {w.allocated.gpu_seconds / 3600:.2f} gpu-hours, goodput {w.goodput_pct:.1f}%, {loss}, "
            f"mean gpu utilisation {summary['utilization_mean_pct']:.1f}%{ended}").lower()


def ended_as(summary: dict) -> str:
    """How the scheduler says the job ended: "CANCELLED by ana", "FAILED (exit code 3)", "TIMEOUT"."""
    state = summary["end_state"]
    if state == "CANCELLED" and summary.get("cancelled_by"):
        return f"{state} by {summary['cancelled_by']}"
    if state in ("FAILED", "OUT_OF_MEMORY") and (summary.get("exit_code") or summary.get("exit_signal")):
        return f"{state} (exit code {summary.get('exit_code') or 0}" + (
            f", signal {summary['exit_signal']})" if summary.get("exit_signal") else ")")
    return state


def _ms(value) -> int | None:
    """A time as a summary holds it: epoch ms from the wire, a datetime from ClickHouse."""
    if value is None or isinstance(value, int):
        return value
    return int(value.timestamp() * 1000)


def job_report(summary: dict, rates: Rates | None = None, cluster: str = "") -> tuple[str, str]:
    """The report an owner gets when a workflow ends: plain text and HTML, from its
    ``WorkflowSummary``. Like the jobstats report HPC users know: what the job used, where
    the GPU-hours went, what went wrong and what to try."""
    rates = rates or Rates()
    w = summary_waterfall(summary, rates, cluster)
    began, ended = _ms(summary.get("allocated_at")), _ms(summary.get("ended_at"))
    scheduled = began is not None and ended is not None  # the scheduler's start and end, to the second it gives
    first, last = (began, ended) if scheduled else (summary["first_window_start"], summary["last_window_end"])
    start, end = datetime.fromtimestamp(first / 1000, UTC), datetime.fromtimestamp(last / 1000, UTC)
    hours = (last - first) / 3_600_000
    clock = "%Y-%m-%d %H:%M:%S" if scheduled else "%Y-%m-%d %H:%M"
    lines = [
        f"gpufleet job report: {summary['workflow_id']}",
        f"owner {summary.get('owner') or '-'}, team {summary.get('team') or '-'}; ended: {summary['end_reason']}",
        f"ran {start:{clock}} to {end:{clock}} UTC ({hours:.2f} h"
        + (f", as {summary.get('scheduler')} says" if scheduled else "") + f") on up to {summary['max_gpus']} GPU(s)"
        + (f" ({summary['gpu_model']})" if summary.get("gpu_model") else ""),
        f"mean GPU utilisation {summary['utilization_mean_pct']:.1f}%"
        + (f", memory peak {100 * summary['memory_peak_fraction']:.0f}%" if summary.get("memory_peak_fraction")
           is not None else "")
        + (f", tensor cores active {summary['tensor_active_mean_pct']:.1f}% (hardware MFU estimate)"
           if summary.get("tensor_active_mean_pct") is not None else "")
        + (f", model FLOPs utilisation {summary['model_mfu_pct']:.1f}% (from the work the job reported)"
           if summary.get("model_mfu_pct") is not None else ""),
        "",
        render_waterfall(w, rates, "Where the GPU-hours went"),
    ]
    split = summary.get("profile_split")
    productive = summary.get("productive_gpu_seconds", 0.0)
    if split and productive > 0:
        lines += ["", (f"The productive {productive / 3600:.2f} GPU-hours, split as its profiles "
                      f"({split['traces']} trace(s)) spent the GPU's time:")]
        lines += [f"  {label:<38} {productive * split[key] / 3600:>8.2f} GPU-h  {100 * split[key]:5.1f}%"
                  for key, label in PROFILE_SPLIT]
    wasted = sorted(((w.buckets[b].gpu_seconds, b) for b in _ADVICE if w.buckets[b].gpu_seconds > 0), reverse=True)
    alerts = summary.get("alerts_fired") or []
    untouched, gpus = summary.get("untouched_gpus") or 0, summary["max_gpus"]
    if untouched and untouched >= gpus:  # one cause for its start-up and idle hours: said as such
        held = sum(seconds for seconds, b in wasted if b in ("startup", "idle"))
        wasted = [(seconds, b) for seconds, b in wasted if b not in ("startup", "idle")]
    if wasted or alerts or untouched:
        lines += ["", "What to try:"]
        if untouched and untouched >= gpus:
            lines.append(f"- No process of the job ever opened its {gpus} GPU(s) ({held / 3600:.2f} GPU-hours held "
                         "unused): it ran on the CPU only, or stopped before it reached them. If it needs no GPU, "
                         "submit it without GPUs (no --gres=gpu, no nvidia.com/gpu); if it should use them, check "
                         "that it sees them (CUDA_VISIBLE_DEVICES, the container's GPU runtime, torch.cuda).")
        elif untouched:
            lines.append(f"- {untouched} of its {gpus} GPUs were never opened by any process of the job: ask for "
                         f"{gpus - untouched}, or check that every rank binds its own GPU.")
        advice = {**_ADVICE, **(_REPLICA_ADVICE if summary.get("service") else {})}
        lines += [f"- {LABELS[b]} ({seconds / 3600:.2f} GPU-hours): {advice[b]}" for seconds, b in wasted
                  if seconds / max(summary["gpu_seconds"], 1e-9) >= 0.01]
        if alerts:
            lines.append(f"- alerts raised while it ran: {', '.join(alerts)}")
    sizes = right_size_of(summary)
    if sizes:
        lines += ["", "What to ask for next time:"]
        lines += [f"- {r['recommended']}" + (f" instead of {r['current']}" if r.get("current") else "")
                  + f": {r['reason']}"
                  + (f"; {r['gpu_hours_freed']:.2f} GPU-hours freed over this run" if r["gpu_hours_freed"] > 0 else "")
                  + f" (from {r['source']})" for r in sizes]
    text = "\n".join(lines) + "\n"
    rows = "".join(
        f"<tr><td>{html.escape(LABELS[b])}</td><td>{v.gpu_seconds / 3600:.2f}</td>"
        f"<td>{100 * v.gpu_seconds / max(w.allocated.gpu_seconds, 1e-9):.1f}%</td>"
        f"<td>{v.joules / JOULES_PER_KWH:.2f}</td></tr>"
        for b, v in w.buckets.items() if v.gpu_seconds)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(summary['workflow_id'])}</title>"
            f"</head><body><h1>Job report: {html.escape(summary['workflow_id'])}</h1>"
            f"<pre>{html.escape(chr(10).join(lines[1:4]))}</pre>"
            f"<table><tr><th>bucket</th><th>GPU-hours</th><th>share</th><th>kWh</th></tr>{rows}</table>"
            f"<p>Goodput: {w.goodput_pct:.1f}%</p>"
            + "".join(f"<p>{html.escape(line)}</p>" for line in lines if line.startswith("- "))
            + "</body></html>")
    return text, page
