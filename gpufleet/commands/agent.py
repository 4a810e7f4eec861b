"""``gpufleet agent``, ``nvml-check`` and ``simulate``: the host side."""

from __future__ import annotations

import argparse
import os
import signal
import stat
import threading
import time
from pathlib import Path

from gpufleet.commands.common import (
    fleet_args,
    kafka_args,
    kafka_connection,
    metrics_args,
    non_negative,
    positive,
    positive_int,
    serve_metrics,
)
from gpufleet.errors import Failed, UsageError


def add(sub) -> None:
    p = sub.add_parser("agent", help="the host agent: sample GPUs (NVML or simulated) and publish to Kafka")
    kafka_args(p)
    p.add_argument("--source", choices=["nvml", "sim"], default="nvml")
    p.add_argument("--interval", type=positive, default=1.0, help="seconds between samples")
    p.add_argument("--send-every", type=non_negative, default=5.0,
                   help="seconds between sends to Kafka, each workflow's samples since the last send in one "
                        "message (default 5; 0 sends each tick at once). Keep it under the worker's --lateness-s")
    p.add_argument("--profile-interval", type=positive, default=0.1,
                   help="seconds between samples while a profile is captured on this host (default 10 Hz)")
    p.add_argument("--host", default=None, help="host name to report (default: this machine's)")
    p.add_argument("--heartbeat-s", type=positive, default=60.0, help="seconds between workflow heartbeats")
    p.add_argument("--workflow-keys", default="GPUFLEET_WORKFLOW_ID,SLURM_JOB_ID,TORCHELASTIC_RUN_ID",
                   help="environment variables naming a process's workflow, first found wins")
    p.add_argument("--owner-keys", default="GPUFLEET_OWNER,SLURM_JOB_USER,USER")
    p.add_argument("--team-keys", default="GPUFLEET_TEAM,SLURM_JOB_ACCOUNT")
    p.add_argument("--model-keys", default="GPUFLEET_MODEL", help="environment variables naming the job's model")
    p.add_argument("--service-keys", default="GPUFLEET_SERVICE",
                   help="environment variables naming the service a process serves: its workflow is declared a "
                        "serving replica of it, judged by its traffic")
    p.add_argument("--cluster", default=os.environ.get("GPUFLEET_CLUSTER"),
                   help="the cluster this host belongs to, on every workflow event (env GPUFLEET_CLUSTER)")
    p.add_argument("--allocations", choices=["none", "slurm", "kubernetes"],
                   default=os.environ.get("GPUFLEET_ALLOCATIONS", "none"),
                   help="where the agent learns which job the scheduler gave each GPU (env GPUFLEET_ALLOCATIONS): "
                        "slurm (the records of `gpufleet slurm prolog/epilog`), kubernetes (the kubelet's pod "
                        "resources API); none: from the processes on the GPUs alone (a GPU a job holds but never "
                        "opens then counts as free)")
    p.add_argument("--allocations-dir", type=Path, default=Path("/run/gpufleet/slurm"),
                   help="slurm: the directory the prolog and epilog write (default /run/gpufleet/slurm; also "
                        "dcgm-exporter's --hpc-job-mapping-dir)")
    p.add_argument("--kubelet-socket", default="/var/lib/kubelet/pod-resources/kubelet.sock",
                   help="kubernetes: the kubelet's pod resources socket")
    p.add_argument("--owner-labels", default="gpufleet.io/owner",
                   help="kubernetes: pod labels or annotations naming the job's owner, first found wins")
    p.add_argument("--team-labels", default="gpufleet.io/team",
                   help="kubernetes: pod labels or annotations naming the team (else the pod's namespace)")
    p.add_argument("--serving-labels", default="gpufleet.io/service", metavar="KEY[=VALUE][,...]",
                   help="kubernetes: pod labels or annotations that declare a pod a serving replica, judged by its "
                        "traffic (KEY: any value; KEY=VALUE: that value; default gpufleet.io/service). Its "
                        "service: gpufleet.io/service, else app.kubernetes.io/name, else app, else the pod's name")
    p.add_argument("--serving-endpoint", action="append", type=_serving_endpoint, default=[], metavar="GPUS=URL",
                   help="a serving engine's Prometheus endpoint on this host (vLLM, SGLang, TGI, Triton) and the "
                        "GPUs of its replica: GPUS=URL[;service=NAME][;engine=ENGINE][;model=NAME], e.g. "
                        "0,1=http://127.0.0.1:8000/metrics;service=llama-70b; repeat per replica. Its traffic goes "
                        "beside the replica's GPU samples, and the worker judges the replica by it. model=: the "
                        "model read where the engine serves several (Triton)")
    p.add_argument("--serving-netrc", type=_private_file, default=None, metavar="FILE",
                   help="the user and password of serving endpoints behind basic auth, by host, in netrc's format "
                        "(machine HOST login USER password PASSWORD; readable by the agent's user alone): kept off "
                        "the command line, which every user of the host can read")
    p.add_argument("--serving-discover", action="store_true",
                   help="find the serving engines on this host too: every 5 min, ask the ports the GPUs' processes "
                        "(and those that started them) listen on for /metrics, and on Kubernetes "
                        "(--allocations kubernetes) where the pods holding GPUs are annotated for scraping "
                        "(prometheus.io/scrape, /port, /path); one that answers with an engine's metrics is read as "
                        "a --serving-endpoint of those GPUs")
    p.add_argument("--serving-interval-s", type=positive, default=10.0,
                   help="seconds between readings of each serving endpoint (default 10: its counters are "
                        "cumulative, so a window of 60 s loses nothing; each reading costs the agent 0.1-0.2 ms of "
                        "CPU, in its ticks; an interval shorter than --interval reads at every tick)")
    p.add_argument("--serving-timeout-s", type=positive, default=2.0,
                   help="seconds a serving endpoint may take to answer (it is read in the agent's ticks, which "
                        "never wait for it: asked at one, its answer taken at the next; a request is given up "
                        "once this old and two ticks later)")
    p.add_argument("--spool-dir", type=Path, default=None, help="default: <data dir>/agent-spool")
    p.add_argument("--spool-max-mb", type=positive_int, default=256)
    p.add_argument("--trace-spool-max-mb", type=positive_int, default=2048,
                   help="profiler traces kept until the broker has them (in <spool dir>/traces); past this the "
                        "oldest is dropped, and its requester told (default 2048)")
    p.add_argument("--profile-dir", type=Path, default=None,
                   help="where training processes with gpufleet's profiling hook meet the agent "
                        "(env GPUFLEET_PROFILE_DIR; default /tmp/gpufleet-profile)")
    fleet_args(p)
    metrics_args(p)
    p.set_defaults(func=cmd_agent)

    p = sub.add_parser("nvml-check", help="check the real NVML path on a machine with NVIDIA GPUs")
    p.add_argument("--seconds", type=positive, default=60.0)
    p.add_argument("--no-load", action="store_true", help="do not start the PyTorch load")
    p.set_defaults(func=cmd_nvml_check)

    p = sub.add_parser("simulate", help="publish samples from a simulated fleet")
    kafka_args(p)
    fleet_args(p)
    p.add_argument("--duration-s", type=positive, default=600.0, help="simulated seconds")
    p.add_argument("--interval-s", type=positive, default=1.0, help="simulated sampling interval")
    p.add_argument("--speed", type=non_negative, default=60.0, help="simulated seconds per wall second (0: no pacing)")
    p.add_argument("--start-ms", type=int, default=None, help="event time of the first tick (default: now - duration)")
    p.set_defaults(func=cmd_simulate)


