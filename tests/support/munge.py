"""A real munged for tests, on its own key and socket under a temporary directory that the
test's Unix users can reach (as a site's socket is); ``missing()`` says why none can start."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def _which(name: str) -> str | None:
    return shutil.which(name) or next((str(p) for p in (Path("/usr/sbin", name),) if p.exists()), None)


def missing() -> str | None:
    if os.geteuid() != 0:
        return "munged and the test's Unix users need root"
    absent = [n for n in ("munged", "munge", "unmunge", "useradd", "userdel", "runuser") if _which(n) is None]
    return f"not installed: {', '.join(absent)} (make test installs munge with Slurm)" if absent else None


class Munged:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gpufleet-munge-"))
        self.root.chmod(0o755)
        self.socket = str(self.root / "munge.sock")

    def start(self) -> Munged:
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        subprocess.run([_which("munged"), f"--key-file={key}", f"--socket={self.socket}",
                        f"--log-file={self.root}/munged.log", f"--pid-file={self.root}/munged.pid",
                        f"--seed-file={self.root}/seed", "--force"], check=True, capture_output=True)
        return self

    def stop(self) -> None:
        try:
            os.kill(int((self.root / "munged.pid").read_text().split()[0]), 15)
        except (OSError, ValueError):
            pass
        shutil.rmtree(self.root, ignore_errors=True)


def add_user(name: str) -> bool:
    """Make ``name`` a Unix user unless it is one; True if this made it (userdel it after)."""
    if subprocess.run(["id", name], capture_output=True, check=False).returncode == 0:
        return False
    subprocess.run([_which("useradd"), "--no-create-home", "--shell", "/bin/sh", name], check=True,
                   capture_output=True)
    return True


def remove_user(name: str) -> None:
    subprocess.run([_which("userdel"), name], capture_output=True, check=False)


def as_user(name: str) -> list[str]:
    return [_which("runuser"), "-u", name, "--"]


def _reachable(path: Path) -> bool:
    """Whether any user may run ``path`` (every folder above it open to others)."""
    real = path.resolve()
    return all(p.stat().st_mode & 0o001 for p in real.parents) and bool(real.stat().st_mode & 0o001)


def gpufleet_for_users() -> list[str] | None:
    """How another user runs this checkout's gpufleet, as a login node's users run an installed
    one: this interpreter where they may run it, else the system's Python of the same version
    on this checkout and its packages; None where neither can."""
    import site
    import sys
    import sysconfig

    root = Path(__file__).resolve().parents[2]
    here = Path(sys.executable)
    if _reachable(here):
        return [str(here), "-m", "gpufleet"]
    system = Path("/usr/bin/python3")
    if not system.exists():
        return None
    version = subprocess.run([str(system), "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                             text=True, check=False).stdout.strip()
    if version != str(sys.version_info[:2]):
        return None
    packages = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    if not all(_reachable(Path(p)) for p in packages):
        return None
    return ["env", f"PYTHONPATH={root}:{':'.join(dict.fromkeys(packages))}", str(system), "-m", "gpufleet"]
