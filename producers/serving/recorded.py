"""A recorded fleet's per-container series as the records an agent sends (``gpufleet replay``):
how an operator tries gpufleet on their own history before deploying it.

Two layouts are read:

- **Alibaba's GenAI serving trace** (``cluster-trace-v2026-GenAI``): its ``.tar.gz`` files as
  published, each a CSV of ``timestamp_anon,value,container_ip[,request_type]``:
  ``pod_gpu_duty_cycle_anon`` (GPU utilisation, %), ``pod_gpu_memory_used_bytes_anon``, ``qps``
  (``Generative Requests`` a second per container; a period with no row served none) and
  ``queue_rt_raw_anon`` (time queued, ms).
- **Generic**: one CSV with the header ``timestamp,container,metric,value``; ``timestamp`` in
  seconds since the epoch or ISO 8601 (UTC without an offset); ``metric`` one of ``METRICS``.

A recording that cannot be read as it stands sends nothing: ``RecordingError`` names the file, the
row and why (a time that is no time or is after now, two values for one time, a container that
cannot name a replica).

A container is a workflow of one GPU, each GPU utilisation reading a GPU sample standing for the
time to the next (at most ``MAX_INTERVAL_S``), and beside it a ``ServingSample`` for the time since
the reading before: the requests of the rate readings in it, each a rate over ``period_s`` (the
container's usual spacing of GPU readings), and the mean queue time of the queue readings in it.
Every time is shifted by the same amount, so that the recording ends now. A value no GPU can
report is sent as recorded: the worker refuses it with the reason (a dead letter), as it would
an agent's.
"""

from __future__ import annotations

import csv
import heapq
import io
import itertools
import math
import operator
import statistics
import tarfile
import time
import zlib
from collections import defaultdict
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from schemas.sample_columns import columns_of
from schemas.validate_ids import ids_error

METRICS = ("gpu_util_pct", "gpu_memory_bytes", "requests_per_s", "queue_time_ms")
ALIBABA = {"pod_gpu_duty_cycle_anon": "gpu_util_pct", "pod_gpu_memory_used_bytes_anon": "gpu_memory_bytes",
           "qps": "requests_per_s", "queue_rt_raw_anon": "queue_time_ms"}
MAX_INTERVAL_S = 120
MAX_AHEAD_S = 300  # a recording's time after now by more than this is no recording's (as an agent's clock)

Series = dict[str, dict[str, dict[float, float]]]  # container -> metric -> time (s) -> value


class RecordingError(ValueError):
    """A recording that cannot be read: which file, which row, what it should hold."""


def _rows(tar_path: Path) -> Iterator[dict]:
    try:
        with tarfile.open(tar_path) as tar:
            member = next((m for m in tar.getmembers() if m.name.endswith(".csv")), None)
            if member is None:
                raise RecordingError(f"{tar_path}: holds no .csv file")
            yield from csv.DictReader(io.TextIOWrapper(tar.extractfile(member), encoding="utf-8"))
    except (tarfile.TarError, EOFError, zlib.error, UnicodeDecodeError) as exc:  # (cut short: EOFError)
        why = " ".join(str(exc).split())  # (tarfile's words span lines)
        raise RecordingError(f"{tar_path}: cannot be read as the trace's .tar.gz ({why})") from None


def read_alibaba(directory: Path, now: float | None = None) -> Series:
    series: Series = defaultdict(lambda: defaultdict(dict))
    now = time.time() if now is None else now
    for stem, metric in ALIBABA.items():
        path = directory / f"{stem}.tar.gz"
        if not path.is_file():
            if metric == "gpu_util_pct":
                raise RecordingError(f"{path}: not found (the trace's GPU utilisation, which every replica needs)")
            continue
        for n, r in enumerate(_rows(path), start=2):
            other = metric == "requests_per_s" and r.get("request_type") != "Generative Requests"
            if not r.get("container_ip") or other:
                continue  # the gateway's rows, or another kind of request
            try:
                at, value = float(r["timestamp_anon"]), float(r["value"])
            except (KeyError, TypeError, ValueError):
                raise RecordingError(f"{path}: row {n}: expected timestamp_anon,value,container_ip numbers") from None
            _put(series, r["container_ip"], metric, r["timestamp_anon"], at, value, f"{path}: row {n}", now)
    return series


