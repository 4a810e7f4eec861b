"""What Slurm says of a job, read by gpufleet's prolog and epilog so that nothing a user types can
hide or forge it.

Slurm 22.05 gives a prolog no ``SLURM_JOB_QOS``, ``SLURM_JOB_NAME`` nor start time, so they come
from the controller. Its JSON (``squeue --json``) ignores ``-j`` in 22.05 (every job of the
cluster, from every prolog) and is no UTF-8 where one job name is not; ``squeue -o`` prints job
names raw, newlines and separators included. So the facts are read in two calls:

1. ``squeue -o`` with only fields no user can fill with free text (ids; user, account, partition
   and QoS, which an administrator created; times as epoch seconds, ``SLURM_TIME_FORMAT=%s``;
   Slurm's own states and reasons), every line checked field by field and the job's picked by its
   raw id. A line that does not parse fails the whole answer: nothing is guessed from it.
2. the job's name alone (``-o %j`` for the job's display id): the whole answer is the name.

The epilog also asks ``sacct`` (accounting: the final state, who cancelled, the exit code),
again with fields that hold no free text. What could not be read is named in ``unknown`` with
the reason in ``problems``: the record says so, the agent publishes it, and the enforcement
ladders hold a job whose exemptions depend on a fact that is unknown (``streams.enforcement``).
Nothing falls back to the script's own clock.
"""

from __future__ import annotations

import logging
import pwd
import re
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

Runner = Callable[..., subprocess.CompletedProcess]

SEP = "|"
# (fact, squeue format): none of these can hold a user's free text (the job name is read alone).
SQUEUE_FIELDS = (("job_id", "%A"), ("display_id", "%i"), ("array_job_id", "%F"), ("array_task_id", "%K"),
                 ("user", "%u"), ("account", "%a"), ("partition", "%P"), ("qos", "%q"), ("time_limit", "%l"),
                 ("start", "%S"), ("end", "%e"), ("state", "%T"), ("reason", "%r"), ("nodes", "%N"))
SQUEUE_FORMAT = SEP.join(f for _, f in SQUEUE_FIELDS)
SACCT_FIELDS = ("JobIDRaw", "State", "ExitCode", "Start", "End")

# A name an administrator gave (user, account, partition, QoS): no separator, space or control character.
_NAME = re.compile(r"[^\x00-\x20|\x7f]{1,256}")
_DIGITS = re.compile(r"[0-9]{1,20}")
_DISPLAY = re.compile(r"[0-9]{1,20}(?:_[0-9]{1,10})?")
_NODES = re.compile(r"[A-Za-z0-9_.,\[\]-]{1,4096}")
_REASON = re.compile(r"[A-Za-z0-9_:.,()/ -]{1,256}")
_EPOCH = re.compile(r"[0-9]{1,12}")
_EXIT = re.compile(r"([0-9]{1,3}):([0-9]{1,3})")
_SACCT_STATE = re.compile(r"([A-Z_]{3,20})(?: by ([0-9]{1,10}))?")
NO_VALUE = frozenset({"", "N/A", "n/a", "(null)", "Unknown", "NONE", "None", "INVALID", "NOT_SET"})

JOB_STATES = frozenset({"PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "COMPLETED", "CANCELLED", "FAILED",
                        "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
                        "CONFIGURING", "REQUEUED", "RESIZING", "REVOKED", "SIGNALING", "SPECIAL_EXIT",
                        "STAGE_OUT", "STOPPED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD"})
# The states a job ends in, as a summary tells them.
END_STATES = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL",
                        "DEADLINE", "OUT_OF_MEMORY"})
# Facts whose absence a prolog's record names (the enforcement ladders' exemptions read the first four).
FACTS = ("user", "account", "partition", "qos", "name", "time_limit", "start", "end", "end_state")


@dataclass
class JobFacts:
    """What the scheduler said of one job, and what it could not say (``unknown``, with why)."""

    job_id: str
    display_id: str | None = None  # 123_4 for an array task, else the raw id
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    name: str | None = None
    time_limit_s: int | None = None
    started_ms: int | None = None
    ended_ms: int | None = None
    state: str | None = None
    reason: str | None = None
    nodes: str | None = None
    end_state: str | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    cancelled_by: str | None = None
    unknown: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def missing(self, fact: str, why: str) -> None:
        if fact not in self.unknown:
            self.unknown.append(fact)
        if why not in self.problems:
            self.problems.append(why)


