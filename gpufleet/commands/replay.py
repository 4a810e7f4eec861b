"""``gpufleet replay``: a recorded fleet through the pipeline (``producers.serving.recorded``)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gpufleet.commands.common import kafka_args, kafka_connection, positive, positive_int
from gpufleet.errors import Failed, UsageError

QUIET_S = 3600  # the recording ends at least this long before now; then the fleet's clock moves to now


def add(sub) -> None:
    p = sub.add_parser("replay", help="send a recorded fleet's per-container GPU and serving series through the "
                                      "pipeline, as the agents would have, with times shifted to end now")
    kafka_args(p)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--alibaba", type=Path, metavar="DIR",
                        help="a directory of Alibaba's GenAI serving trace files (pod_gpu_duty_cycle_anon.tar.gz, "
                             "qps.tar.gz, ...), as published")
    source.add_argument("--csv", type=Path, help="a CSV of timestamp,container,metric,value (metric: gpu_util_pct, "
                                                 "gpu_memory_bytes, requests_per_s, queue_time_ms)")
    p.add_argument("--service", type=_service, default=None,
                   help="the service the containers' replicas serve (default: stable-diffusion for --alibaba, "
                        "recorded for --csv)")
    p.add_argument("--hours", type=positive, default=None, help="the first H hours of the recording only")
    p.add_argument("--containers", type=positive_int, default=None, help="the first N containers (by name) only")
    p.set_defaults(func=cmd_replay)


def _service(text: str) -> str:
    """A service name the replicas' samples may carry, as their service and as their team."""
    from schemas.validate_ids import id_error
    from schemas.validate_sample import service_error

    reason = service_error(text) or id_error("team", text)
    if reason:
        raise argparse.ArgumentTypeError(f"{reason} (the replicas' service is their team too, an id)")
    return text


def cmd_replay(args: argparse.Namespace) -> int:
    from kafka_client.admin import ensure_topics
    from producers.publish_kafka import Publisher
    from producers.serving.recorded import RecordingError, messages, read_alibaba, read_generic, records, select
    from schemas.codec import Codec
    from schemas.topics import GPU_SAMPLES

    path = args.alibaba or args.csv
    if not path.exists():
        raise UsageError(f"{path}: not found")
    if args.alibaba is not None and not path.is_dir():
        raise UsageError(f"--alibaba {path}: expected the directory of the trace's .tar.gz files")
    try:
        series = select(read_alibaba(path) if args.alibaba else read_generic(path), args.hours, args.containers)
    except (RecordingError, OSError) as exc:
        raise Failed(str(exc)) from None
    times = [t for c in series.values() for t in c.get("gpu_util_pct", {})]
    if not times:
        raise Failed(f"{path}: no GPU utilisation readings (gpu_util_pct) to replay")
    service = args.service or ("stable-diffusion" if args.alibaba else "recorded")
    now = time.time()
    shift = (now - QUIET_S - max(times)) // 3600 * 3600  # whole hours: the recording's windows stay its own
    kafka = kafka_connection(args, "agent")
    ensure_topics(kafka, prefix=args.topic_prefix, partitions=args.partitions)
    topic = args.topic_prefix + GPU_SAMPLES.name
    pub = Publisher(kafka, Codec())
    counts = {"GpuSampleColumns": 0, "ServingSample": 0}
    first, span = min(times), max(times) - min(times)
    print(f"replaying {len(series)} containers, {span / 3600:.1f} h, as service {service!r}, times shifted by "
          f"{shift:.0f} s (ending {(now - max(times) - shift) / 60:.0f} min ago)")
    shown = 0  # (tenths of the recording's time sent so far, each told once)
    for at, batch in records(series, shift, service):  # (made as they are sent: never all held)
        for schema, record in messages(batch):
            pub.publish(GPU_SAMPLES, [record], topic=topic, schema=schema)
            counts[schema] = counts.get(schema, 0) + 1
        done = int(10 * (at / 1000 - shift - first) / span) if span else 10
        if done > shown:
            shown = done
            print(f"  {done * 10:3d}%  {counts['GpuSampleColumns']} GPU sample messages, "
                  f"{counts['ServingSample']} serving samples")
    # Then the fleet's clock moves to now on every partition: every replica ends by silence.
    at = int(now * 1000)
    pub.publish_everywhere(GPU_SAMPLES, {"event_time": at, "worker": "replay", "sent_at": at}, topic=topic,
                           schema="PartitionClock")
    if pub.flush(120) or pub.failed:
        raise Failed(f"the broker did not take every record ({pub.failed} failed: {pub.last_error})")
    print(f"replayed: {counts['GpuSampleColumns']} GPU sample messages and {counts['ServingSample']} serving samples "
          f"to {topic}; the worker judges them as they come (`gpufleet serving` once the sink has stored them)")
    return 0