def _seconds(text: str) -> float:
    """A time in seconds since the epoch, or in ISO 8601 (UTC where it gives no offset: the same
    file reads the same on every machine)."""
    try:
        return float(text)
    except ValueError:
        at = datetime.fromisoformat(text)
        return (at if at.tzinfo is not None else at.replace(tzinfo=UTC)).timestamp()


def _put(series: Series, container: str, metric: str, text: str, at: float, value: float, where: str,
         now: float) -> None:
    """One reading into ``series``, or ``RecordingError`` saying why not: a time that is no time or
    is yet to come (a recording is history: seconds read from milliseconds stand 57,000 years
    ahead), or a second, different value for a time already read (which one to keep, the file
    does not say; the same value again, as where two exports overlap, is taken once)."""
    if not math.isfinite(at):
        raise RecordingError(f"{where}: timestamp {text!r} is not a time (expected seconds since the epoch or "
                             "ISO 8601)")
    if at > now + MAX_AHEAD_S:
        unit = next((f" ({name}? expected seconds)" for name, scale in (("milliseconds", 1e3), ("microseconds", 1e6))
                     if at / scale <= now + MAX_AHEAD_S), "")
        when = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        raise RecordingError(f"{where}: timestamp {text!r} is after now ({when}): a recording is history{unit}")
    if container not in series:
        _name_of_replica(container, where)
    readings = series[container][metric]
    before = readings.get(at)
    if before is not None and before != value and not (math.isnan(before) and math.isnan(value)):
        raise RecordingError(f"{where}: a second {metric} of container {container!r} at {text!r} ({value}, after "
                             f"{before}): a recording holds one value per container, metric and time")
    readings[at] = value


def _name_of_replica(container: str, where: str) -> None:
    """``RecordingError`` where ``container`` cannot name the replica its readings are sent as
    (which the worker would refuse, each of its samples a dead letter)."""
    if not container:
        raise RecordingError(f"{where}: no container (each row names the container it was read from)")
    workflow, host, _ = replica_ids(container)
    reason = ids_error({"workflow_id": workflow, "host": host})
    if reason:
        shown = repr(container if len(container) <= 60 else container[:60] + "…")
        raise RecordingError(f"{where}: container {shown} cannot name a replica: {reason}")


def read_generic(path: Path, now: float | None = None) -> Series:
    series: Series = defaultdict(lambda: defaultdict(dict))
    now = time.time() if now is None else now
    n = 1
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:  # (a byte order mark first: a spreadsheet's UTF-8)
            rows = csv.DictReader(f)
            if rows.fieldnames is None or not {"timestamp", "container", "metric", "value"} <= set(rows.fieldnames):
                raise RecordingError(f"{path}: expected the header timestamp,container,metric,value")
            for n, r in enumerate(rows, start=2):
                if r["metric"] not in METRICS:
                    raise RecordingError(f"{path}: row {n}: metric {r['metric']!r} is not one of {', '.join(METRICS)}")
                try:
                    at, value = _seconds(r["timestamp"]), float(r["value"])
                except (TypeError, ValueError):
                    raise RecordingError(f"{path}: row {n}: timestamp and value must be numbers (or an ISO "
                                         "time)") from None
                _put(series, r["container"], r["metric"], r["timestamp"], at, value, f"{path}: row {n}", now)
    except UnicodeDecodeError as exc:
        raise RecordingError(f"{path}: not UTF-8 text (the byte {exc.object[exc.start:exc.start + 1]!r}, in the "
                             f"rows after row {n}): save it as UTF-8") from None
    except csv.Error as exc:
        raise RecordingError(f"{path}: row {n + 1}: not CSV ({exc})") from None
    return series


def select(series: Series, hours: float | None = None, containers: int | None = None) -> Series:
    """The first ``containers`` containers (by name) and the first ``hours`` of the recording."""
    first = min((t for c in series.values() for t in c.get("gpu_util_pct", {})), default=0.0)
    names = sorted(n for n in series if series[n].get("gpu_util_pct"))[:containers]
    end = None if hours is None else first + hours * 3600
    return {n: {m: {t: v for t, v in values.items() if end is None or t < end} for m, values in series[n].items()}
            for n in names}


