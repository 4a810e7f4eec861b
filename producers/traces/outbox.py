"""Traces kept on disk until the broker has every message of them, as the spool keeps samples.

A finished trace is moved out of the hand-off directory into the outbox (``put``), with what
its messages need (the request, the rank, the host's view during the capture); the profile
agent sends it from there and removes it only once every message of it was delivered
(``delivered``): a broker away, a flush that timed out, a delivery that failed, or an agent
restarted in between, and the trace is sent again (the trace stage skips the events it has by
their sequence numbers). The outbox holds at most ``max_bytes``: past that the oldest trace is
dropped, with a warning and the count (``dropped``), and its requester hears FAILED.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pending:
    """A trace in the outbox: its file and what its messages need (``meta``)."""

    path: Path
    meta: dict

    @property
    def meta_path(self) -> Path:
        return self.path.with_name(self.path.name + ".meta.json")


class TraceOutbox:
    def __init__(self, directory: Path, max_bytes: int = 2 << 30) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.max_bytes = max_bytes
        self.dropped = 0
        self._seq = max((int(p.name.split("-", 1)[0]) for p in self._traces()), default=0)

    def _traces(self) -> list[Path]:
        return sorted((p for p in self.directory.iterdir() if not p.name.endswith((".meta.json", ".part"))),
                      key=lambda p: int(p.name.split("-", 1)[0]))

    def put(self, trace: Path, meta: dict) -> list[Pending]:
        """Move ``trace`` in (its metadata first, so a trace is never there without it); the
        traces dropped to keep within ``max_bytes``, oldest first."""
        self._seq += 1
        path = self.directory / f"{self._seq:09d}-{trace.name}"
        pending = Pending(path, meta)
        part = pending.meta_path.with_name(pending.meta_path.name + ".part")
        part.write_text(json.dumps(meta))
        os.replace(part, pending.meta_path)
        shutil.move(str(trace), path)
        return self._bound(keep=pending)

    def pending(self) -> list[Pending]:
        """The traces not yet delivered, oldest first (those of an earlier run too)."""
        out = []
        for path in self._traces():
            meta_path = path.with_name(path.name + ".meta.json")
            try:
                out.append(Pending(path, json.loads(meta_path.read_text())))
            except (OSError, ValueError) as exc:
                log.warning("trace %s in the outbox has no readable metadata (%s): dropped", path, exc)
                self._remove(Pending(path, {}))
                self.dropped += 1
        return out

    def delivered(self, pending: Pending) -> None:
        self._remove(pending)

    def size(self) -> int:
        return sum(p.stat().st_size for p in self.directory.iterdir() if p.is_file())

    def _remove(self, pending: Pending) -> None:
        pending.path.unlink(missing_ok=True)
        pending.meta_path.unlink(missing_ok=True)

    def _bound(self, keep: Pending) -> list[Pending]:
        dropped = []
        for oldest in self.pending():
            if self.size() <= self.max_bytes or oldest.path == keep.path:
                break
            self._remove(oldest)
            self.dropped += 1
            dropped.append(oldest)
            log.warning("trace outbox over %d bytes: dropped the oldest undelivered trace %s (%d dropped so far)",
                        self.max_bytes, oldest.meta.get("trace_id"), self.dropped)
        return dropped
