"""The hand-off between the host agent and the profiling hook inside a training process.

The training process is not a Kafka client (it must not need the network, a port or our
dependencies to be profiled), so the two meet in a directory of small files, each written
under a temporary name and renamed, so that a reader never sees half of one:

==================================  ========  =============================================
``hook-<pid>.json``                 hook      "I am rank R of workflow W, and I listen" (at ``enable()``)
``request-<pid>.json``              agent     "capture N steps or T ms for request Q"; the hook removes it
``trace-<request>-<pid>.json``      hook      the Chrome trace of the capture; the agent removes it
``error-<request>-<pid>.txt``       hook      why the capture failed; the agent removes it
==================================  ========  =============================================

The directory is ``GPUFLEET_PROFILE_DIR``, by default ``gpufleet-profile-<uid>`` in the
system's temporary directory: one per user. It is private: created with mode 0700, and one
that exists is refused (``HandoffError``) unless it is a real directory of this user (or,
for an agent running as root, of any user) that no one else may write to. Another user who
made it first could otherwise read the traces or plant requests and traces.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path


class HandoffError(RuntimeError):
    """The profile directory cannot be trusted or used; the text says why."""


def default_dir() -> Path:
    return Path(
        os.environ.get("GPUFLEET_PROFILE_DIR") or Path(tempfile.gettempdir()) / f"gpufleet-profile-{os.getuid()}"
    )


def private_dir(path: Path) -> Path:
    """``path``, created 0700 if missing; checked to be private if it exists."""
    path = Path(path)
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise HandoffError(f"the profile directory {path} is not a directory (a link or a file)")
    me = os.getuid()
    if info.st_uid != me and me != 0:
        raise HandoffError(f"the profile directory {path} belongs to uid {info.st_uid}, not to this user ({me}): "
                           f"remove it, or set GPUFLEET_PROFILE_DIR to a directory of your own")
    if info.st_mode & 0o022:
        if info.st_uid == me:
            os.chmod(path, 0o700)
        else:
            raise HandoffError(f"the profile directory {path} may be written by others "
                               f"(mode {stat.S_IMODE(info.st_mode):o}); it must be 0700")
    return path


def safe_name(request_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in request_id)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class Handoff:
    """One side's view of the profile directory ``directory`` (checked private on creation)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.dir = private_dir(directory or default_dir())

    # The hook's side.

    def announce(self, pid: int, rank: int, workflow_id: str | None, **facts: object) -> None:
        _write(self.dir / f"hook-{pid}.json", json.dumps({"pid": pid, "rank": rank, "workflow_id": workflow_id,
                                                           **facts}))

    def take_request(self, pid: int) -> dict | None:
        """The agent's request to this process, removed once read (None when there is none)."""
        path = self.dir / f"request-{pid}.json"
        try:
            request = json.loads(path.read_text())
        except (OSError, ValueError):
            return None  # none, or being renamed in: read it next time
        path.unlink(missing_ok=True)
        return request

    def trace_part(self, request_id: str, pid: int) -> Path:
        """Where the hook writes a trace before ``trace_done`` renames it into place."""
        return self.dir / f".trace-{safe_name(request_id)}-{pid}.json.part"

    def trace_done(self, request_id: str, pid: int) -> None:
        part = self.trace_part(request_id, pid)
        os.chmod(part, 0o600)  # written by the profiler under the process's umask
        os.replace(part, self._trace(request_id, pid))

    def fail(self, request_id: str, pid: int, reason: str) -> None:
        _write(self.dir / f"error-{safe_name(request_id)}-{pid}.txt", reason)

    def report_throughput(self, pid: int, model_tflops: float, at: float) -> None:
        """The model FLOPs per second (in TFLOPS) process ``pid`` did lately, as of ``at`` (epoch s)."""
        _write(self.dir / f"throughput-{pid}.json", json.dumps({"model_tflops": model_tflops, "at": at}))

    def report_memory(self, pid: int, peak_bytes: int, reserved_bytes: int, at: float) -> None:
        """The framework allocator's peaks of process ``pid`` over its GPUs, as of ``at`` (epoch s)."""
        _write(self.dir / f"memory-{pid}.json",
               json.dumps({"peak_bytes": peak_bytes, "reserved_bytes": reserved_bytes, "at": at}))

    # The agent's side.

    def hooks(self) -> list[dict]:
        """The announcements of processes still alive."""
        out = []
        for path in self.dir.glob("hook-*.json"):
            try:
                info = json.loads(path.read_text())
                os.kill(info["pid"], 0)
            except (OSError, ValueError, KeyError, TypeError):
                continue
            out.append(info)
        return out

    def throughputs(self, now: float, max_age_s: float = 60.0) -> dict[int, float]:
        """pid -> TFLOPS of model work each live process reported within ``max_age_s`` of
        ``now``; a stale report (the job stopped reporting) counts as none."""
        out = {}
        for path in self.dir.glob("throughput-*.json"):
            try:
                pid = int(path.stem.removeprefix("throughput-"))
                report = json.loads(path.read_text())
                tflops, at = float(report["model_tflops"]), float(report["at"])
                os.kill(pid, 0)
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if now - at <= max_age_s and 0.0 <= tflops < float("inf"):
                out[pid] = tflops
        return out

    def memory_peaks(self, now: float, max_age_s: float = 300.0) -> dict[int, tuple[int, int]]:
        """pid -> (allocator peak, reserved peak) bytes each live process reported within
        ``max_age_s`` of ``now``."""
        out = {}
        for path in self.dir.glob("memory-*.json"):
            try:
                pid = int(path.stem.removeprefix("memory-"))
                report = json.loads(path.read_text())
                peak, reserved, at = int(report["peak_bytes"]), int(report["reserved_bytes"]), float(report["at"])
                os.kill(pid, 0)
            except (OSError, ValueError, KeyError, TypeError, OverflowError):
                continue
            if now - at <= max_age_s and 0 <= peak < 1 << 50 and 0 <= reserved < 1 << 50:
                out[pid] = (peak, reserved)
        return out

    def ask(self, pid: int, request: dict) -> None:
        _write(self.dir / f"request-{pid}.json", json.dumps(request))

    def withdraw(self, pid: int) -> None:
        (self.dir / f"request-{pid}.json").unlink(missing_ok=True)

    def trace(self, request_id: str, pid: int) -> Path | None:
        """The finished trace of ``request_id`` by ``pid``, if it is there."""
        path = self._trace(request_id, pid)
        return path if path.exists() else None

    def error(self, request_id: str, pid: int) -> str | None:
        """Why the hook failed, if it did (the report is removed once read)."""
        path = self.dir / f"error-{safe_name(request_id)}-{pid}.txt"
        try:
            reason = path.read_text().strip()
        except OSError:
            return None
        path.unlink(missing_ok=True)
        return reason

    def _trace(self, request_id: str, pid: int) -> Path:
        return self.dir / f"trace-{safe_name(request_id)}-{pid}.json"
