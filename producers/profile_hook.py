"""The in-process half of on-demand profiling: one line in a training script,

    import producers.profile_hook; producers.profile_hook.enable()

and the host agent can make this process capture a ``torch.profiler`` trace (CPU and CUDA
activities) for a number of optimizer steps or seconds. The hook counts steps through
PyTorch's global optimizer post-step hook, so the training loop needs no other change; it
marks each step (``ProfilerStep#N``, from one optimizer step's end to the next) as the
trace analysis expects.

It talks to the agent through files in the profile directory (``GPUFLEET_PROFILE_DIR``,
default ``/tmp/gpufleet-profile``), which needs no network and no port:

- ``hook-<pid>.json``: written at ``enable()``: pid, rank, workflow; the agent finds the
  ranks of a workflow here (the launcher, e.g. torchrun, does not enable the hook, so it
  is never mistaken for a rank);
- ``request-<pid>.json``: the agent asks; the hook removes it when it starts;
- ``trace-<request>-<pid>.json``: the trace (written under a temporary name, then renamed);
- ``error-<request>-<pid>.txt``: why the capture failed.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_DIR = "/tmp/gpufleet-profile"
WORKFLOW_KEYS = ("GPUFLEET_WORKFLOW_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")


def profile_dir() -> Path:
    return Path(os.environ.get("GPUFLEET_PROFILE_DIR", DEFAULT_DIR))


def safe_name(request_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in request_id)


class _Hook:
    def __init__(self, directory: Path, poll_s: float) -> None:
        import torch  # the optional 'profiling' extra

        self.torch = torch
        self.dir = directory
        self.poll_s = poll_s
        self.pid = os.getpid()
        self.rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
        self.pending: dict | None = None
        self.active: dict | None = None
        self.lock = threading.Lock()
        self.dir.mkdir(parents=True, exist_ok=True)
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(self._after_step)
        threading.Thread(target=self._watch, name="gpufleet-profile-hook", daemon=True).start()
        # Announced last: an agent never asks a hook that is not listening yet.
        workflow = next((os.environ[k] for k in WORKFLOW_KEYS if os.environ.get(k)), None)
        announce = {"pid": self.pid, "rank": self.rank, "workflow_id": workflow, "torch": torch.__version__,
                    "cuda": torch.cuda.is_available()}
        _write_atomically(self.dir / f"hook-{self.pid}.json", json.dumps(announce))

    def _watch(self) -> None:
        request_file = self.dir / f"request-{self.pid}.json"
        while True:
            if request_file.exists():
                try:
                    request = json.loads(request_file.read_text())
                except (OSError, ValueError):
                    time.sleep(self.poll_s)  # being written: read it next time
                    continue
                request_file.unlink(missing_ok=True)
                with self.lock:
                    if self.pending is None and self.active is None:
                        self.pending = request
                    else:
                        self._fail(request, "a profile is already running in this process")
            time.sleep(self.poll_s)

    def _after_step(self, optimizer, args, kwargs) -> None:
        """Runs after every optimizer step, on the training thread."""
        with self.lock:
            if self.active is not None:
                self._advance()
            elif self.pending is not None:
                self._start(self.pending)
                self.pending = None

    def _start(self, request: dict) -> None:
        torch = self.torch
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        try:
            prof = torch.profiler.profile(activities=activities, record_shapes=bool(request.get("shapes")),
                                          profile_memory=bool(request.get("memory", True)))
            prof.__enter__()
        except Exception as exc:  # noqa: BLE001 - the reason goes back to the agent; training goes on
            self._fail(request, f"torch.profiler could not start: {exc!r}")
            return
        self.active = {"request": request, "prof": prof, "steps": 0, "started": time.monotonic()}
        self._open_step()

    def _open_step(self) -> None:
        # A step runs from one optimizer step's end to the next one's, marked like profiler.step().
        step = self.torch.autograd.profiler.record_function(f"ProfilerStep#{self.active['steps']}")
        step.__enter__()
        self.active["step"] = step

    def _advance(self) -> None:
        active = self.active
        active["step"].__exit__(None, None, None)
        active["steps"] += 1
        request = active["request"]
        steps, duration_ms = request.get("steps"), request.get("duration_ms")
        done = (steps is not None and active["steps"] >= steps) or (
            duration_ms is not None and (time.monotonic() - active["started"]) * 1000 >= duration_ms)
        if done:
            self.active = None
            self._finish(active)
        else:
            self._open_step()

    def _finish(self, active: dict) -> None:
        request = active["request"]
        name = f"{safe_name(request['request_id'])}-{self.pid}"
        try:
            active["prof"].__exit__(None, None, None)
            tmp = self.dir / f".trace-{name}.json.part"
            active["prof"].export_chrome_trace(str(tmp))
            os.replace(tmp, self.dir / f"trace-{name}.json")
        except Exception as exc:  # noqa: BLE001 - as above
            self._fail(request, f"the trace could not be written: {exc!r}")

    def _fail(self, request: dict, reason: str) -> None:
        log.warning("gpufleet profile %s failed: %s", request.get("request_id"), reason)
        name = f"{safe_name(request['request_id'])}-{self.pid}"
        _write_atomically(self.dir / f"error-{name}.txt", reason)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.part")
    tmp.write_text(text)
    os.replace(tmp, path)


_HOOK: _Hook | None = None


def enable(directory: str | Path | None = None, poll_s: float = 0.2) -> None:
    """Let gpufleet's agent profile this process on request (idempotent)."""
    global _HOOK
    if _HOOK is None:
        _HOOK = _Hook(Path(directory) if directory else profile_dir(), poll_s)
