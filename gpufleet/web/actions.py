"""What a person may do about a job on the owners' service, each an ``OwnerAction`` on the
owner-actions topic (who, when, what, why), which the sink stores and the job's page shows:

- **profile now** (whoever sees the job, while it runs): a ``ProfileRequest`` to the job's
  hosts, as ``gpufleet profile`` makes, at most one per job every ``profile_every_s`` and at
  most ``profiles_per_user_hour`` per person (the agents then apply their own limits); the
  findings appear on the page when the worker has analysed the traces;
- **acknowledge** an alert episode (no more messages for it) or **snooze** it until a time
  (none until then): the notifier honours both, operators still see the alert;
- **ask for an exemption** from the enforcement ladder, with a reason; operators **approve** or
  **refuse** it, and the enforcer runs no action on a workflow whose exemption was approved.

Each is checked here before anything is sent: the asker sees the job (``Viewer.sees``), the
alert is the job's, a reason is given where one is needed, the time is in the future; what is
refused says why (``ActionRefused``). Requests must carry ``X-Gpufleet-Action`` (a header a
cross-site form cannot send), so a page elsewhere cannot act for a signed-in user.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

from gpufleet.web.access import Viewer

KINDS = ("PROFILE_NOW", "ACKNOWLEDGE", "SNOOZE", "EXEMPTION_REQUESTED", "EXEMPTION_APPROVED", "EXEMPTION_REFUSED")
ACTION_HEADER = "X-Gpufleet-Action"
MAX_REASON = 500
MAX_SNOOZE_MS = 7 * 86_400_000


class ActionRefused(ValueError):
    """What was asked cannot be done; the text says why (shown to the asker)."""


@dataclass
class Limits:
    profile_every_s: float = 600.0  # one profile of a job at a time, about
    profiles_per_user_hour: int = 6
    profile_timeout_s: float = 300.0


@dataclass
class Actions:
    """Publishes owner actions (and profile requests) through ``publisher`` on ``prefix``'s topics."""

    publisher: object  # producers.publish_kafka.Publisher
    hosts_of: object  # workflow_id -> the hosts it runs on (gpufleet.profile.hosts_of)
    prefix: str = ""
    limits: Limits = field(default_factory=Limits)
    clock: object = time.time
    _profiled: dict[str, float] = field(default_factory=dict)  # workflow -> last profile asked (s)
    _asked: dict[str, deque] = field(default_factory=dict)  # user -> times they asked (s)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def act(self, viewer: Viewer, job: dict, body: dict) -> dict:
        """The action ``body`` asks for on ``job`` (as ``gpufleet.web.data.job`` gives it), sent; or ActionRefused."""
        kind = body.get("kind")
        if kind not in KINDS:
            raise ActionRefused(f"kind is one of {', '.join(KINDS)}")
        now_ms = int(self.clock() * 1000)
        action = {"action_id": f"act-{uuid.uuid4().hex[:16]}", "workflow_id": job["workflow_id"], "kind": kind,
                  "alert_id": None, "actor": viewer.user, "role": role_of(viewer, job), "reason": None,
                  "until": None, "request_id": None, "at": now_ms}
        if kind in ("ACKNOWLEDGE", "SNOOZE"):
            action["alert_id"] = self._alert(job, body.get("alert_id"))
            if kind == "SNOOZE":
                action["until"] = _future(body.get("until"), now_ms)
        elif kind == "EXEMPTION_REQUESTED":
            action["reason"] = _reason(body.get("reason"), required=True)
            if job["state"] != "running":
                raise ActionRefused("the job has ended: no ladder can act on it")
        elif kind in ("EXEMPTION_APPROVED", "EXEMPTION_REFUSED"):
            if not viewer.operator:
                raise ActionRefused("only the fleet's operators decide on exemptions")
            requested = {a["action_id"] for a in job.get("actions", []) if a["kind"] == "EXEMPTION_REQUESTED"}
            if body.get("request_id") not in requested:
                raise ActionRefused("no such exemption request for this job")
            action["request_id"] = body["request_id"]
            action["reason"] = _reason(body.get("reason"), required=kind == "EXEMPTION_REFUSED")
            if body.get("until") is not None:
                action["until"] = _future(body["until"], now_ms, longest_ms=None)
        else:
            action["request_id"] = self._profile(viewer, job, now_ms)
        self._send_action(action)
        return action

    def _alert(self, job: dict, alert_id) -> str:
        if not isinstance(alert_id, str) or alert_id not in {a["alert_id"] for a in job["alerts"]}:
            raise ActionRefused("no such alert on this job")
        return alert_id

    def _profile(self, viewer: Viewer, job: dict, now_ms: int) -> str:
        from schemas.topics import PROFILE_REQUESTS

        if job["state"] != "running":
            raise ActionRefused("the job has ended: only a running job can be profiled")
        now = now_ms / 1000
        with self._lock:
            last = self._profiled.get(job["workflow_id"])
            if last is not None and now - last < self.limits.profile_every_s:
                raise ActionRefused(f"this job was profiled {now - last:.0f} s ago; the next profile may be asked "
                                    f"{self.limits.profile_every_s - (now - last):.0f} s from now")
            asked = self._asked.setdefault(viewer.user, deque())
            while asked and now - asked[0] > 3600:
                asked.popleft()
            if len(asked) >= self.limits.profiles_per_user_hour:
                raise ActionRefused(f"{viewer.user} asked for {len(asked)} profiles in the last hour, the most one "
                                    "person may; the next one later")
            hosts = list(self.hosts_of(job["workflow_id"]))
            if not hosts:
                raise ActionRefused("no agent reports the job running on any host now")
            self._profiled[job["workflow_id"]] = now
            asked.append(now)
        request_id = f"od-{uuid.uuid4().hex[:12]}"
        deadline = now_ms + int(self.limits.profile_timeout_s * 1000)
        request = {"request_id": request_id, "workflow_id": job["workflow_id"], "hosts": hosts, "ranks": [],
                   "duration_ms": None, "steps": 20, "reason": "ON_DEMAND",
                   "requester": f"{viewer.user} (owners' service)", "requested_at": now_ms,
                   "deadline_ms": deadline - 30_000}
        self.publisher.publish(PROFILE_REQUESTS, [request], topic=self.prefix + PROFILE_REQUESTS.name)
        return request_id

    def _send_action(self, action: dict) -> None:
        from schemas.topics import OWNER_ACTIONS

        failed = self.publisher.failed
        self.publisher.publish(OWNER_ACTIONS, [action], topic=self.prefix + OWNER_ACTIONS.name)
        if self.publisher.flush(30) or self.publisher.failed > failed:
            raise ActionRefused("Kafka did not take the action within 30 s: nothing was done; try again")


def role_of(viewer: Viewer, job: dict) -> str:
    if viewer.user == job.get("owner"):
        return "owner"
    if viewer.operator:
        return "operator"
    return "team lead" if job.get("team") in viewer.leads else "team member"


def _reason(value, required: bool) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise ActionRefused("say why (a reason is needed)")
        return None
    if not isinstance(value, str) or len(value) > MAX_REASON:
        raise ActionRefused(f"a reason is text of at most {MAX_REASON} characters")
    return "".join(c if c.isprintable() else " " for c in value.strip())


def _future(value, now_ms: int, longest_ms: int | None = MAX_SNOOZE_MS) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= now_ms:
        raise ActionRefused("until is a time in the future, in epoch milliseconds")
    if longest_ms is not None and value - now_ms > longest_ms:
        raise ActionRefused(f"a snooze lasts at most {longest_ms // 86_400_000} days")
    return value