def cmd_agent(args: argparse.Namespace) -> int:
    import socket

    from kafka_client.admin import ensure_topics
    from producers.agent.gpus.attribute_process import AttributionKeys, ProcessAttributor
    from producers.agent.gpus.sample_nvml import NvmlSampler, NvmlUnavailable
    from producers.agent.host_agent import AgentSettings, HostAgent
    from producers.agent.links import AgentLinks
    from producers.agent.metrics import AgentMetrics
    from producers.agent.run import run_agent
    from producers.agent.spool.disk import Spool
    from producers.agent.spool.forward import Forwarder
    from producers.profiling.agent import ProfileCoordinator, ProfileListener
    from producers.profiling.handoff import HandoffError, default_dir
    from producers.publish_kafka import Publisher
    from producers.serving.discover import Discovery, gpu_indices, gpu_processes
    from producers.simulate.fleet import SimulatedGpus, build_fleet
    from producers.traces.outbox import TraceOutbox
    from schemas.codec import Codec

    # A simulated host is one of the simulated fleet's, the first by default.
    host = args.host or (socket.gethostname() if args.source == "nvml" else "gpu-host-000")
    settings = AgentSettings(host=host, interval_s=args.interval, heartbeat_s=args.heartbeat_s,
                             topic_prefix=args.topic_prefix, cluster=args.cluster,
                             profile_interval_s=args.profile_interval)
    nvml = simulated = None
    if args.source == "nvml":
        nvml = NvmlSampler()
        try:
            devices = nvml.open()
        except NvmlUnavailable as exc:
            raise Failed(str(exc)) from None
        print(f"sampling {len(devices)} GPU device(s) through NVML every {args.interval:g}s as host {host}")
    else:
        fleet = build_fleet(args.seed, args.hosts, args.gpus_per_host, args.workflows)
        simulated = SimulatedGpus(fleet, host, int(time.time() * 1000))
        print(f"simulating host {host} of a {args.hosts}-host fleet every {args.interval:g}s")
    allocations = allocation_source(args)
    kafka = kafka_connection(args, "agent", check=False)
    try:
        ensure_topics(kafka, prefix=args.topic_prefix, partitions=args.partitions)
    except Exception as exc:  # noqa: BLE001 - the agent must start (and spool) while the broker is away
        print(f"could not check the topics ({exc}); spooling until the broker answers")
    keys = AttributionKeys(
        workflow=tuple(args.workflow_keys.split(",")), owner=tuple(args.owner_keys.split(",")),
        team=tuple(args.team_keys.split(",")), model=tuple(args.model_keys.split(",")),
        service=tuple(k for k in args.service_keys.split(",") if k),
    )
    spool_dir = args.spool_dir or args.data_dir / "agent-spool"
    spool = Spool(spool_dir, max_bytes=args.spool_max_mb << 20)
    codec = Codec()
    stop = threading.Event()
    # Profile requests for this host's workflows, answered beside the sampling loop.
    try:
        coordinator = ProfileCoordinator(host, Publisher(kafka, Codec()), args.profile_dir or default_dir(),
                                         topic_prefix=args.topic_prefix,
                                         outbox=TraceOutbox(spool_dir / "traces", args.trace_spool_max_mb << 20))
    except HandoffError as exc:
        raise UsageError(str(exc)) from None
    forwarder = Forwarder(spool, kafka, send_every_s=args.send_every)
    serving, serving_observers = serving_reader(args, spool, codec, host)
    metrics = AgentMetrics(spool, forwarder=forwarder, serving=serving)
    links = AgentLinks(
        observers=(*serving_observers, coordinator.observe),  # the host's view while a profile is captured
        throughputs=coordinator.handoff.throughputs,  # what jobs report of their model work (MFU)
        memory_peaks=coordinator.handoff.memory_peaks,  # the jobs' allocator peaks (right-sizing)
        metrics=metrics, hurry=forwarder.hurry)  # a job's end is sent at once
    agent = HostAgent(settings, spool, codec, nvml=nvml, simulated=simulated, attributor=ProcessAttributor(keys),
                      allocations=allocations, links=links)
    for observer in serving_observers:  # (samples named by the service a workflow declares)
        observer.declared = agent.declared_service
    if serving is not None and args.serving_discover:
        targets = getattr(allocations, "scrape_targets", None)  # Kubernetes: the pods' scrape annotations
        Discovery(serving, lambda: gpu_processes(agent.readings), targets=targets,
                  indices=lambda: gpu_indices(agent.readings)).start()
        print("looking for serving engines on the ports of the GPUs' processes"
              + (" and where their pods' scrape annotations point" if targets else "") + " every 5 min")
    serve_metrics(args, metrics.registry)
    for sig in (signal.SIGINT, signal.SIGTERM):  # stop now, not after the wait for the next tick
        signal.signal(sig, lambda *_: (stop.set(), coordinator.started.set()))
    listener = ProfileListener(kafka, coordinator, topic_prefix=args.topic_prefix)
    profiles = threading.Thread(target=listener.run, args=(stop,), name="profiles", daemon=True)
    profiles.start()
    try:
        run_agent(agent, forwarder, stop, profiling=coordinator.capturing, wake=coordinator.started)
    finally:
        stop.set()
        profiles.join(10)
        if serving is not None:
            serving.stop()
        if nvml is not None:
            nvml.close()
    print(f"agent stopped after {agent.ticks} ticks, {agent.samples} GPU samples; "
          f"{spool.dropped} dropped by a full spool")
    return 0


