"""Fixture /proc trees for attribution tests, and live stand-in processes."""

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def make_process(proc: Path, pid: int, env: dict[str, str] | None = None, cgroup: str = "0::/user.slice\n",
                 cmdline: str = "python train.py", start_time: int = 1000) -> None:
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in (env or {}).items()) + b"\0")
    (d / "cgroup").write_text(cgroup)
    (d / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")
    fields = ["S"] + ["0"] * 18 + [str(start_time)] + ["0"] * 10
    (d / "stat").write_text(f"{pid} (python) " + " ".join(fields) + "\n")


@contextmanager
def live_process() -> Iterator[subprocess.Popen]:
    """A real process that stays alive until the block ends (it waits on its standard input,
    which closing ends): a stand-in for a training process the profile agent asks."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(30)
