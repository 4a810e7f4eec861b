"""Slurm's ``squeue`` and ``sacct`` as executables on ``PATH`` for unit tests, printing a table
of jobs the way Slurm 22.05 prints them: ``-o`` formats with each field as Slurm fills it (job
names raw: newlines, control characters, separators and bytes that are no UTF-8 included),
times as ``SLURM_TIME_FORMAT`` says, ``-j`` selecting by raw id, array job id or display id.
The real commands against a real cluster are in ``tests/integration/test_slurm.py``; these make
the prolog's and epilog's parsing testable with every name a user can give, without one."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SCRIPT = """#!{python}
import sys
sys.path.insert(0, {root!r})
from tests.support.fake_slurm import main
sys.exit(main({command!r}, sys.argv[1:]))
"""
ROOT = str(Path(__file__).resolve().parents[2])

SQUEUE = {"A": "job_id", "i": "display_id", "F": "array_job_id", "K": "array_task_id", "u": "user", "a": "account",
          "P": "partition", "q": "qos", "l": "time_limit", "S": "start", "e": "end", "T": "state", "r": "reason",
          "N": "nodes", "j": "name"}
SACCT = {"JobIDRaw": "job_id", "JobID": "display_id", "State": "sacct_state", "ExitCode": "exit_code",
         "Start": "start", "End": "end", "JobName": "name"}


def install(bin_dir: Path, jobs_file: Path) -> dict[str, str]:
    """Write ``squeue`` and ``sacct`` into ``bin_dir``; the environment that puts them first on
    ``PATH`` and points them at ``jobs_file`` (a JSON list of jobs, see ``job``)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for command in ("squeue", "sacct"):
        path = bin_dir / command
        path.write_text(SCRIPT.format(python=sys.executable, root=ROOT, command=command))
        path.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "FAKE_SLURM_JOBS": str(jobs_file)}


def job(job_id: int, **fields) -> dict:
    """A job as the fake controller keeps it (names as byte-preserving strings: surrogateescape)."""
    out = {"job_id": str(job_id), "display_id": str(job_id), "array_job_id": "N/A", "array_task_id": "N/A",
           "user": "ana", "account": "vision", "partition": "gpu", "qos": "normal", "time_limit": "1:00:00",
           "start": 1_796_000_000, "end": 1_796_003_600, "state": "RUNNING", "reason": "None", "nodes": "node-7",
           "name": "train", "sacct_state": "RUNNING", "exit_code": "0:0"}
    out.update(fields)
    return out


def write_jobs(path: Path, jobs: list[dict]) -> None:
    path.write_bytes(json.dumps(jobs, ensure_ascii=True).encode())


def _selected(jobs: list[dict], wanted: str | None) -> list[dict]:
    if wanted is None:
        return jobs
    ids = set(wanted.split(","))
    return [j for j in jobs if j["job_id"] in ids or j["display_id"] in ids or j["array_job_id"] in ids]


def _time(value, fmt: str | None) -> str:
    if value in (None, 0):
        return "N/A" if fmt == "%s" else "Unknown"
    if isinstance(value, str):
        return value
    import time

    return str(value) if fmt == "%s" else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(value))


def _value(j: dict, field: str, fmt: str | None) -> str:
    return _time(j.get(field), fmt) if field in ("start", "end") else str(j.get(field, ""))


def main(command: str, argv: list[str]) -> int:
    jobs = json.loads(Path(os.environ["FAKE_SLURM_JOBS"]).read_bytes())
    fmt = os.environ.get("SLURM_TIME_FORMAT")
    wanted = form = None
    args = iter(argv)
    for a in args:
        if a in ("-j", "--jobs"):
            wanted = next(args)
        elif a in ("-o", "--format"):
            form = next(args)
    out = sys.stdout.buffer
    if command == "squeue":
        for j in _selected(jobs, wanted):
            line, i = [], 0
            while i < len(form):
                if form[i] == "%" and i + 1 < len(form):
                    line.append(_value(j, SQUEUE[form[i + 1]], fmt))
                    i += 2
                else:
                    line.append(form[i])
                    i += 1
            out.write(("".join(line) + "\n").encode("utf-8", "surrogateescape"))
        return 0
    fields = form.split(",")
    for j in _selected(jobs, wanted):
        out.write(("|".join(_value(j, SACCT[f], fmt) for f in fields) + "\n").encode("utf-8", "surrogateescape"))
    return 0