def _serving_endpoint(text: str):
    from producers.serving.scrape import EndpointSettingError, endpoint

    try:
        return endpoint(text)
    except EndpointSettingError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _private_file(text: str) -> str:
    """A file of secrets: there, and readable and writable by its owner alone."""
    try:
        mode = Path(text).stat().st_mode
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise argparse.ArgumentTypeError(f"{text}: not a file")
    if mode & 0o077:
        raise argparse.ArgumentTypeError(f"{text}: others than its owner may read or write it (mode "
                                         f"{stat.S_IMODE(mode):o}): chmod 600 it")
    return text


def serving_reader(args: argparse.Namespace, spool, codec, host: str):
    """The serving endpoints' reader (``--serving-endpoint``, ``--serving-discover``) and the
    agent's observer that reads them in its ticks and spools their samples beside the GPU
    samples; (None, ()) without."""
    if not args.serving_endpoint and not args.serving_discover:
        return None, ()
    from producers.serving.scrape import ServingObserver, ServingReader
    from schemas.topics import GPU_SAMPLES

    topic = args.topic_prefix + GPU_SAMPLES.name
    reader = ServingReader(args.serving_endpoint, args.serving_interval_s, args.serving_timeout_s,
                           netrc=args.serving_netrc)
    observer = ServingObserver(reader, lambda schema, key, record: spool.append(
        topic, key, codec.encode(schema, record)), host)
    print(f"reading {len(args.serving_endpoint)} serving endpoint(s) beside the GPUs")
    return reader, (observer,)


