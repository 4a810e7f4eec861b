"""How the owners' service reads, so that owners never slow the sink down: every figure through
``gpufleet.web.data``, at most ``concurrency`` reads at once (the rest wait their turn, up to
``wait_s``, then are told the service is busy: 503), and what was read kept:

- a job's page (its owner and team, the job, its charts) until the job changes: every
  ``fresh_s`` one query asks whether anything any kept page shows changed (``data.versions``),
  and only a page that did is read again, at its next request; a job that ended costs nothing
  more, however often its owner opens it;
- lists and totals for ``fresh_s``.

An action taken here forgets the job's page at once. Who may see what is checked on every
request, before anything of the job is read or returned: the job's owner and team are read (and
kept) first, and a job the viewer may not see is None, as one that does not exist, at the same cost.
"""

from __future__ import annotations

import json
import logging
import threading

from cachetools import TTLCache

from gpufleet.web import data
from gpufleet.web.access import Viewer
from sinks.job_report import Rates

_MISSING = object()
log = logging.getLogger(__name__)


class Busy(Exception):
    """Every read is taken for longer than the service waits; the text says so."""


class Reader:
    def __init__(self, client, database: str, rates: Rates | None = None, fresh_s: float = 30.0,
                 longest_s: float = 3600.0, concurrency: int = 2, wait_s: float = 20.0) -> None:
        self.client, self.database, self.rates = client, database, rates or Rates()
        self.fresh_s, self.wait_s = fresh_s, wait_s
        self._pages: TTLCache = TTLCache(maxsize=4096, ttl=longest_s)  # (what, job) -> value, until it changes
        self._lists: TTLCache = TTLCache(maxsize=4096, ttl=fresh_s)
        self._seen: dict[str, tuple] = {}  # job -> its version when its page was read
        self._lock = threading.Lock()
        self._work = threading.BoundedSemaphore(concurrency)
        self._stop = threading.Event()
        threading.Thread(target=self._watch, name="owners-pages", daemon=True).start()

    def _get(self, cache: TTLCache, key: tuple, build):
        with self._lock:
            value = cache.get(key, _MISSING)
        if value is not _MISSING:
            return value
        if not self._work.acquire(timeout=self.wait_s):
            raise Busy(f"the service has been busy for {self.wait_s:g} s; try again in a moment")
        try:
            with self._lock:  # read by another request while this one waited
                value = cache.get(key, _MISSING)
            if value is _MISSING:
                value = build()
                with self._lock:
                    cache[key] = value
        finally:
            self._work.release()
        return value

    def _page(self, key: tuple, build):
        """A job's page part, noting the job's version the first time its page is read."""
        workflow_id = key[1]
        with self._lock:
            new = workflow_id not in self._seen
        if new:
            seen = data.versions(self.client, self.database, [workflow_id]).get(workflow_id)
            with self._lock:
                self._seen.setdefault(workflow_id, seen)
        return self._get(self._pages, key, build)

    def _watch(self) -> None:
        """Every ``fresh_s``: the kept pages whose jobs changed are forgotten (read again when asked)."""
        while not self._stop.wait(self.fresh_s):
            with self._lock:
                jobs = sorted(self._seen)
            if not jobs:
                continue
            try:
                now = data.versions(self.client, self.database, jobs)
            except Exception:  # the pages are kept as they are; asked again at the next turn
                log.exception("could not tell which pages changed")
                continue
            for workflow_id in jobs:
                with self._lock:
                    changed = self._seen.get(workflow_id) != now.get(workflow_id)
                if changed:
                    self.forget(workflow_id)

    def stop(self) -> None:
        self._stop.set()

    def forget(self, workflow_id: str) -> None:
        """The job changed (an action here, or its rows): its page is read again when asked."""
        with self._lock:
            self._seen.pop(workflow_id, None)
            for what in ("owner", "job", "job.json", "figures"):
                self._pages.pop((what, workflow_id), None)

    # -- what the routes ask ------------------------------------------------------------------
    def visible(self, viewer: Viewer, workflow_id: str) -> bool:
        known = self._page(("owner", workflow_id), lambda: data.owner_of(self.client, self.database, workflow_id))
        return known is not None and viewer.sees(*known)

    def job(self, viewer: Viewer, workflow_id: str) -> dict | None:
        if not self.visible(viewer, workflow_id):
            return None
        everyone = Viewer("", operator=True, via="service")  # (the check above is this viewer's)
        job = self._page(("job", workflow_id), lambda: data.job(self.client, self.database, everyone, workflow_id,
                                                                self.rates))
        return None if job is None else dict(job)

    def job_json(self, viewer: Viewer, workflow_id: str, url: str) -> bytes | None:
        """The job as its JSON twin says it (``url``: its page's address), encoded once per version."""
        job = self.job(viewer, workflow_id)
        if job is None:
            return None
        return self._page(("job.json", workflow_id), lambda: _json({**job, "url": url}))

    def figures(self, viewer: Viewer, workflow_id: str) -> bytes | None:
        """The job's charts as Plotly figures, in JSON, encoded once per version."""
        from gpufleet.web.figures import gpu_figure, traffic_figure, waterfall_figure

        job = self.job(viewer, workflow_id)
        if job is None:
            return None

        def build() -> bytes:
            series = data.gpu_series(self.client, self.database, workflow_id)
            return _json({"state": job["state"], "step_s": series["step_s"], "gpus": gpu_figure(series),
                          "waterfall": waterfall_figure(job["waterfall"]),
                          "traffic": None if job["serving"] is None else traffic_figure(job["serving"])})

        return self._page(("figures", workflow_id), build)

    def jobs(self, viewer: Viewer, since_s: float, state: str = "all", owner: str | None = None,
             team: str | None = None, sort: str = "wasted") -> list[dict]:
        key = ("jobs", viewer.user, viewer.operator, tuple(sorted(viewer.teams)), since_s, state, owner, team, sort)
        return self._get(self._lists, key, lambda: data.jobs(self.client, self.database, viewer, since_s, state,
                                                             owner, team, sort))

    def services(self, viewer: Viewer, since_s: float, team: str | None = None) -> list[dict]:
        from gpufleet.web import services

        key = ("services", viewer.user, viewer.operator, tuple(sorted(viewer.teams)), since_s, team)
        return self._get(self._lists, key, lambda: services.services(self.client, self.database, viewer, since_s,
                                                                     team))

    def service(self, viewer: Viewer, name: str, since_s: float) -> dict | None:
        """A service over the replicas the viewer may see, with its chart (a Plotly figure)."""
        from gpufleet.web import services
        from gpufleet.web.figures import service_figure

        def build() -> dict | None:
            found = services.service(self.client, self.database, viewer, name, since_s)
            return None if found is None else {**found, "figure": service_figure(found)}

        key = ("service", name, viewer.user, viewer.operator, tuple(sorted(viewer.teams)), since_s)
        return self._get(self._lists, key, build)

    def totals(self, viewer: Viewer, since_s: float, since_text: str, team: str | None) -> dict | None:
        """A team's totals (its members, leads and operators) or the fleet's (operators), with where
        their GPU-hours were lost most, as ``gpufleet opportunities`` ranks it."""
        if not (viewer.operator or (team is not None and team in viewer.teams)):
            return None

        def build() -> dict | None:
            from gpufleet.reports.opportunities import opportunities

            everyone = Viewer("", operator=True, via="service")
            totals = data.group_totals(self.client, self.database, everyone, since_s, team)
            columns, rows = opportunities(self.client, self.database, "cause" if team is None else "workflow",
                                          since_text, limit=10 if team is None else 100)
            if team is not None:  # the team's workflows only
                members = {j["workflow_id"] for j in data.jobs(self.client, self.database, everyone, since_s,
                                                               team=team)}
                rows = [r for r in rows if r[0] in members][:10]
            totals["opportunities"] = data.clean({"columns": columns, "rows": [list(r) for r in rows]})
            return totals

        return self._get(self._lists, ("totals", team, since_s, since_text), build)


def _json(value) -> bytes:
    """As Starlette's JSONResponse encodes (compact, no NaN), once."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