def _between(values: dict[float, float], times: list[float]) -> Iterator[list[float]]:
    """The readings of ``values`` that each time of ``times`` closes, time after time: those after
    the time before it, up to it (readings before the first time count at the first)."""
    at = sorted(values)
    i = 0
    for t in times:
        j = i
        while j < len(at) and at[j] <= t:
            j += 1
        yield [values[a] for a in at[i:j]]
        i = j


def _gpu_sample(wf: str, host: str, uuid: str, team: str, at: int, gap_s: float, util: float,
                memory: float | None) -> dict:
    return {"event_time": at, "interval_ms": int(gap_s * 1000), "host": host, "gpu_index": 0, "gpu_uuid": uuid,
            "gpu_model": "recorded", "workflow_id": wf, "owner": "replay", "team": team,
            "utilization_pct": util, "memory_utilization_pct": None,
            "memory_used_bytes": None if memory is None else int(memory), "memory_total_bytes": None,
            "power_watts": None, "temperature_c": None, "sm_clock_mhz": None}


def _serving_sample(wf: str, host: str, uuid: str, service: str, at: int, since_s: float, requests: float,
                    queues: list[float]) -> dict:
    return {"workflow_id": wf, "host": host, "owner": "replay", "team": service, "gpu_uuids": [uuid],
            "service": service, "engine": "recorded", "event_time": at, "interval_ms": int(since_s * 1000),
            "requests": requests, "tokens": None, "running": None, "waiting": None,
            "queue_time_ms": statistics.fmean(queues) if queues else None, "ttft_ms": None, "kv_cache_usage": None,
            "batch_size": None}


def replica_ids(container: str) -> tuple[str, str, str]:
    """The workflow, host and GPU a container's replica is sent as, each with the container's
    whole name (a deployment's pods are named alike for their first 20 to 30 characters)."""
    return f"replay-{container}", f"replay-{container}", f"GPU-{container}"


def records(series: Series, shift_s: float, service: str) -> Iterator[tuple[int, list[tuple[str, dict]]]]:
    """(time in ms, records to send at it as (schema, record)) in time order, every time shifted
    by ``shift_s``. Made as they are sent, from each container's readings in time order, merged:
    a recording's records are never all held at once (a month of a large fleet holds its readings
    alone; ``benchmarks/bench_replay.py``). At one time, the containers' records come in the
    series' order."""
    replicas = [_replica(name, metrics, shift_s, service) for name, metrics in series.items()
                if metrics.get("gpu_util_pct")]
    first = operator.itemgetter(0)
    for at, group in itertools.groupby(heapq.merge(*replicas, key=first), key=first):
        yield at, [record for _, pair in group for record in pair]


def _replica(name: str, metrics: dict[str, dict[float, float]], shift_s: float, service: str
             ) -> Iterator[tuple[int, tuple[tuple[str, dict], tuple[str, dict]]]]:
    """One container's (time in ms, its GPU sample and its serving sample), in time order."""
    utilisation = metrics["gpu_util_pct"]
    times = sorted(utilisation)
    period = statistics.median([b - a for a, b in itertools.pairwise(times)] or [60.0])
    memory = metrics.get("gpu_memory_bytes", {})
    ids = replica_ids(name)
    closing = zip(_between(metrics.get("requests_per_s", {}), times), _between(metrics.get("queue_time_ms", {}), times))
    for i, (t, (rates, queues)) in enumerate(zip(times, closing)):
        at = int((t + shift_s) * 1000)
        gap = MAX_INTERVAL_S if i + 1 == len(times) else min(times[i + 1] - t, MAX_INTERVAL_S)
        since = period if i == 0 else min(t - times[i - 1], MAX_INTERVAL_S)
        yield at, (("GpuSample", _gpu_sample(*ids, service, at, gap, utilisation[t], memory.get(t))),
                   ("ServingSample", _serving_sample(*ids, service, at, since, sum(rates) * period, queues)))


def messages(batch: Iterable[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """One tick's records as the agent sends them: the GPU samples as columns per workflow."""
    samples = [r for name, r in batch if name == "GpuSample"]
    return [*(r for r in batch if r[0] != "GpuSample"), *(("GpuSampleColumns", b) for b in columns_of(samples))]