def allocation_source(args: argparse.Namespace):
    """The scheduler's allocations the agent reads (``--allocations``), or None."""
    if args.allocations == "slurm":
        from producers.agent.allocations.slurm import SlurmAllocations

        print(f"reading Slurm's allocations from {args.allocations_dir}")
        return SlurmAllocations(args.allocations_dir)
    if args.allocations == "kubernetes":
        try:
            from producers.agent.allocations.kubelet import ApiServerPods, KubeletAllocations

            source = KubeletAllocations(args.kubelet_socket, pods=ApiServerPods.in_cluster(),
                                        owner_keys=tuple(args.owner_labels.split(",")),
                                        team_keys=tuple(args.team_labels.split(",")), cluster=args.cluster,
                                        serving_labels=tuple(k for k in args.serving_labels.split(",") if k))
        except ImportError as exc:
            raise Failed(f"--allocations kubernetes needs gpufleet's 'kubernetes' extra (grpcio, protobuf): {exc}") \
                from None
        print(f"reading the kubelet's pod resources from {args.kubelet_socket}")
        return source
    return None


def cmd_nvml_check(args: argparse.Namespace) -> int:
    from gpufleet.nvml_check import main as check

    return check([f"--seconds={args.seconds}"] + (["--no-load"] if args.no_load else []))


def cmd_simulate(args: argparse.Namespace) -> int:
    import time

    from kafka_client.admin import ensure_topics
    from producers.publish_kafka import Publisher
    from producers.simulate.fleet import build_fleet
    from producers.simulate.run import SimulationPlan, run_simulation
    from schemas.codec import Codec
    from schemas.topics import GPU_SAMPLES

    fleet = build_fleet(args.seed, args.hosts, args.gpus_per_host, args.workflows)
    kafka = kafka_connection(args, "agent")
    ensure_topics(kafka, prefix=args.topic_prefix, partitions=args.partitions)
    start_ms = (
        args.start_ms if args.start_ms is not None else (int(time.time()) // 60 * 60 - int(args.duration_s)) * 1000
    )
    plan = SimulationPlan(start_ms, int(args.duration_s / args.interval_s), int(args.interval_s * 1000), args.speed)
    progress = run_simulation(fleet, plan, Publisher(kafka, Codec()), topic=args.topic_prefix + GPU_SAMPLES.name)
    print(f"published {progress.samples} samples over {progress.ticks_done} ticks from {fleet.gpu_count} GPUs")
    return 0

