"""The window stage's decisions as plain steps: the workflows' states (the aggregator's store and
history: the Faust tables' data) and a batch of decoded records in; the records to send, in the
order to send them, the dead letters and the state entries that changed, out.

``streams.stages.windows`` reads the topics, calls a step inside its batch and sends what it
returns (records before state: ``streams.stages.state``); everything decided here is tested
without a broker or an app (``tests/unit/streams/stages/test_window_step.py``).

- ``samples``: blocks of samples and ``UnobservedTime`` into event-time windows; closed windows
  judged (alerts, automatic profiles, enforcement steps) and added to the job's totals; the
  scheduler's end of a job closes its windows at once; a partition's clock follows the fleet's.
- ``life_cycle``: the agents' STARTED/HEARTBEAT/ENDED into the workflows' states.
- ``root_causes``: an automatic profile's findings into its alert.
- ``settle``: what the timer decides (summaries of workflows whose end was decided elsewhere).

A workflow that ends (its scheduler's end, its hosts', or its samples stopping for good) is
summarised once, and every alert of it still firing resolves then, with the reason.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field

from schemas.goodput_buckets import judged_by_traffic
from schemas.sample_columns import CLOCK, blocks_of, size
from schemas.topics import (
    ALERTS,
    ENFORCEMENT,
    GPU_SAMPLES,
    PROFILE_REQUESTS,
    PROFILE_SCHEDULE,
    SERVING_WINDOWS,
    WORKFLOW_EVENTS,
    WORKFLOW_SUMMARIES,
    WORKFLOW_WINDOWS,
    TopicSpec,
)
from schemas.validate_ids import ids_error
from schemas.validate_sample import NOT_WORKFLOWS, ahead_error, service_error, serving_error, unobserved_error
from streams.alerts.raising import end_alerts, raise_alerts
from streams.enforcement.ladder import climb, stand_down
from streams.profiling.auto import auto_profile_requests
from streams.profiling.root_cause import apply_profile_result
from streams.profiling.schedule import is_periodic
from streams.serving import traffic
from streams.settings import StreamSettings
from streams.windows import workflow_state
from streams.windows.batches import BatchResult, Incoming
from streams.windows.summary import accumulate, correct, end_of, summary
from streams.windows.utilization import WindowAggregator

log = logging.getLogger(__name__)

UNOBSERVED = "UnobservedTime"
SERVING = "ServingSample"


@dataclass(frozen=True)
class Decoded:
    """A message of a batch that decoded: its place in the batch, schema and record, offset, and
    when Kafka received it (ms, or None)."""

    index: int
    name: str
    record: dict
    offset: int = 0
    received_ms: int | None = None


def _ahead(d: Decoded, what: str, newest_ms: int | None = None) -> str | None:
    """Why a host's record (ids checked) of the samples topic is refused as ahead of the time Kafka
    received it, as its GPU samples are (``schemas.validate_sample``), or None."""
    r = d.record
    at = r["event_time"] if newest_ms is None else max(r["event_time"], newest_ms)
    return ahead_error(f"{what} of workflow {r['workflow_id']} from host {r['host']}", at, d.received_ms)


@dataclass
class Output:
    """What a step decided, in the order it is sent."""

    records: list[tuple[TopicSpec, dict]] = field(default_factory=list)
    dead: list[tuple[int, str]] = field(default_factory=list)  # (the message's index in the batch, why)
    changed: set[str] = field(default_factory=set)  # workflow ids whose state changed (or went)
    history: set[str] = field(default_factory=set)  # closed windows kept for late samples, changed or gone
    stats: Counter = field(default_factory=Counter)

    def send(self, spec: TopicSpec, record: dict) -> None:
        self.records.append((spec, record))

    def of(self, spec: TopicSpec) -> list[dict]:
        return [r for s, r in self.records if s is spec]


class WindowStep:
    def __init__(self, settings: StreamSettings, store: MutableMapping, history: MutableMapping,
                 clock: Callable[[], int] | None = None) -> None:
        self.settings = settings
        self.store = store
        self.aggregator = WindowAggregator(settings.window, store, history, **({"clock": clock} if clock else {}),
                                           thresholds=settings.thresholds)
        self.ended_after_ms = int(settings.workflow_ended_s * 1000)
        self.quiet_ms = int(settings.idle_partition_s * 1000)

    # -- the samples topic ---------------------------------------------------------------------

    def samples(self, partition: int, batch: list[Decoded], now: int) -> Output:
        """A partition's messages of the samples topic, in offset order (those that did not
        decode are the caller's dead letters)."""
        out = Output()
        good: list[Incoming] = []
        clocks: list[int] = []
        ends: list[dict] = []  # the scheduler's ends of jobs, after their samples
        served: set[str] = set()  # the serving replicas whose traffic this batch brought
        index_of: dict[int, int] = {}
        for d in batch:
            index_of[d.offset] = d.index
            if d.name == SERVING:  # before the samples whose windows may close in this batch
                reason = (ids_error(d.record) or serving_error(d.record) or _ahead(d, "the serving sample")
                          or self._serving(partition, d))
                if reason:
                    out.dead.append((d.index, reason))
                else:
                    served.add(d.record["workflow_id"])
                out.changed.add(d.record["workflow_id"])
                out.stats["serving_samples"] += reason is None
            elif d.name == CLOCK:
                reason = ahead_error(f"the fleet's clock from worker {d.record['worker'][:80]!r}",
                                     d.record["event_time"], d.received_ms)
                (out.dead.append((d.index, reason)) if reason else clocks.append(d.record["event_time"]))
            elif d.name == WORKFLOW_EVENTS.schema and d.record["event"] == "ENDED":
                reason = ids_error(d.record) or service_error(d.record.get("service")) or _ahead(d, "the end")
                (out.dead.append((d.index, reason)) if reason else ends.append(d.record))
            elif d.name == UNOBSERVED:
                reason = (ids_error(d.record) or unobserved_error(d.record)
                          or _ahead(d, "the unobserved time", d.record["to_time"]))
                (out.dead.append((d.index, reason)) if reason
                 else good.append(Incoming(d.offset, d.record, 0, unobserved=True)))
            elif not GPU_SAMPLES.carries(d.name):
                out.dead.append((d.index, f"expected {GPU_SAMPLES.schema}, got {d.name}"))
            else:
                blocks, reasons = blocks_of(d.name, d.record, d.received_ms)
                good += [Incoming(d.offset, block, j) for j, block in enumerate(blocks)]
                out.dead += [(d.index, reason) for reason in reasons]
        result = self.aggregator.process(partition, good, closed_at=now)
        out.dead += [(index_of[inc.offset], reason) for inc, reason in result.refused]
        self._finish(out, partition, result, now)
        self._traffic_alone(out, partition, served, now)
        for event in ends:
            self._scheduler_end(out, partition, event, now)
        if clocks:
            self._finish(out, partition, self.aggregator.follow(partition, max(clocks), self.quiet_ms,
                                                                closed_at=now), now)
        out.stats["samples"] += sum(size(inc.record) for inc in good if not inc.unobserved)
        out.stats["refused"] += len(result.refused)
        out.stats["replayed"] += result.replayed
        return out

    def _serving(self, partition: int, d: Decoded) -> str | None:
        """A replica's checked ``ServingSample`` into its window's figures; why not, or None."""
        r = d.record
        if r["workflow_id"] in NOT_WORKFLOWS:
            return f"a serving sample of {r['workflow_id']!r}: the GPUs of a replica belong to a workflow"
        state = self.aggregator.state_of(r["workflow_id"], partition, r.get("owner"), r.get("team"))
        if state.serving is None:
            state.serving = {}
        return traffic.add(state.serving, r, d.offset, self.settings.window.size_ms)

    def _traffic_alone(self, out: Output, partition: int, served: set[str], now: int) -> None:
        """The windows of traffic of ``served`` that the partition's clock passed with no GPU window
        to judge them with: each a ``ServingWindow`` of no GPU (``traffic.unmatched``)."""
        watermark = self.aggregator.watermark(partition)
        for wf in sorted(served):
            state = self.store.get(wf)
            if state is not None and state.serving is not None:
                for record in self._alone(wf, state, traffic.unmatched(state.serving, state.windows, watermark,
                                                                       self.settings.window.size_ms), now):
                    out.send(SERVING_WINDOWS, record)
                    out.stats["serving_windows_without_gpus"] += 1

    def _alone(self, wf: str, state: workflow_state.WorkflowState, starts: list[int], now: int) -> list[dict]:
        """The ``ServingWindow`` of each window of traffic at ``starts``, judged with no GPU window."""
        size, config = self.settings.window.size_ms, self.settings.thresholds.for_team(state.team)
        return [traffic.close(state.serving, traffic.without_gpus(wf, state.owner, state.team, start, size), config,
                              now)[1] for start in starts]

    def _scheduler_end(self, out: Output, partition: int, event: dict, now: int) -> None:
        """A job's end from its scheduler, read after the samples its agent sent before it (they
        travel in one partition, in order): once every host it ran on has ended it, its windows
        close now, without waiting for the fleet's clock, and its summary goes out."""
        state = self._hear(partition, event)
        result = BatchResult()
        result.changed.add(event["workflow_id"])
        if state.ending:
            state.end_reason = end_of(state, event.get("scheduler") or "unknown")
            result = self.aggregator.close_workflow(partition, event["workflow_id"], closed_at=now)
            result.changed.add(event["workflow_id"])
        self._finish(out, partition, result, now)

    # -- the life-cycle and profile-results topics ----------------------------------------------

    def life_cycle(self, partition: int, batch: list[Decoded], now: int) -> Output:
        """The agents' STARTED/HEARTBEAT/ENDED: a workflow whose every host said ENDED is ending;
        its summary goes out once its last window has closed."""
        out, result = Output(), BatchResult()
        for d in batch:
            if d.name != WORKFLOW_EVENTS.schema:
                continue
            if d.record["event"] == "ENDED" and d.record.get("scheduler"):
                continue  # read in order with the job's samples, on the samples topic
            reason = ids_error(d.record) or service_error(d.record.get("service"))
            if reason:
                out.dead.append((d.index, reason))
                continue
            self._hear(partition, d.record)
            result.changed.add(d.record["workflow_id"])
        self._finish(out, partition, result, now)
        return out

    def root_causes(self, partition: int, records: list[dict], now: int) -> Output:
        """Analysed ranks of requested profiles: an automatic profile's findings go into the
        alert that asked for it; a periodic profile's end frees the scheduler's slot."""
        out, result, finished = Output(), BatchResult(), []
        for record in records:
            if is_periodic(record["request_id"]):
                finished.append(record["workflow_id"])
            state = self.store.get(record["workflow_id"])
            update = apply_profile_result(state, record, now) if state is not None else None
            if update is not None:
                log.info("alert %s: root cause from profile %s", update["alert_id"], update["profile_request_id"])
                out.send(ALERTS, update)
                result.changed.add(record["workflow_id"])
                out.stats["root_causes"] += 1
        self._finish(out, partition, result, now)
        if finished:  # the scheduler's slots are free again
            out.send(PROFILE_SCHEDULE, {"source_partition": None, "at": now, "running": [],
                                        "finished": sorted(set(finished))})
        return out

    def settle(self, partition: int, now: int) -> Output:
        """The timer's step: summaries of workflows whose ending was decided elsewhere."""
        out = Output()
        self._finish(out, partition, BatchResult(), now)
        return out

    def _hear(self, partition: int, event: dict) -> workflow_state.WorkflowState:
        state = self.aggregator.state_of(event["workflow_id"], partition, event["owner"], event["team"])
        workflow_state.hear(state, event)
        if state.serving is None and event.get("service"):  # its labels or environment say it serves
            state.serving = traffic.declared(event["service"])
        elif state.serving is None and self.settings.serving.says(state.scheduler_partition, state.scheduler_qos):
            state.serving = traffic.declared(state.scheduler_partition or state.scheduler_qos or "")
        return state

    # -- what a batch leads to ------------------------------------------------------------------

    def _finish(self, out: Output, partition: int, result: BatchResult, now: int) -> None:
        """Alerts and job totals for the windows ``result`` closed, corrected totals for the
        windows late samples completed (judged once, when they closed: no alerts again); then
        the workflows that ended now: their alerts resolved and their ladders stood down, and
        the summaries of those and of ended ones whose totals changed."""
        alerts, requests, steps, served = self._judge(result.closed, now)
        corrected = self._correct(result)
        ended = self._end(partition, result)
        for wf in sorted(ended):
            state = self.store[wf]
            at = state.ended_at if state.ended_at is not None else (state.job or {}).get("last", state.max_event_time)
            alerts += end_alerts(state, wf, state.end_reason or "ended", at, now)
            steps += stand_down(state, wf, self.settings.enforcement, state.end_reason or "ended", at, now)
        summaries = [record for wf in sorted(corrected | ended)  # its first summary, or one corrected later
                     if (record := summary(wf, self.store[wf], self.store[wf].end_reason or "ended", now)) is not None]
        for window in [*result.closed, *(window for window, _ in result.updated)]:
            out.send(WORKFLOW_WINDOWS, window)
        for record in served:  # a replica's window, judged by its traffic
            out.send(SERVING_WINDOWS, record)
        for alert in alerts:
            out.send(ALERTS, alert)
        for request in requests:  # the root cause of the waste, while the owner reads the alert
            out.send(PROFILE_REQUESTS, request)
        for step in steps:  # the enforcement ladder: warnings, the action falling due (gpufleet enforce)
            log.info("enforcement %s of %s (ladder %s): %s", step["step"], step["workflow_id"], step["policy"],
                     step["reason"])
            out.send(ENFORCEMENT, step)
        for record in summaries:
            out.send(WORKFLOW_SUMMARIES, record)
        out.changed |= result.changed | result.removed
        out.history |= result.history_changed | result.history_removed
        out.stats["windows"] += len(result.closed)
        out.stats["windows_updated"] += len(result.updated)
        out.stats["alerts"] += len(alerts)
        out.stats["summaries"] += len(summaries)

    def _judge(self, closed: list[dict], now: int) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
        """The alerts, profile requests, enforcement steps and serving windows of newly closed
        windows; their job totals. A serving replica's window is judged with its traffic."""
        alerts, requests, steps, served = [], [], [], []
        for window in closed:
            if window["workflow_id"] in NOT_WORKFLOWS:
                continue  # GPUs no workflow holds: capacity, counted by their windows; nobody to alert
            state = self.store.get(window["workflow_id"])
            if state is not None:  # (a workflow forgotten in this batch has no more alerts)
                judged, totals = window, window
                if state.serving is not None and traffic.read(state.serving):
                    served += self._alone(window["workflow_id"], state,
                                          traffic.before(state.serving, window["window_start"]), now)
                    figures, record = traffic.close(state.serving, window,
                                                    self.settings.thresholds.for_team(window.get("team")), now)
                    judged = {**window, "serving": figures}
                    totals = judged_by_traffic(window, record["state"] != "IDLE")  # as judged_windows counts it
                    self._judged(state.serving, window["window_start"], record["state"] != "IDLE")
                    served.append(record)
                elif state.serving is not None:  # declared a replica, its engine unread: by its GPUs
                    judged = {**window, "serving": traffic.by_gpus(state.serving, window)}
                raised = raise_alerts(state, judged, self.settings.alerts, now, thresholds=self.settings.thresholds)
                accumulate(state, totals, raised)
                alerts += raised
                requests += auto_profile_requests(state, raised, self.settings.auto_profile, now)
                steps += climb(state, judged, self.settings.enforcement, now)
        return alerts, requests, steps, served

    def _judged(self, serving: dict, start: int, served: bool) -> None:
        """Whether a replica's window at ``start`` served requests, kept while late samples may
        still complete it (``update_horizon_ms``): its corrected totals are judged alike."""
        judged = serving.setdefault("judged", {})
        judged[str(start)] = served
        horizon = start - self.settings.window.update_horizon_ms - self.settings.window.size_ms
        for key in [k for k in judged if int(k) < horizon]:
            del judged[key]

    def _correct(self, result: BatchResult) -> set[str]:
        """Job totals corrected for windows late samples completed (a replica's judged by the
        traffic its window served, as when it closed); the ended workflows among them."""
        corrected = set()
        for window, before in result.updated:
            state = self.store.get(window["workflow_id"])
            if state is not None:
                served = ((state.serving or {}).get("judged") or {}).get(str(window["window_start"]))
                after = window if served is None else judged_by_traffic(window, served)
                if served is not None and before is not None:
                    before = judged_by_traffic(before, served)
                correct(state, before, after)
                result.changed.add(window["workflow_id"])
                if state.ended:
                    corrected.add(window["workflow_id"])
        return corrected

    def _end(self, partition: int, result: BatchResult) -> set[str]:
        """The workflows of ``partition`` that have ended now, marked so."""
        ended = set()
        for wf in self.aggregator.ended(partition, self.ended_after_ms):
            state = self.store[wf]
            state.ended = True
            state.end_reason = ((state.end_reason or "its hosts reported it ended") if state.ending
                                else f"its samples stopped: none for {self.settings.workflow_ended_s:g} s")
            result.changed.add(wf)
            ended.add(wf)
        return ended
