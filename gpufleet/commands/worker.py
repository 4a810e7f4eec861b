"""``gpufleet worker``: the stream worker (Faust)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufleet.commands.common import (
    fraction,
    kafka_args,
    kafka_connection,
    metrics_args,
    non_negative,
    percent,
    positive,
    serve_metrics,
    watchdog_args,
)
from gpufleet.errors import Failed
from kafka_client.config import WORKER_APP_ID


def add(sub) -> None:
    p = sub.add_parser("worker", help="run the stream worker (event-time windows and detectors)")
    kafka_args(p)
    p.add_argument("--app-id", default=WORKER_APP_ID, help="Faust app id = consumer group")
    p.add_argument("--window-s", type=positive, default=60.0)
    p.add_argument("--lateness-s", type=non_negative, default=10.0, help="allowed lateness of samples")
    p.add_argument("--startup-max-s", type=non_negative, default=900.0,
                   help="goodput: how long a workflow whose GPUs never did any work counts as starting up "
                        "before its GPU-seconds count as idle")
    p.add_argument("--update-horizon-s", type=non_negative, default=3600.0,
                   help="a sample later than the watermark by up to this much completes its closed window, "
                        "which is emitted again with a higher version; later ones are dead-lettered")
    p.add_argument("--max-future-skew-s", type=non_negative, default=300.0,
                   help="a sample this far ahead of the worker's clock is dead-lettered (a wrong host clock)")
    p.add_argument("--low-utilization-pct", type=percent, default=None,
                   help="mean utilisation under this, sustained, raises a warning (default 25; or in --thresholds)")
    p.add_argument("--critical-utilization-pct", type=percent, default=None,
                   help="mean utilisation under this, sustained, raises a critical alert (default 15)")
    p.add_argument("--workflow-ended-s", type=positive, default=600.0,
                   help="a workflow with no sample for this long (event time) has ended: summarise it")
    p.add_argument("--idle-partition-s", type=positive, default=60.0,
                   help="a partition with no sample for this long (wall time) follows the busiest one's clock")
    p.add_argument("--serving-partitions", type=_names, default=frozenset(), metavar="P[,P...]",
                   help="the Slurm partitions (or Kubernetes namespaces) whose jobs are serving replicas: judged "
                        "as replicas (by their engines' traffic, else by their GPUs' idleness), never as training "
                        "jobs' low utilisation")
    p.add_argument("--serving-qos", type=_names, default=frozenset(), metavar="Q[,Q...]",
                   help="likewise, the Slurm QoS whose jobs are serving replicas")
    p.add_argument("--thresholds", type=Path, default=None,
                   help="TOML file of detector thresholds: [default] and [teams.<name>] (DetectorConfig fields)")
    p.add_argument("--detector-min-s", type=non_negative, default=None,
                   help="how long every violation must last before its alert fires (default: each detector's own, "
                        "e.g. 10 minutes for low utilisation)")
    p.add_argument("--no-periodic-profiles", dest="periodic_profiles", action="store_false",
                   help="do not profile running workflows periodically")
    p.add_argument("--profile-every-s", type=positive, default=6 * 3600.0,
                   help="profile each running workflow at most once per this many seconds (default 6 h)")
    p.add_argument("--profile-budget", type=fraction, default=0.02,
                   help="at most this fraction of the running workflows profiled at once (default 2 %%, at least 1)")
    p.add_argument("--schedule-report-s", type=positive, default=30.0,
                   help="how often the window stage tells the scheduler what runs")
    p.add_argument("--schedule-seed", type=int, default=0, help="ties in the schedule are broken by this seed")
    p.add_argument("--regression-pct", type=non_negative, default=10.0,
                   help="a profile whose step takes this much longer on the GPU than the rank's previous profile "
                        "is a regression finding (default 10 %%)")
    p.add_argument("--regression-min-ms", type=non_negative, default=0.1,
                   help="... and at least this much longer per step (default 0.1 ms)")
    p.add_argument("--enforcement", type=Path, default=None,
                   help="the enforcement ladders (TOML, [[ladder]] tables: see docker/config/enforcement.toml): "
                        "warn, warn again, then have `gpufleet enforce` act on alerts that keep firing")
    metrics_args(p)
    watchdog_args(p, "its loop has stopped, or a partition with messages waiting has not moved on (a rebalance "
                     "or the recovery of its state has not ended),", "a rebalance and that recovery take")
    p.set_defaults(func=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    from streams import faust_fixes

    try:
        faust_fixes.apply()  # first: a faust that is not what the fixes were proven on never runs
    except faust_fixes.NotAsReviewed as exc:
        raise Failed(str(exc)) from None

    import faust
    from msgspec.structs import replace

    from kafka_client.admin import brokers_in, create_topics, ensure_topics, replication_for
    from streams.alerts.detectors import DetectorConfig, Thresholds, load_thresholds
    from streams.alerts.raising import AlertConfig
    from streams.app import changelog_topics, create_app, tune_gc
    from streams.enforcement.ladder import load_ladders
    from streams.profiling.diff import ComparisonConfig, RegressionConfig
    from streams.profiling.schedule import ScheduleConfig
    from streams.serving.traffic import Declared
    from streams.settings import StreamSettings
    from streams.stages.io import METRICS
    from streams.windows.batches import WindowConfig
    from streams.windows.goodput import GoodputConfig

    # What the user gave, checked before anything is reached or made.
    flags = (args.low_utilization_pct, args.critical_utilization_pct)
    if args.thresholds and flags != (None, None):
        raise Failed("--low-utilization-pct and --critical-utilization-pct are thresholds: set them in the "
                     f"--thresholds file ({args.thresholds}), as low_util_warn_pct and low_util_critical_pct")
    if args.thresholds:
        thresholds = load_thresholds(args.thresholds)
    else:
        default = DetectorConfig()
        warn = default.low_util_warn_pct if args.low_utilization_pct is None else args.low_utilization_pct
        critical = default.low_util_critical_pct if args.critical_utilization_pct is None \
            else args.critical_utilization_pct
        thresholds = Thresholds(replace(default, low_util_warn_pct=warn,
                                        low_util_critical_pct=min(warn, critical)))
    ladders = load_ladders(args.enforcement) if args.enforcement else ()
    data_dir = args.data_dir / "worker"
    data_dir.mkdir(parents=True, exist_ok=True)  # Faust makes only the last folder of its data directory
    serve_metrics(args, METRICS.registry)  # the port, before the broker: one in use says so now
    kafka = kafka_connection(args, "worker")
    ensure_topics(kafka, prefix=args.topic_prefix, partitions=args.partitions)
    partitions, trace_partitions, analysis_partitions = _stream_partitions(kafka, args.topic_prefix)
    settings = StreamSettings(
        bootstrap=kafka.bootstrap,
        security=kafka.security,
        app_id=args.app_id,
        topic_prefix=args.topic_prefix,
        data_dir=str(data_dir),
        window=WindowConfig(size_ms=int(args.window_s * 1000), allowed_lateness_ms=int(args.lateness_s * 1000),
                            max_future_skew_ms=int(args.max_future_skew_s * 1000),
                            update_horizon_ms=int(args.update_horizon_s * 1000),
                            retention_ms=max(3_600_000, int(args.update_horizon_s * 1000)),
                            goodput=GoodputConfig(startup_max_s=args.startup_max_s)),
        workflow_ended_s=args.workflow_ended_s,
        idle_partition_s=args.idle_partition_s,
        partitions=partitions,
        trace_partitions=trace_partitions,
        analysis_partitions=analysis_partitions,
        comparison=ComparisonConfig(regressions=RegressionConfig(min_pct=args.regression_pct,
                                                                 min_us=args.regression_min_ms * 1000)),
        replication=replication_for(brokers_in(kafka))[0],
        thresholds=thresholds,
        alerts=AlertConfig(min_duration_s=args.detector_min_s),
        enforcement=ladders,
        serving=Declared(args.serving_partitions, args.serving_qos),
        stall_exit_s=args.stall_exit_s,
        schedule=ScheduleConfig(enabled=args.periodic_profiles, interval_s=args.profile_every_s,
                                budget_fraction=args.profile_budget, report_s=args.schedule_report_s,
                                seed=args.schedule_seed),
    )
    create_topics(kafka, changelog_topics(settings))
    app = create_app(settings)
    tune_gc()
    worker = faust.Worker(app, loglevel=args.log_level, quiet=True)
    # Faust's terminal spinner sets the root logger to DEBUG so that every record spins it:
    # then aiokafka and Faust build a debug record per message sent (two per changelog write),
    # whatever --log-level says. Without it the level holds.
    worker.spinner = None
    worker.execute_from_commandline()
    return 0


def _names(text: str) -> frozenset[str]:
    """A comma-separated list of names (partitions, QoS), none of them empty."""
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME[,NAME...]")
    return frozenset(names)


def _stream_partitions(kafka, prefix: str) -> tuple[int, int, int]:
    """The partitions the worker's input topics have on the cluster: the co-partitioned
    sample topics' (which must agree: a workflow's samples, life cycle and profile results
    meet in one state), the kernel events' and the trace analyses'."""
    from kafka_client.admin import partitions_of
    from schemas.topics import CO_PARTITIONED, KERNEL_EVENTS, TRACE_ANALYSES

    names = [prefix + t.name for t in (*CO_PARTITIONED, KERNEL_EVENTS, TRACE_ANALYSES)]
    counts = partitions_of(kafka, names)
    co = {prefix + t.name: counts.get(prefix + t.name) for t in CO_PARTITIONED}
    if len(set(co.values())) != 1 or None in co.values():
        raise Failed("the worker needs " + ", ".join(co) + " to have the same number of partitions; they have "
                     + ", ".join(f"{n}: {c}" for n, c in co.items()) + ". Recreate them with one --partitions")
    return next(iter(co.values())), counts[prefix + KERNEL_EVENTS.name], counts[prefix + TRACE_ANALYSES.name]

