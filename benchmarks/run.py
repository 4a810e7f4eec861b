"""Runs one benchmark and keeps what it printed, with the command, the commit and the date, in
``benchmarks/results/NAME.txt``: the file ``write_docs.py`` makes docs/benchmarks.md from, so
that no figure in the docs is older than the run that measured it.

    python benchmarks/run.py NAME -- python benchmarks/bench_x.py [ARGS...]
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (GPUFLEET_BENCH_RESULTS: elsewhere, for the test of this script)
RESULTS = Path(os.environ.get("GPUFLEET_BENCH_RESULTS") or ROOT / "benchmarks" / "results")


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    name, command = sys.argv[1], sys.argv[3:]
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True,
                            text=True, check=False).stdout.strip() or "unknown"
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        sys.stdout.write(line)
        lines.append(line)
    status = proc.wait()
    if status != 0:
        print(f"{name}: the benchmark failed (exit {status}); its last result is kept", file=sys.stderr)
        return status
    shown = " ".join(Path(c).name if c == sys.executable else c for c in command)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.txt").write_text(
        f"command: {shown}\ncommit: {commit}\ndate: {started}\n"
        f"machine: {platform.machine()}, {_cpus()} CPUs, Python {platform.python_version()}\n\n" + "".join(lines))
    return 0


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


if __name__ == "__main__":
    sys.exit(main())
