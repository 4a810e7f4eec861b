"""``gpufleet profile``, ``analyze`` and ``ingest-trace``: profiles and their traces."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gpufleet.commands.common import (
    check_id,
    kafka_args,
    kafka_connection,
    parse_duration,
    positive,
    positive_int,
)
from gpufleet.errors import Failed, UsageError


def add(sub) -> None:
    p = sub.add_parser("profile", help="profile a running workflow now (torch.profiler via the agents) "
                                       "and print the findings")
    kafka_args(p)
    p.add_argument("workflow_id")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--steps", type=positive_int, default=20, help="optimizer steps to capture (default 20)")
    group.add_argument("--duration", default=None, help="or a duration: 10s, 1m")
    p.add_argument("--host", action="append", default=[], help="ask this host (repeatable; default: every host "
                                                                 "the agents report the workflow on)")
    p.add_argument("--timeout", type=positive, default=300.0, help="seconds to wait for every host's result")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("analyze", help="analyse PyTorch profiler (Kineto) trace files")
    p.add_argument("traces", nargs="+", help=".json or .json.gz trace files, one per rank")
    p.add_argument("--json", action="store_true", help="print the TraceAnalysis records as JSON")
    p.add_argument("--workflow", default="", help="workflow id to put in the records")
    p.add_argument("--critical-path", action="store_true",
                   help="find each profiler step's critical path across CPU threads and GPU streams "
                        "(reads every CPU operator: about twice the time)")
    p.add_argument("--kernel-sequences", action="append", default=[], metavar="OPERATOR",
                   help="the frequent sequences of GPU operations launched by the CPU operators whose "
                        "name contains OPERATOR (repeatable), as HTA's get_frequent_cuda_kernel_sequences")
    p.add_argument("--thresholds", type=Path, default=None,
                   help="the worker's thresholds file: its [default] input-bound thresholds judge the traces")
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser("diff", help="what changed between two profiles: per step, by kernel type and kernel",
                       description="Compare two profiles of a workflow. Give a trace file or a directory of rank "
                                   "traces for each (gpufleet diff BASE CAND), or several files each side around "
                                   "'vs' (gpufleet diff base0.json base1.json vs cand0.json cand1.json).")
    p.add_argument("traces", nargs="+", help="BASELINE... vs CANDIDATE..., or BASELINE CANDIDATE")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--top", type=positive_int, default=15, help="kernels to list (default 15)")
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("ingest-trace", help="publish trace files to Kafka for the worker to analyse")
    kafka_args(p)
    p.add_argument("traces", nargs="+", help=".json or .json.gz trace files, one per rank")
    p.add_argument("--workflow", required=True, help="the workflow the traces belong to")
    p.set_defaults(func=cmd_ingest_trace)


def cmd_profile(args: argparse.Namespace) -> int:
    from gpufleet.profile import hosts_of, profile
    from kafka_client.admin import ensure_topics

    check_id("workflow", args.workflow_id)
    duration_ms = None if args.duration is None else int(parse_duration(args.duration) * 1000)
    kafka = kafka_connection(args, "operator")
    ensure_topics(kafka, prefix=args.topic_prefix, partitions=args.partitions)
    hosts = args.host or hosts_of(kafka, args.workflow_id, args.topic_prefix)
    if not hosts:
        raise Failed(f"workflow {args.workflow_id} is not running on any host (no agent reported it without "
                     "ending it); name hosts with --host to ask anyway")
    steps = None if duration_ms is not None else args.steps
    what = f"{duration_ms / 1000:g} s" if duration_ms is not None else f"{steps} steps"
    print(f"profiling {args.workflow_id} for {what} on {', '.join(hosts)} (timeout {args.timeout:g} s)", flush=True)

    def show(status: dict) -> None:
        where = status["host"] + ("" if status["rank"] is None else f" rank {status['rank']}")
        detail = status["reason"] or status["trace_id"] or ""
        print(f"  {where}: {status['state'].lower().replace('_', ' ')}{' - ' + detail if detail else ''}", flush=True)

    outcome = profile(kafka, args.workflow_id, hosts, steps=steps, duration_ms=duration_ms,
                      timeout_s=args.timeout, prefix=args.topic_prefix, requester=os.environ.get("USER", "cli"),
                      on_status=show)
    for a in sorted(outcome.analyses, key=lambda a: a["trace_id"]):
        partial = " (partial trace)" if a["partial"] else ""
        if a["idle_pct"] is None:  # e.g. a CPU-only process
            print(f"\n{a['trace_id']}: GPU idle n/a: no GPU activity in {a['events']} events{partial}")
        else:
            print(f"\n{a['trace_id']}: GPU idle {a['idle_pct']:.1f}%, compute {a['compute_pct']:.1f}%, "
                  f"non-compute {a['non_compute_pct']:.1f}% of {a['kernel_time_us'] / 1e6:.3f} s of kernel "
                  f"time{partial}")
        if a.get("system"):
            print(f"  {_system_line(a['system'])}")
    if outcome.findings:
        print("\nFindings:")
        for f in sorted(outcome.findings, key=lambda f: -f["gpu_seconds_at_stake"]):
            print(f"  [{f['severity'].lower()}] {f['title']} ({f['gpu_seconds_at_stake']:.3f} GPU-s at stake)\n"
                  f"      {f['evidence']}\n      try: {f['recommendation']}")
    elif outcome.analyses:
        print("\nNo antipattern found in these traces.")
    if outcome.failed:
        print("\nFailed:")
        for where, reason in sorted(outcome.failed.items()):
            print(f"  {where}: {reason}")
        return 1
    return 0


def _system_line(system: dict) -> str:
    """What the host agent measured during a capture, in one line."""
    said = [(f"{system['ticks']} host samples over {system['span_ms'] / 1000:.1f} s "
             f"(one every {system['interval_ms_mean']:.0f} ms)")]
    for key, text in (
        ("gpu_utilization_mean_pct", "GPU utilisation {:.0f} %"),
        ("sm_active_mean_pct", "SM activity {:.0f} %"),
        ("power_mean_watts", "power {:.0f} W"),
        ("workflow_cpu_mean_pct", "job CPU {:.0f} % of a core"),
        ("host_cpu_mean_pct", "host CPU {:.0f} %"),
        ("host_iowait_mean_pct", "I/O wait {:.0f} %"),
    ):
        if system.get(key) is not None:
            said.append(text.format(system[key]))
    return "during the capture: " + ", ".join(said)


def cmd_analyze(args: argparse.Namespace) -> int:
    """The analyses; then one line on standard error for each file that could not be read (status
    2: a file the user gave) or was damaged (status 1: its figures cover what was read)."""
    from gpufleet.analyze import analyze_paths, status_of
    from streams.alerts.detectors import Thresholds, load_thresholds

    thresholds = load_thresholds(args.thresholds) if args.thresholds else Thresholds()
    text, records = analyze_paths(args.traces, args.json, args.workflow, args.critical_path, args.kernel_sequences,
                                  thresholds.default)
    print(text)
    for r in records:
        if r.get("unreadable"):
            print(f"gpufleet analyze: {r['error']}", file=sys.stderr)
        elif r["partial"]:
            print(f"gpufleet analyze: {r['source']}: damaged; its figures cover what was read ({r.get('error')})",
                  file=sys.stderr)
    return status_of(records)


def cmd_diff(args: argparse.Namespace) -> int:
    import json

    from gpufleet.analyze import analyze_profile, trace_files
    from producers.traces.read import TraceError
    from streams.profiling.diff import diff_profiles, profile_figures, render_diff

    base_paths, cand_paths = split_profiles(args.traces)  # (a ValueError says how to give them)
    sides = []
    for paths in (base_paths, cand_paths):
        files = [f for p in paths for f in trace_files(p)]
        if not files:
            raise UsageError(f"no trace files in {' '.join(paths)}")
        try:
            records, kernels = analyze_profile(files)
        except TraceError as exc:
            raise UsageError(str(exc)) from None
        sides.append(profile_figures(records, kernels))
    diff = diff_profiles(*sides)
    if args.json:
        print(json.dumps(diff, indent=1))
    else:
        print(render_diff(diff, top=args.top))
    return 0


def split_profiles(paths: list[str]) -> tuple[list[str], list[str]]:
    """BASELINE... vs CANDIDATE..., or exactly two paths."""
    if "vs" in paths:
        i = paths.index("vs")
        base, cand = paths[:i], paths[i + 1:]
        if not base or not cand or "vs" in cand:
            raise ValueError("give the baseline's traces, then 'vs', then the candidate's")
        return base, cand
    if len(paths) != 2:
        raise ValueError(f"{len(paths)} paths: give two (a file or a directory each), "
                         "or the traces of each profile around 'vs'")
    return [paths[0]], [paths[1]]


def cmd_ingest_trace(args: argparse.Namespace) -> int:
    from kafka_client.admin import ensure_topics
    from producers.publish_kafka import Publisher
    from producers.traces.publish import publish_trace
    from schemas.codec import Codec

    check_id("workflow", args.workflow)
    for path in args.traces:
        if not os.path.isfile(path):
            raise UsageError(f"no trace file at {path}")
    kafka = kafka_connection(args, "agent")
    ensure_topics(kafka, prefix=args.topic_prefix, partitions=args.partitions)
    publisher = Publisher(kafka, Codec())
    rc = 0
    for path in args.traces:
        end = publish_trace(path, args.workflow, publisher, topic_prefix=args.topic_prefix)
        state = f"PARTIAL ({end['error']})" if end["partial"] else "complete"
        print(f"{path}: published {end['events']} events as trace {end['trace_id']} (rank {end['rank']}), {state}")
        rc = rc or (1 if end["partial"] else 0)
    if publisher.flush():
        raise Failed("some trace events could not be delivered to Kafka")
    return rc

