"""``gpufleet serve``: the owners' service, a Starlette application (served by
``gpufleet.asgi_server``). Every page has a JSON twin under ``/api`` (``docs/owners.md``).

Every request but ``PUBLIC`` ones is first told who asks (``gpufleet.web.identity``: a MUNGE
credential, the site proxy's header from a trusted address, or -- in development mode only, on
loopback -- the developer); one that cannot be told is refused before any route runs. Then
every route asks ``gpufleet.web.data`` with that viewer, which keeps each query to what they
may see: someone else's job answers 404 "no such job", as one that does not exist.
"""

from __future__ import annotations

import contextlib
import logging
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from gpufleet.reports.serving import duration
from gpufleet.web import data
from gpufleet.web.access import Directory, Viewer
from gpufleet.web.actions import ACTION_HEADER, ActionRefused, Actions
from gpufleet.web.identity import MUNGE_HEADER, IdentityError, Munge, ProxyTrust, request_payload
from gpufleet.web.reading import Busy, Reader
from schemas.validate_ids import id_error
from sinks.job_report import Rates
from sinks.route_alerts import page_url

log = logging.getLogger(__name__)

PUBLIC = frozenset({"/healthz", "/static/plotly.min.js"})
NOT_FOUND = "no such job"
NO_SERVICE = "no such service"
PAGE_WINDOWS = 120  # a job page's table of windows: the latest these many (the JSON has them all)


@dataclass
class Service:
    client: object  # a clickhouse-connect client, or the query server's (read-only, bounded)
    database: str
    directory: Directory = field(default_factory=Directory)
    trust: ProxyTrust = field(default_factory=ProxyTrust)
    munge: Munge | None = None
    dev_user: str | None = None  # development mode: requests with no identity are this operator
    base_url: str = ""
    rates: Rates = field(default_factory=Rates)
    actions: Actions | None = None  # None: the service takes no actions (no Kafka)
    fresh_s: float = 30.0  # a page older than this is served and read again (gpufleet.web.reading)


def job_url(base_url: str, workflow_id: str) -> str:
    """The job page's address: the one messages link to (``sinks.route_alerts.page_url``)."""
    return page_url(base_url, workflow_id)


class WhoIsAsking:
    """ASGI middleware: the viewer into ``scope['state']['viewer']``, or the refusal."""

    def __init__(self, app, service: Service) -> None:
        self.app, self.service = app, service

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC:
            await self.app(scope, receive, send)
            return
        from starlette.concurrency import run_in_threadpool

        try:
            viewer = await run_in_threadpool(self.identify, scope)
        except IdentityError as exc:
            wants_json = scope["path"].startswith("/api/")
            body = {"error": str(exc)}
            response = JSONResponse(body, 401) if wants_json else PlainTextResponse(str(exc) + "\n", 401)
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["viewer"] = viewer
        await self.app(scope, receive, send)

    def identify(self, scope) -> Viewer:
        s = self.service
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        client = (scope.get("client") or (None,))[0]
        credential = headers.get(MUNGE_HEADER.lower())
        if credential is not None:
            if s.munge is None:
                raise IdentityError("this service does not take MUNGE credentials")
            query = scope.get("query_string", b"").decode("latin-1")
            path = scope["path"] + (f"?{query}" if query else "")
            return s.directory.viewer(s.munge.decode(credential, request_payload(scope["method"], path)), "munge")
        named = headers.get(s.trust.header.lower())
        if named is not None:
            if not (s.trust.trusts(client) or (s.dev_user and _loopback(client))):
                log.warning("refused %s from %s: not a configured proxy", s.trust.header, client)
                raise IdentityError(f"the {s.trust.header} header is believed only from the site's proxy")
            if id_error("owner", named):
                raise IdentityError(f"the proxy named no valid user ({id_error('owner', named)})")
            return s.directory.viewer(named, "proxy")
        if s.dev_user and _loopback(client):
            return Viewer(s.dev_user, operator=True, via="development")
        raise IdentityError("who is asking? Open this service through the site's login (its proxy), or use "
                            "`gpufleet job` on a login node")


def _loopback(address: str | None) -> bool:
    return address in ("127.0.0.1", "::1")


