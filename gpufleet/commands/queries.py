"""``gpufleet sql``, ``workflows``, ``workflow``, ``opportunities``, ``report`` and
``clickhouse-users``: what ClickHouse knows."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gpufleet.commands.common import (
    check_id,
    clickhouse_args,
    database_name,
    non_negative,
    positive,
    positive_int,
    query_client,
    rates,
    rates_args,
)
from gpufleet.errors import UsageError


def add(sub) -> None:
    p = sub.add_parser("sql", help="run one SQL query on gpufleet's ClickHouse: read-only and bounded (time, "
                                   "rows, memory: GPUFLEET_QUERY_MAX_SECONDS, _ROWS, _RESULT_BYTES, _MEMORY_BYTES)")
    p.add_argument("query")
    clickhouse_args(p)
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.add_argument("--write", action="store_true",
                   help="an administrator's escape hatch: the query runs with no restriction at all; it can change "
                        "and drop tables, read and write this machine's files (file(), INSERT INTO FUNCTION file) "
                        "and reach the network (url(), remote()). Needs --allow-files-and-network")
    p.add_argument("--allow-files-and-network", action="store_true",
                   help="confirm --write, knowing what it can reach")
    p.set_defaults(func=cmd_sql)

    p = sub.add_parser("workflows", help="workflows with their utilisation, waste and firing alerts")
    clickhouse_args(p)
    p.add_argument("--since-minutes", type=positive, default=1440, help="how far back from the newest window")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.set_defaults(func=cmd_workflows)

    p = sub.add_parser("workflow", help="one workflow's job report (goodput, energy, what to try) and its "
                                        "timeline of windows and alerts")
    p.add_argument("workflow_id")
    clickhouse_args(p)
    rates_args(p)
    service_args(p)
    p.set_defaults(func=cmd_workflow)

    p = sub.add_parser("job", help="a Slurm job's report: the same as `gpufleet workflow slurm-<id>`; an array "
                                   "task by its own id (123_4, or its raw id), an array's id lists its tasks")
    p.add_argument("job_id", help="the Slurm job id, or an array task's (123_4)")
    clickhouse_args(p)
    rates_args(p)
    service_args(p)
    p.set_defaults(func=cmd_job)

    p = sub.add_parser("jobs", help="your jobs (with --url: as the Unix user you are, through MUNGE), with "
                                    "GPU-hours, goodput, the largest loss and the alerts firing")
    p.add_argument("--since", default="7d", help="how far back: 7d, 12h, 30m, or all")
    p.add_argument("--state", choices=["all", "running", "ended"], default="all")
    clickhouse_args(p)
    service_args(p)
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("opportunities", help="rank where the fleet loses the most GPU-hours, and to what")
    clickhouse_args(p)
    p.add_argument("--by", default="cause",
                   choices=["cause", "team", "owner", "workflow", "framework", "model", "cluster", "gpu-model",
                            "antipattern", "regression", "right-size"],
                   help="group by; 'regression': the workflows whose profiles got slower than their previous one; "
                        "'right-size': the GPU-hours ended workflows would have freed asking for what fits them")
    p.add_argument("--since", default="7d", help="how far back: 7d, 12h, 30m, or all")
    p.add_argument("--limit", type=positive_int, default=20)
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.set_defaults(func=cmd_opportunities)

    p = sub.add_parser("goodput", help="where the allocated GPU-hours went: the goodput waterfall, with "
                                       "energy, carbon and cost")
    clickhouse_args(p)
    p.add_argument("--by", default="fleet", choices=["fleet", "team", "owner", "workflow", "framework", "gpu-model",
                                                     "cluster"])
    p.add_argument("--since", default="7d", help="how far back: 7d, 12h, 30m, or all")
    rates_args(p)
    p.add_argument("--limit", type=positive_int, default=20)
    p.set_defaults(func=cmd_goodput)

    p = sub.add_parser("serving", help="serving services judged by their traffic: replicas held against those the "
                                       "busiest span needed, and the GPU-hours held beyond them")
    clickhouse_args(p)
    p.add_argument("--since", default="7d", help="how far back: 7d, 12h, 30m, or all")
    p.add_argument("--peak-span-s", type=positive, default=600.0,
                   help="the span a peak is measured over (default 10 minutes)")
    p.add_argument("--margin", type=non_negative, default=0.2,
                   help="headroom a service keeps above its peak, as a fraction (default 0.2)")
    p.add_argument("--idle-for-s", type=positive, default=7200.0,
                   help="name the replicas that served no request for their last this many seconds (default 2 h)")
    service_args(p)
    p.set_defaults(func=cmd_serving)

    p = sub.add_parser("report", help="write the fleet report: one self-contained HTML file with charts")
    clickhouse_args(p)
    p.add_argument("--html", type=Path, required=True, help="where to write it")
    p.add_argument("--since", default="7d", help="how far back: 7d, 12h, 30m, or all")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("clickhouse-users",
                       help="print the SQL that creates a server's gpufleet users: a writer for the sink and a "
                            "read-only reader for queries (passwords from GPUFLEET_CLICKHOUSE_READER_PASSWORD and "
                            "GPUFLEET_CLICKHOUSE_WRITER_PASSWORD, or their _FILE; only their hashes are printed)")
    p.add_argument("--database", type=database_name, default=os.environ.get("GPUFLEET_DATABASE", "gpufleet"))
    p.set_defaults(func=cmd_clickhouse_users)


def owners_service_url() -> str | None:
    """``GPUFLEET_URL``; else the address a login node set up by an earlier release exported as
    ``GPUFLEET_SERVICE`` (a name that, in a job's environment, declares a serving replica: jobs
    inherit what the login node exports, so the address has a name of its own now)."""
    earlier = os.environ.get("GPUFLEET_SERVICE", "")
    return os.environ.get("GPUFLEET_URL") or (earlier if earlier.startswith(("http://", "https://")) else None)


def service_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", "--service", dest="url", metavar="URL", default=owners_service_url(),
                   help="the owners' service (`gpufleet serve`) to ask as yourself, with a MUNGE credential "
                        "(env GPUFLEET_URL; how a login node's users are set up). Without it the database "
                        "is read directly, by whoever may open it")
    p.add_argument("--munge-socket", default=os.environ.get("GPUFLEET_MUNGE_SOCKET"),
                   help="munged's socket (env GPUFLEET_MUNGE_SOCKET; default: munged's own)")


def service_client(args: argparse.Namespace):
    from gpufleet.web.client import ServiceClient

    try:
        return ServiceClient(args.url, args.munge_socket)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def print_service_job(job: dict) -> None:
    """A job as the service gives it, on one screen: the report, the alerts firing, the page."""
    print(job["report"], end="")
    if job.get("serving"):
        print(f"\nWhat it served\n{job['serving']['said']}")
    firing = [a for a in job["alerts"] if a["status"] == "FIRING"]
    if firing:
        print("\nAlerts firing:")
        for a in firing:
            print(f"- {a['detector']} since {a['transitions'][0]['at']}: {a['message']}")
    print(f"\nThe job's page: {job['url']}")


def cmd_sql(args: argparse.Namespace) -> int:
    from gpufleet.sql import FORMATS, run_query
    from sinks.read_path import check_query

    if args.write and not args.allow_files_and_network:
        raise UsageError("--write runs the query with no restriction: it can change and drop tables, read and "
                         "write this machine's files and reach the network; add --allow-files-and-network to confirm")
    if not args.write:
        check_query(args.query)
    columns, rows = run_query(query_client(args, read_only=not args.write), args.query)
    print(FORMATS[args.format](columns, rows))
    return 0


def cmd_workflows(args: argparse.Namespace) -> int:
    from gpufleet.reports.workflows import list_workflows
    from gpufleet.sql import FORMATS

    print(FORMATS[args.format](*list_workflows(query_client(args), args.database, args.since_minutes)))
    return 0


def cmd_workflow(args: argparse.Namespace) -> int:
    from gpufleet.reports.serving import replica_served
    from gpufleet.reports.workflows import workflow_summary, workflow_timeline
    from gpufleet.sql import format_table
    from sinks.job_report import job_report

    check_id("workflow", args.workflow_id)
    if args.url:
        from gpufleet.web.client import NotFound

        try:
            print_service_job(service_client(args).job(args.workflow_id))
        except NotFound:
            print(f"no such job: {args.workflow_id} (none that you may see)")
            return 1
        return 0
    prices = rates(args)
    client = query_client(args)
    columns, rows = workflow_timeline(client, args.database, args.workflow_id)
    if not rows:
        print(f"no windows for workflow {args.workflow_id!r}")
        return 1
    summary, cluster = workflow_summary(client, args.database, args.workflow_id)
    print(job_report(summary, prices, cluster)[0])
    served = replica_served(client, args.database, args.workflow_id)
    if served is not None:
        print(f"What it served\n{served['said']}\n")
    print(format_table(columns, rows))
    return 0


def cmd_job(args: argparse.Namespace) -> int:
    from gpufleet.reports.workflows import slurm_job
    from gpufleet.sql import format_table
    from schemas.validate_ids import SLURM_JOB_ID

    if not SLURM_JOB_ID.fullmatch(args.job_id):
        raise UsageError(f"{args.job_id!r} is not a Slurm job id (digits, or an array task's 123_4)")
    if args.url:
        return service_job(args)
    workflow, tasks = slurm_job(query_client(args), args.database, args.job_id)
    if workflow is None:
        print(f"job {args.job_id} is an array of {len(tasks)} task(s); `gpufleet job {args.job_id}_<task>` shows one:")
        print(format_table(["workflow", "job_id", "gpu_hours", "goodput_pct", "ended"], tasks))
        return 0
    args.workflow_id = workflow
    return cmd_workflow(args)


def service_job(args: argparse.Namespace) -> int:
    from gpufleet.sql import format_table
    from gpufleet.web.client import NotFound

    client = service_client(args)
    try:
        print_service_job(client.job(f"slurm-{args.job_id}"))
        return 0
    except NotFound:
        pass
    tasks = [j for j in client.jobs(since="all") if j["workflow_id"].startswith(f"slurm-{args.job_id}_")]
    if not tasks:
        print(f"no such job: {args.job_id} (none that you may see)")
        return 1
    print(f"job {args.job_id} is an array of {len(tasks)} task(s); `gpufleet job {args.job_id}_<task>` shows one:")
    print(format_table(["workflow", "gpu_hours", "goodput_pct", "state"],
                       [(j["workflow_id"], round(j["gpu_hours"], 3), round(j["goodput_pct"], 1), j["state"])
                        for j in tasks]))
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    from gpufleet.reports.opportunities import parse_since
    from gpufleet.sql import format_table

    try:
        parse_since(args.since)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.url:
        jobs = service_client(args).jobs(args.since, args.state)
    else:  # whoever opens the database sees every job
        from gpufleet.web.access import Viewer
        from gpufleet.web.data import jobs as list_jobs

        since = parse_since(args.since)
        jobs = list_jobs(query_client(args), args.database, Viewer("", operator=True, via="database"),
                         10 * 365 * 86400 if since is None else since, args.state)
    if not jobs:
        print(f"no jobs (--since {args.since})")
        return 0
    print(format_table(
        ["job", "state", "gpus", "gpu_hours", "goodput_pct", "largest_loss", "alerts_firing"],
        [(j["workflow_id"], j["state"], j["gpus"], round(j["gpu_hours"], 3), round(j["goodput_pct"], 1),
          j["largest_loss"] or "", ", ".join(j["firing_alerts"])) for j in jobs]))
    return 0


def cmd_goodput(args: argparse.Namespace) -> int:
    from gpufleet.reports.goodput import fleet_goodput, render_groups
    from gpufleet.reports.opportunities import parse_since
    from sinks.job_report import render_waterfall

    prices = rates(args)
    parse_since(args.since)  # checked before anything is asked
    fleet, groups = fleet_goodput(query_client(args), args.database, args.by, args.since, prices)
    if not fleet.allocated.gpu_seconds and not fleet.unallocated.gpu_seconds:
        print(f"no GPU-hours recorded (--since {args.since})")
        return 0
    print(render_waterfall(fleet, prices, f"Fleet goodput, --since {args.since}"))
    if args.by != "fleet":
        print()
        print(render_groups(groups, args.by, prices, args.limit))
    return 0


def cmd_opportunities(args: argparse.Namespace) -> int:
    from gpufleet.reports.opportunities import opportunities, parse_since
    from gpufleet.sql import FORMATS

    parse_since(args.since)  # checked before anything is asked
    columns, rows = opportunities(query_client(args), args.database, args.by, args.since, args.limit)
    if not rows and args.format == "table":
        print(f"no wasted GPU-hours recorded (--since {args.since})")
        return 0
    print(FORMATS[args.format](columns, rows))
    return 0


def cmd_serving(args: argparse.Namespace) -> int:
    from gpufleet.reports.opportunities import parse_since
    from gpufleet.reports.serving import render, services

    parse_since(args.since)  # checked before anything is asked
    if args.url:
        return service_serving(args)
    loads = services(query_client(args), args.database, args.since, args.peak_span_s, args.margin)
    if not loads:
        print(f"no serving replica recorded (--since {args.since}): replicas are judged by their traffic once the "
              "agent reads their engines' endpoints (gpufleet agent --serving-endpoint) or a recorded fleet is "
              "replayed (gpufleet replay)")
        return 0
    print(render(loads, args.peak_span_s, args.margin, args.idle_for_s), end="")
    return 0


def service_serving(args: argparse.Namespace) -> int:
    """``gpufleet serving`` asked of the owners' service as the user who runs it: the services of
    the replicas they may see, judged as the service judges (its busiest 10 minutes, +20 %)."""
    from gpufleet.reports.serving import render
    from gpufleet.web.services import MARGIN, SPAN_S, load_of
    from sinks.route_alerts import service_url

    if (args.peak_span_s, args.margin) != (SPAN_S, MARGIN):
        raise UsageError(f"with --url, services are judged as the owners' service judges them: its busiest "
                         f"{SPAN_S // 60} min, +{MARGIN:.0%} (leave out --peak-span-s and --margin)")
    client = service_client(args)
    loads = [load_of(s) for s in client.services(args.since)]
    if not loads:
        print(f"no serving replica of yours or your teams' (--since {args.since})")
        return 0
    print(render(loads, SPAN_S, MARGIN, args.idle_for_s), end="")
    print("\nTheir pages:")
    for s in loads:
        print(f"  {service_url(client.url, s.service)}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from gpufleet.reports.fleet import gather, render
    from gpufleet.reports.opportunities import parse_since

    parse_since(args.since)
    if args.html.is_dir():
        raise UsageError(f"--html {args.html} is a directory: name the report's file in it, such as "
                         f"{args.html / 'fleet-report.html'}")
    if not args.html.parent.is_dir():
        raise UsageError(f"--html {args.html}: no directory {args.html.parent} to write it in")
    numbers = gather(query_client(args), args.database, args.since)
    args.html.write_text(render(numbers))
    print(f"wrote {args.html} ({numbers['allocated_gpu_hours']:,.2f} GPU-hours allocated, "
          f"{numbers['workflows']} workflows)")
    return 0


def cmd_clickhouse_users(args: argparse.Namespace) -> int:
    from sinks.clickhouse_access import access_statements, password_sha256
    from sinks.write_clickhouse import ClickHouseWriter

    ClickHouseWriter.check_database(args.database)
    hashes = []
    for role in ("READER", "WRITER"):
        name = f"GPUFLEET_CLICKHOUSE_{role}_PASSWORD"
        password = Path(os.environ[name + "_FILE"]).read_text().strip() if os.environ.get(name + "_FILE") \
            else os.environ.get(name)
        if not password:
            raise UsageError(f"set {name} (or {name}_FILE) to the {role.lower()}'s password")
        hashes.append(password_sha256(password))
    print(";\n".join(access_statements(args.database, *hashes)) + ";")
    return 0