def time_limit_s(text: str | None) -> int | None:
    """A time limit as ``squeue`` prints it (``UNLIMITED``, ``5:00``, ``1:00:00``,
    ``2-00:00:00``), in seconds; None where there is none."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+(?::\d+){0,2})", (text or "").strip())
    if not m:
        return None
    seconds = 0
    for part in m.group(2).split(":"):
        seconds = seconds * 60 + int(part)
    return int(m.group(1) or 0) * 86400 + seconds


class SlurmReader:
    """Reads a job's facts from the controller (``squeue``) and its accounting (``sacct``).
    ``runner`` is ``subprocess.run`` (a test's stand-in takes the same arguments)."""

    def __init__(self, runner: Runner = subprocess.run, env: Mapping[str, str] | None = None,
                 timeout_s: float = 5.0, sacct_tries: int = 5, sacct_wait_s: float = 0.4) -> None:
        import os

        self.runner, self.timeout_s = runner, timeout_s
        self.sacct_tries, self.sacct_wait_s = sacct_tries, sacct_wait_s
        # Times as epoch seconds: no time zone or daylight saving to guess.
        self.env = {**(os.environ if env is None else env), "SLURM_TIME_FORMAT": "%s"}

    def _run(self, argv: list[str]) -> tuple[str | None, str]:
        """(stdout, '') or (None, why it failed). Bytes that are no UTF-8 are kept as escapes."""
        try:
            out = self.runner(argv, capture_output=True, timeout=self.timeout_s, check=False, env=self.env)
        except FileNotFoundError:
            return None, f"{argv[0]} is not installed here"
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"{argv[0]}: {exc}"
        stdout = out.stdout.decode("utf-8", "backslashreplace") if isinstance(out.stdout, bytes) else out.stdout
        if out.returncode != 0:
            stderr = out.stderr.decode("utf-8", "replace") if isinstance(out.stderr, bytes) else (out.stderr or "")
            return None, f"{argv[0]} exited {out.returncode}: {stderr.strip()[:300]}"
        return stdout, ""

    def read(self, job_id: str, ended: bool = False) -> JobFacts:
        """The job's facts; in an epilog (``ended``) with its end from accounting too."""
        facts = JobFacts(job_id)
        self._controller(facts)
        if facts.display_id is not None:
            self._name(facts)
        if ended:
            self._accounting(facts)
            self._end_from_controller(facts)
        for fact in ("user", "account", "partition", "qos", "start"):
            value = {"start": facts.started_ms}.get(fact, getattr(facts, fact, None))
            if value is None and fact not in facts.unknown:
                facts.missing(fact, f"squeue did not say the {fact} of job {job_id}")
        return facts

    # -- squeue -------------------------------------------------------------------------------

    def _controller(self, facts: JobFacts) -> None:
        job = facts.job_id
        out, why = self._run(["squeue", "-h", "-t", "all", "-j", job, "-o", SQUEUE_FORMAT])
        if out is None:
            for fact in ("user", "account", "partition", "qos", "name", "time_limit", "start"):
                facts.missing(fact, why)
            return
        rows, bad = [], []
        for line in out.split("\n")[:-1] if out.endswith("\n") else out.split("\n"):
            values = line.split(SEP)
            if len(values) != len(SQUEUE_FIELDS):
                bad.append(f"a line of {len(values)} fields where {len(SQUEUE_FIELDS)} were asked: {line[:120]!r}")
                continue
            rows.append(dict(zip((name for name, _ in SQUEUE_FIELDS), values)))
        mine = [r for r in rows if r["job_id"] == job]
        if bad or len(mine) != 1:
            why = "; ".join(bad) or f"squeue listed job {job} {len(mine)} times"
            for fact in ("user", "account", "partition", "qos", "name", "time_limit", "start"):
                facts.missing(fact, f"squeue's answer for job {job} cannot be read: {why}")
            return
        self._checked(facts, mine[0])

    def _checked(self, facts: JobFacts, row: dict[str, str]) -> None:
        """Each field of the job's line, checked; one that fails is unknown, with why."""
        job = facts.job_id

        def named(fact: str) -> str | None:
            value = row[fact]
            if value in NO_VALUE:
                return None
            if not _NAME.fullmatch(value):
                facts.missing(fact, f"squeue gave job {job} the {fact} {value[:80]!r}, which is no name")
                return None
            return value

        if _DISPLAY.fullmatch(row["display_id"]):
            facts.display_id = row["display_id"]
        array, task = row["array_job_id"], row["array_task_id"]
        if _DIGITS.fullmatch(array) and _DIGITS.fullmatch(task):
            facts.display_id = f"{array}_{task}"
        elif facts.display_id is None or "_" in facts.display_id:
            facts.display_id = job
        for fact in ("user", "account", "partition", "qos"):
            setattr(facts, fact, named(fact))
        limit = row["time_limit"]
        facts.time_limit_s = time_limit_s(limit)
        if facts.time_limit_s is None and limit not in ("UNLIMITED", "Partition_Limit", *NO_VALUE):
            facts.missing("time_limit", f"squeue gave job {job} the time limit {limit[:40]!r}")
        facts.started_ms = self._epoch(facts, "start", row["start"])
        state = row["state"]
        if state in JOB_STATES:
            facts.state = state
        else:
            facts.problems.append(f"squeue gave job {job} the state {state[:40]!r}")
        if state in END_STATES or state == "COMPLETING":
            facts.ended_ms = self._epoch(facts, "end", row["end"])
        if _REASON.fullmatch(row["reason"]):
            facts.reason = None if row["reason"] in NO_VALUE else row["reason"]
        if _NODES.fullmatch(row["nodes"]) and row["nodes"] not in NO_VALUE:
            facts.nodes = row["nodes"]

    def _epoch(self, facts: JobFacts, fact: str, text: str) -> int | None:
        if text in NO_VALUE or text == "0":
            return None
        if not _EPOCH.fullmatch(text):
            facts.missing(fact, f"job {facts.job_id}'s {fact} time {text[:40]!r} is no time Slurm gives")
            return None
        return int(text) * 1000

    def _name(self, facts: JobFacts) -> None:
        """The job's name: the whole answer for its display id, less the line's end."""
        out, why = self._run(["squeue", "-h", "-t", "all", "-j", facts.display_id, "-o", "%j"])
        if out is None or not out.endswith("\n"):
            facts.missing("name", why or f"squeue gave job {facts.job_id} no name")
            return
        facts.name = out[:-1] or None

    # -- sacct (the epilog) -----------------------------------------------------------------

    def _accounting(self, facts: JobFacts) -> None:
        """The job's final state, who cancelled it, its exit code and its end, from sacct:
        asked again for a moment while accounting still has the job running."""
        why = ""
        for attempt in range(self.sacct_tries):
            if attempt:
                time.sleep(self.sacct_wait_s)
            out, why = self._run(["sacct", "-X", "-n", "-P", "-j", facts.job_id, "-o", ",".join(SACCT_FIELDS)])
            if out is None:
                break
            rows = [line.split("|") for line in out.split("\n") if line]
            mine = [r for r in rows if len(r) == len(SACCT_FIELDS) and r[0] == facts.job_id]
            if len(mine) != 1 or any(len(r) != len(SACCT_FIELDS) for r in rows):
                why = f"sacct's answer for job {facts.job_id} cannot be read ({len(rows)} lines)"
                break
            _, state, exit_code, _, end = mine[0]
            m = _SACCT_STATE.fullmatch(state)
            if m is None:
                why = f"sacct gave job {facts.job_id} the state {state[:40]!r}"
                break
            if m.group(1) not in END_STATES:
                why = f"sacct still had job {facts.job_id} {m.group(1)} after {attempt + 1} tries"
                continue
            facts.end_state = m.group(1)
            if m.group(2) is not None:
                facts.cancelled_by = _user_name(int(m.group(2)))
            code = _EXIT.fullmatch(exit_code)
            if code:
                facts.exit_code, facts.exit_signal = int(code.group(1)), int(code.group(2))
            ended = self._epoch(facts, "end", end)
            if ended is not None:
                facts.ended_ms = ended
            return
        if why not in facts.problems:
            facts.problems.append(why)

    def _end_from_controller(self, facts: JobFacts) -> None:
        """Without accounting's word, what the controller's state and reason tell of the end."""
        if facts.end_state is None:
            if facts.state in END_STATES:
                facts.end_state = facts.state
            elif facts.state == "COMPLETING":
                facts.end_state = {"TimeLimit": "TIMEOUT", "NonZeroExitCode": "FAILED",
                                   "OutOfMemory": "OUT_OF_MEMORY"}.get(facts.reason or "")
        if facts.end_state is None:
            facts.missing("end_state", f"neither sacct nor squeue said how job {facts.job_id} ended")
        if facts.ended_ms is None:
            facts.missing("end", f"neither sacct nor squeue gave job {facts.job_id}'s end time")


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
