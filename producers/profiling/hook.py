"""The in-process half of on-demand profiling: one line in a training script,

    import producers.profiling.hook; producers.profiling.hook.enable()

and the host agent can make this process capture a ``torch.profiler`` trace (CPU and CUDA
activities) for a number of optimizer steps or seconds. The hook counts steps through
PyTorch's global optimizer post-step hook, so the training loop needs no other change; it
marks each step (``ProfilerStep#N``, from one optimizer step's end to the next) as the
trace analysis expects.

It talks to the agent through files in a private profile directory, which needs no network
and no port: ``producers.profiling.handoff`` is that protocol, on both sides. The hook names its
workflow by the agent's own rules (``producers.agent.gpus.attribute_process.workflow_of_environment``),
so a Slurm job is ``slurm-<id>`` to both.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from producers.agent.gpus.attribute_process import workflow_of_environment
from producers.profiling.handoff import Handoff, default_dir

log = logging.getLogger(__name__)


def profile_dir() -> Path:
    """The profile directory this process and its host agent share (``GPUFLEET_PROFILE_DIR``)."""
    return default_dir()


class _Hook:
    def __init__(self, directory: Path, poll_s: float) -> None:
        import torch  # the optional 'profiling' extra

        self.torch = torch
        self.handoff = Handoff(directory)
        self.poll_s = poll_s
        self.pid = os.getpid()
        self.rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
        self.pending: dict | None = None
        self.active: dict | None = None
        self.lock = threading.Lock()
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(self._after_step)
        threading.Thread(target=self._watch, name="gpufleet-profile-hook", daemon=True).start()
        # Announced last: an agent never asks a hook that is not listening yet.
        found = workflow_of_environment(dict(os.environ))
        self.handoff.announce(self.pid, self.rank, found[0] if found else None, torch=torch.__version__,
                              cuda=torch.cuda.is_available())

    def _watch(self) -> None:
        while True:
            request = self.handoff.take_request(self.pid)
            if request is not None:
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
            # FLOPs of matmuls and convolutions for model FLOPs utilisation (they need the shapes,
            # which also give each operator's input precision).
            flops = bool(request.get("flops", True))
            prof = torch.profiler.profile(activities=activities,
                                          record_shapes=bool(request.get("shapes")) or flops, with_flops=flops,
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
        try:
            active["prof"].__exit__(None, None, None)
            active["prof"].export_chrome_trace(str(self.handoff.trace_part(request["request_id"], self.pid)))
            self.handoff.trace_done(request["request_id"], self.pid)
        except Exception as exc:  # noqa: BLE001 - as above
            self._fail(request, f"the trace could not be written: {exc!r}")

    def _fail(self, request: dict, reason: str) -> None:
        log.warning("gpufleet profile %s failed: %s", request.get("request_id"), reason)
        self.handoff.fail(str(request.get("request_id")), self.pid, reason)


_HOOK: _Hook | None = None


def enable(directory: str | Path | None = None, poll_s: float = 0.2) -> None:
    """Let gpufleet's agent profile this process on request (idempotent)."""
    global _HOOK
    if _HOOK is None:
        _HOOK = _Hook(Path(directory) if directory else profile_dir(), poll_s)


def report_memory(directory: str | Path | None = None) -> None:
    """Tell gpufleet's agent the peaks of PyTorch's CUDA allocator in this process (over every
    GPU it uses: ``torch.cuda.max_memory_allocated`` and ``max_memory_reserved``), so that
    right-sizing judges the memory the job needs, not what the caching allocator reserved up
    front (which is what NVML sees). Call it every few steps, or once near the end; a report
    counts for five minutes. Does nothing where CUDA was never initialised in this process."""
    import torch

    if not torch.cuda.is_initialized():
        return
    devices = range(torch.cuda.device_count())
    peak = sum(int(torch.cuda.max_memory_allocated(d)) for d in devices)
    reserved = sum(int(torch.cuda.max_memory_reserved(d)) for d in devices)
    Handoff(Path(directory) if directory else profile_dir()).report_memory(os.getpid(), peak, reserved, time.time())


def report_throughput(model_tflops: float | None = None, *, tokens_per_s: float | None = None,
                      params: float | None = None, directory: str | Path | None = None) -> None:
    """Tell gpufleet's agent how much model work this process does, for its model FLOPs
    utilisation: either ``model_tflops`` (the job's own FLOPs per second / 1e12), or the
    tokens this process trains on per second and the model's parameter count, from which it
    is 6 x parameters x tokens/s (a dense transformer's forward and backward pass, as MFU is
    usually defined). Call it every few seconds or steps; the agent puts it on the samples of
    the process's GPUs and drops it when it is a minute old. Needs no torch and no enable()."""
    if model_tflops is None:
        if tokens_per_s is None or params is None:
            raise ValueError("give model_tflops, or tokens_per_s and params")
        model_tflops = 6.0 * params * tokens_per_s / 1e12
    if not 0.0 <= model_tflops < float("inf"):
        raise ValueError(f"model_tflops must be a number >= 0, not {model_tflops!r}")
    Handoff(Path(directory) if directory else profile_dir()).report_throughput(os.getpid(), model_tflops,
                                                                                time.time())
