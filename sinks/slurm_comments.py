"""Writes each ended Slurm job's efficiency line into its Slurm accounting record
(``AdminComment``), where HPC admins already look: ``sacct -o AdminComment`` shows it, as the
jobstats tools do.

Consumes the workflow summaries; for a workflow ``slurm-<id>`` runs ``sacctmgr -i modify job
where jobid=<id> [cluster=<cluster>] set AdminComment=<line>`` (the line from
``sinks.job_report.efficiency_line``). A job's record is written only once the job has ended,
and a finished job can be changed through Slurm's accounting daemon alone (``scontrol update``
refuses a job that has finished), so the cluster needs slurmdbd. A corrected summary (late
samples) writes the line again, corrected. Offsets are committed after the lines are written:
a restart writes a line again, which changes nothing.

What ``sacctmgr`` says "nothing modified" to is not this cluster's job (or not in its
accounting): skipped. Anything else is retried with backoff; after ``retries`` the summary is
a dead letter with sacctmgr's answer, and the writer goes on.
"""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Callable

from kafka_client.config import Connection
from kafka_client.consume_loop import ConsumeLoop
from kafka_client.metrics import ComponentMetrics
from schemas.codec import Codec, CodecError
from schemas.topics import WORKFLOW_SUMMARIES
from schemas.validate_ids import slurm_job_of
from sinks.job_report import efficiency_line

log = logging.getLogger(__name__)

STAGE = "slurm-comments"
METRICS = ComponentMetrics("slurm-comments")
WRITTEN = METRICS.counter("gpufleet_slurm_comments", "Ended Slurm jobs' efficiency lines, by outcome "
                          "(written; skipped: not this cluster's job; failed: dead-lettered)", ["outcome"])


class SlurmComments:
    def __init__(self, kafka: str | Connection, group_id: str = "gpufleet-slurm-comments", topic_prefix: str = "",
                 cluster: str | None = None, sacctmgr: str = "sacctmgr", retries: int = 5, backoff_s: float = 1.0,
                 timeout_s: float = 30.0, runner: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> None:
        self.cluster, self.sacctmgr, self.runner = cluster, sacctmgr, runner
        self.retries, self.backoff_s, self.timeout_s = retries, backoff_s, timeout_s
        self.codec = Codec()
        self.loop = ConsumeLoop(kafka, group_id, [topic_prefix + WORKFLOW_SUMMARIES.name], METRICS, STAGE,
                                topic_prefix, codec=self.codec)
        self.written: dict[str, str] = {}  # job id -> the line written (this process)

    def run(self, stop: threading.Event) -> None:
        def step(batch: list) -> None:
            for m in batch:
                self._handle(m, stop)
            if batch:
                self.loop.commit(batch)

        self.loop.run(stop, step, batch_size=100)

    def _handle(self, m, stop: threading.Event) -> None:
        try:
            name, summary = self.codec.decode(m.value())
        except CodecError as exc:
            self.loop.dead_letter(str(exc), m)
            return
        job = None
        if name == WORKFLOW_SUMMARIES.schema:  # the raw id where the summary has it (an array task's own)
            raw = summary.get("scheduler_job_id") if summary.get("scheduler") == "slurm" else None
            job = raw or slurm_job_of(summary.get("workflow_id", ""))
        if job is None:
            return  # not a Slurm job's
        line = efficiency_line(summary)
        where = [f"jobid={job}"] + ([f"cluster={self.cluster}"] if self.cluster else [])
        command = [self.sacctmgr, "-i", "modify", "job", "where", *where, "set", f"AdminComment={line}"]
        for attempt in range(self.retries + 1):
            try:
                out = self.runner(command, capture_output=True, text=True, timeout=self.timeout_s, check=False)
                answer = (out.stdout + out.stderr).strip()
                if out.returncode == 0:
                    self.written[job] = line
                    WRITTEN.labels("written").inc()
                    log.info("slurm job %s: %s", job, line)
                    return
                if "Nothing modified" in answer:
                    WRITTEN.labels("skipped").inc()
                    log.info("slurm job %s is not in this cluster's accounting: %s", job, answer.splitlines()[0])
                    return
            except (OSError, subprocess.TimeoutExpired) as exc:
                answer = str(exc)
            log.warning("sacctmgr for job %s failed (attempt %d): %s", job, attempt + 1, answer)
            if stop.wait(self.backoff_s * 2 ** attempt):
                raise RuntimeError("stopped while writing a Slurm job's comment; its summary is read again")
        WRITTEN.labels("failed").inc()
        self.loop.dead_letter(f"sacctmgr could not write job {job}'s AdminComment: {answer[:500]}", m)
