"""The periodic reports (monthly by default), as jobstats' utilisation reports are: each owner gets
their GPU-hours, goodput, largest losses, the jobs to look at and the change since the period
before; each team's leads (its sponsors) the team's, owner by owner. Sent by e-mail through the
notifier (``gpufleet notify --reports month``), once each: what was sent is kept in the
notifier's sent log, so a restart sends nothing twice and a period missed while it was down is
sent when it comes back.

The figures are the goodput waterfall's (``goodput_hourly``, ``schemas.vocabulary``): the same
GPU-hours and goodput ``gpufleet goodput --by owner`` gives for the same hours.
"""

from __future__ import annotations

import html
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from gpufleet.reports.serving import idle_line, peak_line, service_loads
from schemas.vocabulary import JOBS, WASTE_BUCKETS
from sinks.job_report import BUCKETS, LABELS, Waterfall
from sinks.route_alerts import page_url, service_url

log = logging.getLogger(__name__)

PERIODS = ("month", "week", "day")
TOP_JOBS = 5
# A service's lines as `gpufleet serving` gives them by default: its busiest 10 minutes, +20 %.
PEAK_SPAN_S, MARGIN, IDLE_FOR_S = 600.0, 0.2, 7200.0


def period_start(period: str, at: datetime) -> datetime:
    """The start of the ``period`` that holds ``at`` (UTC; weeks start on Monday)."""
    day = at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day
    if period == "week":
        return day - timedelta(days=day.weekday())
    if period == "month":
        return day.replace(day=1)
    raise ValueError(f"a period is one of {', '.join(PERIODS)}, not {period!r}")


def last_whole(period: str, now: datetime) -> tuple[datetime, datetime]:
    """The last whole ``period`` before ``now``: (its start, its end)."""
    end = period_start(period, now)
    return period_start(period, end - timedelta(seconds=1)), end


@dataclass
class Usage:
    """One owner's or team's period: its waterfall, its jobs (most wasted first), its owners."""

    waterfall: Waterfall
    jobs: list[tuple[str, float, float, str | None]] = field(default_factory=list)  # id, GPU-h, wasted h, loss
    owners: dict[str, Waterfall] = field(default_factory=dict)
    services: list = field(default_factory=list)  # streams.serving.service.ServiceLoad of its replicas

    @property
    def gpu_hours(self) -> float:
        return self.waterfall.allocated.gpu_seconds / 3600

    @property
    def wasted_hours(self) -> float:
        return sum(self.waterfall.buckets[b].gpu_seconds for b in WASTE_BUCKETS) / 3600


def usage(client, database: str, key: str, start: datetime, end: datetime) -> dict[str, Usage]:
    """Per owner (``key="owner"``) or team: the period's waterfall and jobs, from ``goodput_hourly``."""
    if key not in ("owner", "team"):
        raise ValueError("usage is by owner or team")
    sums = ", ".join(f"sum({b}_gpu_seconds)" for b in BUCKETS)
    rows = client.query(f"""
        SELECT {key}, owner, workflow_id, sum(unclassified_gpu_seconds), {sums}
        FROM {database}.goodput_hourly
        WHERE period >= %(start)s AND period < %(end)s AND {key} != '' AND {JOBS}
        GROUP BY {key}, owner, workflow_id""", parameters={"start": start, "end": end}).result_rows
    out: dict[str, Usage] = {}
    for name, owner, workflow, unclassified, *seconds in rows:
        u = out.setdefault(name, Usage(Waterfall(name)))
        job, by_owner = Waterfall(workflow), u.owners.setdefault(owner, Waterfall(owner))
        for target in (u.waterfall, job, by_owner):
            for b, s in zip(BUCKETS, seconds):
                target.buckets[b].gpu_seconds += s
            target.buckets["unclassified"].gpu_seconds += unclassified
        wasted = sum(job.buckets[b].gpu_seconds for b in WASTE_BUCKETS)
        loss = max(WASTE_BUCKETS, key=lambda b: job.buckets[b].gpu_seconds) if wasted > 0 else None
        u.jobs.append((workflow, job.allocated.gpu_seconds / 3600, wasted / 3600, LABELS[loss] if loss else None))
    for u in out.values():
        u.jobs.sort(key=lambda j: (-j[2], j[0]))
    serving = service_loads(client, database, f"window_start >= %(start)s AND window_start < %(end)s AND {key} != ''",
                            {"start": start, "end": end}, PEAK_SPAN_S, MARGIN, key)
    for name, loads in serving.items():
        if name in out:
            out[name].services = loads
    return out


def _change(now: float, before: float | None, unit: str) -> str:
    if before is None:
        return "none the period before"
    return f"{before:,.2f}{unit} the period before ({now - before:+,.2f}{unit})"


