"""Checks the ids that arrive from jobs and hosts: workflow, owner, team, host.

They come from a job's environment (``GPUFLEET_WORKFLOW_ID``, ``SLURM_JOB_USER`` …) or a host's
name, so whoever starts a job chooses them. They end up in e-mail headers, webhook messages,
HTML reports, file names and SQL results, so the contract allows only what an id needs: 1 to
256 ASCII letters, digits and ``_ . : @ / + = ~ , # -``, with spaces inside (never first or
last). A record with another id is a dead letter that says which field and why; nothing
downstream ever sees it.
"""

from __future__ import annotations

import re
from functools import lru_cache

MAX_ID_LENGTH = 256
ALLOWED = "letters, digits, spaces inside and _ . : @ / + = ~ , # -"
# (also the pattern ClickHouse checks ids with where it reads the agents' samples itself)
ID_PATTERN = r"[A-Za-z0-9_.:@/+=~,#-](?:[A-Za-z0-9_.:@/+=~,# -]*[A-Za-z0-9_.:@/+=~,#-])?"
_ID = re.compile(ID_PATTERN)
_BAD_CHAR = re.compile(r"[^A-Za-z0-9_.:@/+=~,# -]")

# The fields of each record that carry such ids; ``owner`` and ``team`` may be null.
ID_FIELDS = ("workflow_id", "host", "owner", "team")
OPTIONAL = frozenset({"owner", "team"})


@lru_cache(maxsize=65_536)
def _is_id(value: str) -> bool:
    return len(value) <= MAX_ID_LENGTH and _ID.fullmatch(value) is not None


def id_error(field: str, value: object) -> str | None:
    """None when ``value`` may be the id in ``field``, else what is wrong with it, in words."""
    if value is None:
        return None if field in OPTIONAL else f"{field} is missing"
    if not isinstance(value, str):
        return f"{field} is a {type(value).__name__}, not a string"
    if _is_id(value):
        return None
    shown = repr(value if len(value) <= 60 else value[:60] + "…")
    if not value:
        return f"{field} is empty"
    if len(value) > MAX_ID_LENGTH:
        return f"{field} {shown} has {len(value)} characters (at most {MAX_ID_LENGTH})"
    bad = _BAD_CHAR.search(value)
    if bad is not None:
        return (f"{field} {shown} has the character U+{ord(bad.group()):04X} at {bad.start()}: "
                f"an id is made of {ALLOWED}")
    return f"{field} {shown} starts or ends with a space"


def printable(text: str) -> str:
    """``text`` with each character that is not printable (a line's end, a tab, the start of a
    terminal's escape sequence) as its Python escape: a value someone else chose, shown in a
    header, a terminal or a table, starts no header, drives no terminal and draws no line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def ids_error(record: dict, fields: tuple[str, ...] = ID_FIELDS) -> str | None:
    """The first id of ``record`` (of ``fields`` it has) that is not allowed, or None."""
    for field in fields:
        if field in record:
            reason = id_error(field, record[field])
            if reason:
                return reason
    return None


# A Slurm job id, or an array task's (123_4): what a workflow ``slurm-<id>`` carries, and all a
# prolog, an epilog or a command line for Slurm may be handed as one.
SLURM_JOB_ID = re.compile(r"[0-9]{1,20}(?:_[0-9]{1,10})?")


def slurm_job_of(workflow_id: str) -> str | None:
    """The Slurm job id of a workflow the agents name ``slurm-<id>``, or None."""
    job = workflow_id.removeprefix("slurm-")
    return job if job != workflow_id and SLURM_JOB_ID.fullmatch(job) else None
