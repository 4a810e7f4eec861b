"""A service's idle replicas told together: the notifier holds each ``idle_replica`` alert that
would go out for ``wait_s`` from the first of its service (and its owner and team: who is told),
then sends one message for all of them ("3 of 8 replicas of sd-xl served no request ..."), linking
to the service's page. A replica that serves again before then is not told at all (its RESOLVED
takes it out); the RESOLVEDs of replicas told so are held alike and go out together (to the
team's webhook, as every RESOLVED). A deployment whose traffic fell leaves its replicas idle one
window after another: on the whole Alibaba trace, one message per alert was 135 mails to one
service's owner in a day, and 22 told together (``benchmarks/replay_alibaba.py``).

How many replicas the service held in the time its idle replicas' alerts speak of (the 8) is read
from ClickHouse (``replicas_held``): a worker sees only its partitions' replicas, never a whole
service. Where it cannot be read, the message says how many are idle only.

Held alerts are not committed: the notifier commits each partition only up to the first alert it
holds there (``positions``), so a notifier that stops or dies before a digest went out reads the
held alerts again (and what it sent meanwhile is in its sent log, not sent twice). A notifier
whose partitions are taken away in a rebalance tells what it held from them at once
(``release``) and commits them past it, so that their new reader, whose sent log is its own,
starts after what was told.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Message

from sinks.route_alerts import service_url

DETECTOR = "idle_replica"


@dataclass
class Digest:
    """What is held for one (service, owner, team): the alerts, each with its message's place."""

    since: float  # when the first was held (the notifier's clock)
    alerts: dict[str, tuple[dict, Message]] = field(default_factory=dict)  # id -> the alert, its message


class ServingDigests:
    def __init__(self, wait_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.wait_s, self.clock = wait_s, clock
        self.held: dict[tuple[str, str | None, str | None, str], Digest] = {}  # service, owner, team, status

    def takes(self, alert: dict) -> bool:
        """Whether ``alert`` waits for its service's digest: an idle replica's FIRING or RESOLVED
        (not its root cause: a message of its own)."""
        return (self.wait_s > 0 and alert["detector"] == DETECTOR and bool(alert.get("service"))
                and not alert.get("root_cause"))

    def hold(self, alert: dict, m: Message) -> None:
        """Hold ``alert`` (its message ``m``) for its service's digest."""
        key = (alert["service"], alert.get("owner"), alert.get("team"), alert["status"])
        digest = self.held.setdefault(key, Digest(self.clock()))
        digest.alerts[alert["alert_id"]] = (alert, m)

    def drop(self, alert_id: str) -> bool:
        """The episode ended before its FIRING's digest went out: it is not told. True where it was held."""
        for key, digest in list(self.held.items()):
            if key[3] == "FIRING" and digest.alerts.pop(alert_id, None) is not None:
                if not digest.alerts:
                    del self.held[key]
                return True
        return False

    def release(self, partitions: set[tuple[str, int]]) -> list[list[tuple[dict, Message]]]:
        """The alerts held from ``partitions``, no longer held, as digests (each its alerts and their
        messages): those of the same digest from other partitions stay held."""
        out = []
        for key, digest in list(self.held.items()):
            taken = [alert_id for alert_id, (_, m) in digest.alerts.items() if (m.topic(), m.partition()) in partitions]
            if taken:
                out.append([digest.alerts.pop(alert_id) for alert_id in taken])
            if not digest.alerts:
                del self.held[key]
        return out

    def due(self) -> list[list[tuple[dict, Message]]]:
        """The digests whose wait is over, no longer held: each its alerts and their messages."""
        now = self.clock()
        out = []
        for key, digest in list(self.held.items()):
            if now - digest.since >= self.wait_s:
                del self.held[key]
                out.append(list(digest.alerts.values()))
        return out

    def positions(self, read: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """The offsets to commit of the partitions ``read`` (each one's next to read) and of those
        holding alerts: never past a partition's first held alert."""
        out = dict(read)
        for digest in self.held.values():
            for _, m in digest.alerts.values():
                key = (m.topic(), m.partition())
                out[key] = min(out.get(key, m.offset()), m.offset())
        return out


def replicas_held(client, database: str, alerts: list[dict]) -> int:
    """How many replicas of the service of ``alerts`` (one digest's: one service, owner and team)
    held GPUs in the time the alerts speak of, from the first episode's start to the last window's
    end: those with a window in it in ``serving_windows``, as the sink stored them."""
    first = alerts[0]
    where = ["service = {service:String}", "window_end > fromUnixTimestamp64Milli({start:Int64}, 'UTC')",
             "window_start < fromUnixTimestamp64Milli({end:Int64}, 'UTC')"]
    parameters = {"service": first["service"], "start": min(a["since"] for a in alerts),
                  "end": max(a["window_end"] for a in alerts)}
    for column in ("owner", "team"):
        if first.get(column) is None:
            where.append(f"{column} IS NULL")
        else:
            where.append(f"{column} = {{{column}:String}}")
            parameters[column] = first[column]
    ((count,),) = client.query(f"SELECT uniqExact(workflow_id) FROM {database}.serving_windows "
                               f"WHERE {' AND '.join(where)}", parameters=parameters).result_rows
    return int(count)


def digest_message(alerts: list[dict], pages: str | None, held: int | None = None) -> tuple[str, str, dict]:
    """(title, plain text, the webhook's fields) of one service's idle replicas (FIRING), or of
    those of them no longer idle (RESOLVED); ``held``: how many replicas the service held in their
    time (``replicas_held``), None where unknown."""
    first = alerts[0]
    service, n = first["service"], len(alerts)
    alerts = sorted(alerts, key=lambda a: (-a["observed"], a["workflow_id"]))
    if held is not None and held < n:
        held = None  # (the sink has not stored all their windows yet)
    replicas = f"{n} replica{'s' if n != 1 else ''} of {service}"
    if held is not None and first["status"] == "FIRING":
        replicas = f"{n} of {held} replica{'s' if held != 1 else ''} of {service}"
    if first["status"] == "RESOLVED":
        title = (f"[gpufleet resolved] {replicas} no longer idle" if n > 1 else
                 f"[gpufleet resolved] idle replica: {first['workflow_id']} of {service}")
        lines = [title, "", f"{replicas} {'are' if n > 1 else 'is'} no longer idle:"]
        lines += [f"- {a['workflow_id']}: {a['message']} (alert {a['alert_id']})" for a in alerts]
    else:
        shortest = min(a["observed"] for a in alerts)
        title = (f"[gpufleet warning] {replicas} served no request" if n > 1 else
                 f"[gpufleet warning] idle replica: {first['workflow_id']} of {service}")
        lines = [title, "", f"{replicas} served no request for {shortest:.0f} min or more while holding GPUs:"]
        lines += [f"- {a['workflow_id']}: no request for {a['observed']:.0f} min "
                  f"({a['wasted_gpu_hours_so_far']:.2f} GPU-hours so far; alert {a['alert_id']})" for a in alerts]
        lines += ["", f"What to try: {first['advice']}"]
    who = f"owner {first.get('owner') or '?'}, team {first.get('team') or '?'}"
    lines += ["", f"Service {service} ({who})."]
    page = None
    if pages:
        page = service_url(pages, service)
        lines.append(f"The service's page: {page}")
    payload = {"gpufleet_idle_replicas": {"service": service, "replicas_held": held, "alerts": alerts},
               "page_url": page}
    return title, "\n".join(lines), payload