def report(kind: str, name: str, period: str, start: datetime, end: datetime, now: Usage,
           before: Usage | None, pages: str | None) -> tuple[str, str, str]:
    """(subject, plain text, HTML) of an owner's (``kind="owner"``) or a team's sponsor report."""
    days = f"{start:%Y-%m-%d} to {end - timedelta(seconds=1):%Y-%m-%d}"
    subject = (f"[gpufleet {period}ly report] {'your GPU use' if kind == 'owner' else f'team {name}'}, {days}")
    w = now.waterfall
    lines = [
        f"gpufleet {period}ly report for {'' if kind == 'owner' else 'team '}{name}: {days} (UTC)", "",
        f"GPU-hours: {now.gpu_hours:,.2f}, {_change(now.gpu_hours, before and before.gpu_hours, '')}",
        f"goodput: {w.goodput_pct:.1f}%, {_change(w.goodput_pct, before and before.waterfall.goodput_pct, '%')}",
        f"wasted GPU-hours: {now.wasted_hours:,.2f}", "", "The largest losses:"]
    losses = sorted(((w.buckets[b].gpu_seconds, b) for b in WASTE_BUCKETS if w.buckets[b].gpu_seconds > 0),
                    reverse=True)
    total = max(w.allocated.gpu_seconds, 1e-9)
    lines += [f"  {LABELS[b]:<34} {s / 3600:>10,.2f} GPU-h {100 * s / total:5.1f}%" for s, b in losses[:3]] or \
        ["  none"]
    if kind == "team":
        lines += ["", "Owner by owner (most GPU-hours first):"]
        lines += [f"  {o:<34} {ow.allocated.gpu_seconds / 3600:>10,.2f} GPU-h  goodput {ow.goodput_pct:5.1f}%"
                  for o, ow in sorted(now.owners.items(), key=lambda kv: -kv[1].allocated.gpu_seconds)]
    lines += ["", "The jobs to look at (most GPU-hours wasted):"]
    shown = [j for j in now.jobs if j[2] > 0][:TOP_JOBS]
    for workflow, hours, wasted, loss in shown:
        link = f"  {page_url(pages, workflow)}" if pages else ""
        lines.append(f"  {workflow}: {wasted:,.2f} of {hours:,.2f} GPU-h wasted, mostly {loss}{link}")
    if not shown:
        lines.append("  none: every job's GPU-hours did productive work")
    if now.services:
        lines += ["", "The services of your replicas, by the traffic they served:" if kind == "owner"
                  else "The team's services, by the traffic they served:"]
        for load in now.services:
            link = f" {service_url(pages, load.service)}" if pages else ""
            lines.append(f"  {peak_line(load, PEAK_SPAN_S, MARGIN)}{link}")
            if (idle := idle_line(load, IDLE_FOR_S)) is not None:
                lines.append(f"  {idle}.")
    text = "\n".join(lines) + "\n"
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(subject)}</title></head><body>"
            f"<pre>{html.escape(text)}</pre></body></html>")
    return subject, text, page


@dataclass
class PeriodicReports:
    """Sends the last whole period's reports once each, as soon as it has ended."""

    client_of: Callable[[], object | None]  # a read-only ClickHouse client now, or None (not reachable yet)
    database: str
    routing: object  # sinks.route_alerts.Routing
    leads: Callable[[], dict[str, set[str]]]  # team -> its leads (gpufleet.web.access.Directory.leads_of)
    sent: object  # sinks.sent_log.SentLog
    period: str = "month"
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    sent_now: int = 0

    def tick(self) -> int:
        """Send what is due; how many messages went out."""
        from sinks.notify_owner import NotifyError, deliver_email

        start, end = last_whole(self.period, self.clock())
        done = f"periodic:{self.period}:{start:%Y-%m-%d}:done"
        if done in self.sent or self.routing.smtp is None:
            return 0
        client = self.client_of()
        if client is None:
            log.info("the %s reports wait for ClickHouse", self.period)
            return 0
        before_start = last_whole(self.period, start)[0]
        mails = []
        for kind, key in (("owner", "owner"), ("team", "team")):
            now, before = usage(client, self.database, key, start, end), usage(client, self.database, key,
                                                                               before_start, start)
            for name, u in sorted(now.items()):
                recipients = [name] if kind == "owner" else sorted(self.leads().get(name, ()))
                for person in recipients:
                    address = self.routing.email_for({"owner": person})
                    if address:
                        mails.append((f"periodic:{self.period}:{start:%Y-%m-%d}:{kind}:{name}:{person}", address,
                                      report(kind, name, self.period, start, end, u, before.get(name),
                                             self.routing.pages)))
        sent, failed = 0, 0
        for key, address, (subject, text, page) in mails:
            if key in self.sent:
                continue
            try:
                deliver_email(self.routing.smtp, address, subject, text, page)
            except NotifyError as exc:
                log.warning("%s: %s", key, exc)
                failed += 1
                continue
            self.sent.add(key)
            sent += 1
        if not failed:  # a refused one is tried again at the next tick
            self.sent.add(done)
        self.sent_now += sent
        return sent

    def run(self, stop: threading.Event, every_s: float = 300.0) -> None:
        while True:
            try:
                self.tick()
            except Exception:  # a report that cannot be made must not stop the alerts' notifier
                log.exception("the %s reports could not be sent; tried again in %g s", self.period, every_s)
            if stop.wait(every_s):
                return
