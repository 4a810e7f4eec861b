"""A job's process for the Slurm test: it opens some of the GPUs Slurm gave it, or none, for a
while. Which ones, and how busy, it writes to a registry folder (``<pid>.json``) that the
test's fake NVML reads, as a real NVML would see the process on those GPUs."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--registry", type=Path, required=True)
    p.add_argument("--open", choices=["all", "first", "none"], required=True, help="which of its GPUs it opens")
    p.add_argument("--util", type=float, default=80.0)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--exit", type=int, default=0, help="the exit code it ends with (a failed job: not 0)")
    args = p.parse_args()
    gpus = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    opened = {"all": gpus, "first": gpus[:1], "none": []}[args.open]
    print(",".join(gpus), flush=True)  # what Slurm gave it, for the test to read back
    entry = args.registry / f"{os.getpid()}.json"
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # Slurm's cancel: taken below, not fatal
    if opened:
        tmp = entry.with_suffix(".tmp")
        tmp.write_text(json.dumps({"gpus": opened, "util": args.util}))
        os.replace(tmp, entry)
    signal.sigtimedwait({signal.SIGTERM}, args.seconds)  # the job's work: until its time is up or it is cancelled
    entry.unlink(missing_ok=True)
    return args.exit


if __name__ == "__main__":
    sys.exit(main())