class Routes:
    """Every route of the service, each asking ``gpufleet.web.data`` as the request's viewer."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.reader = Reader(service.client, service.database, service.rates, fresh_s=service.fresh_s)
        self.env = Environment(loader=PackageLoader("gpufleet.web", "templates"), autoescape=select_autoescape())
        self.env.filters["quote"] = lambda v: urllib.parse.quote(str(v), safe="")
        self.env.filters["hours"] = lambda v: "-" if v is None else f"{v:,.2f}"
        self.env.filters["pct"] = lambda v: "-" if v is None else f"{v:.1f}%"
        self.env.filters["duration"] = lambda v: "-" if v is None else duration(v)

    # -- what every route does alike ---------------------------------------------------------
    @staticmethod
    def viewer(request: Request) -> Viewer:
        return request.state.viewer

    def page(self, request: Request, template: str, status: int = 200, **values) -> HTMLResponse:
        html = self.env.get_template(template).render(viewer=self.viewer(request),
                                                      dev=self.service.dev_user is not None, **values)
        return HTMLResponse(html, status)

    @staticmethod
    def since(request: Request) -> float:
        from gpufleet.reports.opportunities import parse_since

        seconds = parse_since(request.query_params.get("since", "7d"))  # (a ValueError: 400)
        return 10 * 365 * 86400 if seconds is None else seconds

    def job_list(self, request: Request, **fixed) -> list[dict]:
        q = {**request.query_params, **fixed}
        state, sort = q.get("state", "all"), q.get("sort", "wasted")
        if state not in data.STATES or sort not in data.SORTS:
            raise ValueError(f"state is one of {', '.join(data.STATES)}; sort one of {', '.join(data.SORTS)}")
        return self.reader.jobs(self.viewer(request), self.since(request), state, q.get("owner") or None,
                                q.get("team") or None, sort)

    def the_job(self, request: Request) -> dict | None:
        wf = request.path_params["workflow_id"]
        return None if id_error("workflow_id", wf) else self.reader.job(self.viewer(request), wf)

    def totals(self, request: Request, team: str | None) -> dict | None:
        return self.reader.totals(self.viewer(request), self.since(request), request.query_params.get("since", "7d"),
                                  team)

    # -- pages -------------------------------------------------------------------------------
    def home(self, request: Request) -> Response:
        return RedirectResponse("/jobs", 303)

    def jobs_page(self, request: Request) -> Response:
        return self.page(request, "jobs.html", jobs=self.job_list(request), q=request.query_params,
                         states=data.STATES, sorts=list(data.SORTS),
                         services=self.reader.services(self.viewer(request), self.since(request)))

    def the_service(self, request: Request) -> dict | None:
        from schemas.validate_sample import service_error

        name = request.path_params["service"]
        return None if service_error(name) else self.reader.service(self.viewer(request), name, self.since(request))

    def service_page(self, request: Request) -> Response:
        service = self.the_service(request)
        if service is None:
            return self.page(request, "missing.html", 404, what=NO_SERVICE)
        return self.page(request, "service.html", s=service, q=request.query_params)

    def job_page(self, request: Request) -> Response:
        job = self.the_job(request)
        if job is None:
            return self.page(request, "missing.html", 404, what=NOT_FOUND)
        rows = job["timeline"]["rows"]  # the page: the latest windows and every one with an alert transition
        shown = [r for i, r in enumerate(rows) if i >= len(rows) - PAGE_WINDOWS or r[-1]]
        return self.page(request, "job.html", job=job, windows=shown, hidden=len(rows) - len(shown),
                         actions=self.service.actions is not None)

    def team_page(self, request: Request) -> Response:
        team = request.path_params["team"]
        totals = self.totals(request, team)
        if totals is None:
            return self.page(request, "missing.html", 404, what="no such team")
        return self.page(request, "group.html", totals=totals, jobs=self.job_list(request, team=team),
                         services=self.reader.services(self.viewer(request), self.since(request), team),
                         title=f"Team {team}")

    def fleet_page(self, request: Request) -> Response:
        totals = self.totals(request, None)
        if totals is None:
            return self.page(request, "missing.html", 404, what="no such page")
        return self.page(request, "group.html", totals=totals, jobs=self.job_list(request),
                         services=self.reader.services(self.viewer(request), self.since(request)), title="The fleet")

    # -- the JSON twins ----------------------------------------------------------------------
    def api_whoami(self, request: Request) -> Response:
        v = self.viewer(request)
        return JSONResponse({"user": v.user, "role": v.role, "teams": sorted(v.teams), "leads": sorted(v.leads),
                             "operator": v.operator, "via": v.via})

    def api_jobs(self, request: Request) -> Response:
        return JSONResponse({"jobs": self.job_list(request)})

    def api_job(self, request: Request) -> Response:
        wf = request.path_params["workflow_id"]
        body = None if id_error("workflow_id", wf) else self.reader.job_json(
            self.viewer(request), wf, job_url(self.service.base_url, wf))
        return JSONResponse({"error": NOT_FOUND}, 404) if body is None else Response(body,
                                                                                      media_type="application/json")

    def api_figures(self, request: Request) -> Response:
        wf = request.path_params["workflow_id"]
        body = None if id_error("workflow_id", wf) else self.reader.figures(self.viewer(request), wf)
        return JSONResponse({"error": NOT_FOUND}, 404) if body is None else Response(body,
                                                                                      media_type="application/json")

    def api_services(self, request: Request) -> Response:
        return JSONResponse({"services": self.reader.services(self.viewer(request), self.since(request))})

    def api_service(self, request: Request) -> Response:
        service = self.the_service(request)
        if service is None:
            return JSONResponse({"error": NO_SERVICE}, 404)
        return JSONResponse({k: v for k, v in service.items() if k != "figure"})

    def api_team(self, request: Request) -> Response:
        team = request.path_params["team"]
        totals = self.totals(request, team)
        if totals is None:
            return JSONResponse({"error": "no such team"}, 404)
        return JSONResponse({**totals, "services": self.reader.services(self.viewer(request), self.since(request),
                                                                        team)})

    def api_fleet(self, request: Request) -> Response:
        totals = self.totals(request, None)
        if totals is None:
            return JSONResponse({"error": "no such page"}, 404)
        return JSONResponse({**totals, "services": self.reader.services(self.viewer(request), self.since(request))})

    async def api_sql(self, request: Request) -> Response:
        from clickhouse_connect.driver.exceptions import ClickHouseError
        from starlette.concurrency import run_in_threadpool

        from gpufleet.sql import run_query
        from sinks.read_path import check_query, refusal

        if not self.viewer(request).operator:  # the embedded engine cannot keep a query to an owner's rows
            return JSONResponse({"error": "ad-hoc SQL is for the fleet's operators"}, 403)
        try:
            body = await request.json()
            check_query(body["sql"])
            columns, rows = await run_in_threadpool(run_query, self.service.client, body["sql"])
        except (ClickHouseError, ValueError, KeyError, TypeError) as exc:  # ClickHouse's refusal, said as such
            return JSONResponse({"error": refusal(exc) if isinstance(exc, ClickHouseError) else str(exc)}, 400)
        return JSONResponse(data.clean({"columns": columns, "rows": [list(r) for r in rows]}))

    async def api_action(self, request: Request) -> Response:
        """An owner's (or an operator's) action on a job (``gpufleet.web.actions``)."""
        from starlette.concurrency import run_in_threadpool

        if request.headers.get(ACTION_HEADER) != "1":  # a cross-site form cannot send it
            return JSONResponse({"error": f"an action needs the {ACTION_HEADER}: 1 header"}, 403)
        if self.service.actions is None:
            return JSONResponse({"error": "this service takes no actions (it was started without Kafka)"}, 503)
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "the body is not JSON"}, 400)
        wf = body.get("workflow_id") if isinstance(body, dict) else None
        if not isinstance(wf, str) or id_error("workflow_id", wf):
            return JSONResponse({"error": NOT_FOUND}, 404)
        viewer = self.viewer(request)
        self.reader.forget(wf)  # what the action checks against is read now, and the page after it too
        job = await run_in_threadpool(self.reader.job, viewer, wf)
        if job is None:
            return JSONResponse({"error": NOT_FOUND}, 404)
        try:
            action = await run_in_threadpool(self.service.actions.act, viewer, job, body)
        except ActionRefused as exc:
            return JSONResponse({"error": str(exc)}, 400)
        finally:
            self.reader.forget(wf)
        log.info("%s (%s) %s on %s", action["actor"], action["role"], action["kind"], wf)
        return JSONResponse(action, 202)

    # -- public ------------------------------------------------------------------------------
    def healthz(self, request: Request) -> Response:
        return PlainTextResponse("ok\n")

    def plotly_js(self, request: Request) -> Response:
        from gpufleet.web.figures import PLOTLY_JS

        return FileResponse(Path(str(PLOTLY_JS)), media_type="text/javascript",
                            headers={"Cache-Control": "public, max-age=86400"})

    @staticmethod
    def bad_request(request: Request, exc: Exception) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": str(exc)}, 400)
        return PlainTextResponse(f"{exc}\n", 400)

    @staticmethod
    def unavailable(request: Request, exc: Exception) -> Response:
        """Busy, or ClickHouse refused (its query sessions all taken): said, with when to try again."""
        from sinks.read_path import refusal

        said = str(exc) if isinstance(exc, Busy) else f"the fleet's database could not answer: {refusal(exc)}"
        log.warning("%s: %s", request.url.path, said)
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": said}, 503, headers={"Retry-After": "5"})
        return PlainTextResponse(said + "\n", 503, headers={"Retry-After": "5"})


def create_app(service: Service) -> Starlette:
    r = Routes(service)
    routes = [
        Route("/", r.home), Route("/jobs", r.jobs_page), Route("/jobs/{workflow_id:path}", r.job_page),
        Route("/services/{service:path}", r.service_page), Route("/teams/{team}", r.team_page),
        Route("/fleet", r.fleet_page),
        Route("/api/whoami", r.api_whoami), Route("/api/jobs", r.api_jobs),
        Route("/api/jobs/{workflow_id:path}", r.api_job), Route("/api/figures/{workflow_id:path}", r.api_figures),
        Route("/api/services", r.api_services), Route("/api/services/{service:path}", r.api_service),
        Route("/api/teams/{team}", r.api_team), Route("/api/fleet", r.api_fleet),
        Route("/api/sql", r.api_sql, methods=["POST"]), Route("/api/actions", r.api_action, methods=["POST"]),
        Route("/healthz", r.healthz), Route("/static/plotly.min.js", r.plotly_js),
    ]
    from clickhouse_connect.driver.exceptions import ClickHouseError

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        r.reader.stop()  # the served pages' watch ends with the server

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={ValueError: r.bad_request, Busy: r.unavailable, ClickHouseError: r.unavailable})
    app.add_middleware(WhoIsAsking, service=service)
    app.state.reader = r.reader  # (the pages it keeps: a benchmark forgets them to time a first view)
    return app
