"""Maps a GPU process to the workflow it belongs to, from ``/proc/<pid>/environ`` and ``cgroup``.

First the configured environment keys (``GPUFLEET_WORKFLOW_ID``, ``SLURM_JOB_ID``,
``TORCHELASTIC_RUN_ID`` by default, in that order), then the cgroup path: a Slurm job
(``/job_<id>/``) or a Kubernetes pod (``pod<uid>``). Owner and team come from configurable
environment keys too. What cannot be attributed is the workflow ``unattributed``.
Results are cached per process (pid and start time, so a reused pid is looked up again).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from schemas.validate_sample import (  # noqa: F401 - IDLE, UNATTRIBUTED: part of this module's interface
    IDLE,
    UNATTRIBUTED,
    service_error,
)

log = logging.getLogger(__name__)

SLURM_CGROUP = re.compile(r"/job_(\d+)(?:/|$)")
K8S_CGROUP = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
FRAMEWORK_KEYS = (  # environment variables that official containers set
    ("PYTORCH_VERSION", "pytorch"), ("NVIDIA_PYTORCH_VERSION", "pytorch"),
    ("TENSORFLOW_VERSION", "tensorflow"), ("JAX_VERSION", "jax"),
)

# (package directory, start of its native library's path inside it, framework)
FRAMEWORK_LIBRARIES = (
    ("torch", "lib/libtorch", "pytorch"),
    ("tensorflow", "libtensorflow", "tensorflow"),
    ("jaxlib", "", "jax"),
)


@dataclass(frozen=True)
class AttributionKeys:
    workflow: tuple[str, ...] = ("GPUFLEET_WORKFLOW_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
    owner: tuple[str, ...] = ("GPUFLEET_OWNER", "SLURM_JOB_USER", "USER")
    team: tuple[str, ...] = ("GPUFLEET_TEAM", "SLURM_JOB_ACCOUNT")
    model: tuple[str, ...] = ("GPUFLEET_MODEL",)
    service: tuple[str, ...] = ("GPUFLEET_SERVICE",)  # names the service a serving replica's processes serve


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    workflow_id: str
    owner: str | None = None
    team: str | None = None
    scheduler_job_id: str | None = None
    cmdline: str | None = None
    framework: str | None = None
    framework_version: str | None = None
    model: str | None = None
    service: str | None = None  # the service its environment declares it a replica of
    rank: int | None = None  # distributed rank (RANK as torchrun sets it, else SLURM_PROCID)
    qos: str | None = None  # the scheduler's quality of service and partition (Slurm), for the ladders' exemptions
    partition: str | None = None
    source: str = "none"  # how the workflow was found: env:<KEY>, slurm-cgroup, k8s-cgroup, none


def workflow_of_environment(env: dict[str, str], keys: tuple[str, ...] = AttributionKeys.workflow
                            ) -> tuple[str, str] | None:
    """The workflow a process's environment names, and the key that named it; None if none does.
    A Slurm job is ``slurm-<id>`` whether its id comes from here or from the cgroup. The agent
    (for every GPU process) and the profiling hook (announcing its own process) both use it, so
    a profile request finds the ranks of the workflow the agent reported."""
    for key in keys:
        if env.get(key):
            return (slurm_workflow(env) if key == "SLURM_JOB_ID" else env[key]), key
    return None


def slurm_workflow(env: dict[str, str]) -> str:
    """A Slurm job's workflow: ``slurm-<id>``, or ``slurm-<array>_<task>`` for a task of an
    array (its raw ``SLURM_JOB_ID`` is the task's own: the one the scheduler's tools show is
    the array's and the task's), as the prolog names it."""
    array, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
    if array.isdigit() and task.isdigit():
        return f"slurm-{array}_{task}"
    return f"slurm-{env['SLURM_JOB_ID']}"


class ProcessAttributor:
    def __init__(self, keys: AttributionKeys = AttributionKeys(), proc: Path = Path("/proc")) -> None:
        self.keys = keys
        self.proc = proc
        self._cache: dict[tuple[int, str], ProcessInfo] = {}
        self._told_address = False  # (an address in a service's key: logged once)

    def attribute(self, pid: int) -> ProcessInfo:
        start = self._start_time(pid)
        key = (pid, start)
        info = self._cache.get(key)
        if info is None:
            info = self._cache[key] = self._lookup(pid)
        return info

    def forget_except(self, live_pids: set[int]) -> None:
        """Drop cache entries of processes that are gone."""
        self._cache = {k: v for k, v in self._cache.items() if k[0] in live_pids}

    def _lookup(self, pid: int) -> ProcessInfo:
        env = self._environ(pid)
        cgroup = self._read(pid, "cgroup")
        cmdline = self._read(pid, "cmdline").replace("\0", " ").strip() or None
        owner = _first(env, self.keys.owner)
        team = _first(env, self.keys.team)
        framework = version = None
        for key, name in FRAMEWORK_KEYS:
            if env.get(key):
                framework, version = name, env[key]
                break
        else:
            framework, version = self._framework_from_maps(pid)
        job = env.get("SLURM_JOB_ID")
        rank = _first(env, ("RANK", "SLURM_PROCID"))
        service = _first(env, self.keys.service)
        if service is not None and service.startswith(("http://", "https://")):
            # An address is no service's name: it is the owners' service's, which login nodes set up
            # by earlier releases exported for gpufleet's commands as GPUFLEET_SERVICE (GPUFLEET_URL
            # now), and which sbatch hands to every job submitted there.
            if not self._told_address:
                self._told_address = True
                log.info("process %d: %s %r is an address, not a service's name (what a login node exports for "
                         "gpufleet's commands: GPUFLEET_URL now); its workflow is not declared a serving replica",
                         pid, next(k for k in self.keys.service if env.get(k)), service)
            service = None
        if (wrong := service_error(service)) is not None:
            log.warning("process %d: %s; its workflow is not declared a serving replica", pid, wrong)
            service = None
        common = {"owner": owner, "team": team, "cmdline": cmdline, "framework": framework,
                  "framework_version": version, "model": _first(env, self.keys.model),
                  "service": service,
                  "rank": int(rank) if rank is not None and rank.isdigit() else None,
                  "qos": env.get("SLURM_JOB_QOS"), "partition": env.get("SLURM_JOB_PARTITION")}
        found = workflow_of_environment(env, self.keys.workflow)
        if found is not None:
            workflow, key = found
            return ProcessInfo(pid, workflow, scheduler_job_id=job, source=f"env:{key}", **common)
        m = SLURM_CGROUP.search(cgroup)
        if m:
            return ProcessInfo(pid, f"slurm-{m.group(1)}", scheduler_job_id=m.group(1), source="slurm-cgroup", **common)
        m = K8S_CGROUP.search(cgroup)
        if m:
            uid = m.group(1).replace("_", "-")
            return ProcessInfo(pid, f"k8s-pod-{uid}", scheduler_job_id=uid, source="k8s-cgroup", **common)
        return ProcessInfo(pid, UNATTRIBUTED, scheduler_job_id=job, **common)

    def _read(self, pid: int, name: str) -> str:
        try:
            return (self.proc / str(pid) / name).read_bytes().decode(errors="replace")
        except OSError:  # gone, or not ours to read (another user's process)
            return ""

    def _framework_from_maps(self, pid: int) -> tuple[str | None, str | None]:
        """The framework whose native library the process has loaded, and its installed version.

        Most jobs outside the official containers set no version variable, but a process that
        uses a GPU through a framework has that framework's library mapped: the version is in
        the ``<package>-<version>.dist-info`` beside it (read through the process's own root,
        which differs from ours in a container).
        """
        maps = self._read(pid, "maps")
        for line in maps.splitlines():
            path = line.partition("/")[2]
            if not path:
                continue
            path = "/" + path
            for package, library, name in FRAMEWORK_LIBRARIES:
                marker = f"/{package}/{library}"
                if marker in path:
                    site = path[: path.rindex(marker)]
                    return name, self._dist_version(pid, site, package)
        return None, None

    def _dist_version(self, pid: int, site: str, package: str) -> str | None:
        for root in (self.proc / str(pid) / "root", Path("/")):
            try:
                for entry in (root / site.lstrip("/")).glob(f"{package}-*.dist-info"):
                    return entry.name[len(package) + 1: -len(".dist-info")]
            except OSError:
                continue
        return None

    def _environ(self, pid: int) -> dict[str, str]:
        env = {}
        for item in self._read(pid, "environ").split("\0"):
            k, sep, v = item.partition("=")
            if sep:
                env[k] = v
        return env

    def _start_time(self, pid: int) -> str:
        stat = self._read(pid, "stat")
        fields = stat.rpartition(")")[2].split()
        return fields[19] if len(fields) > 19 else ""


def _first(env: dict[str, str], keys: tuple[str, ...]) -> str | None:
    for k in keys:
        if env.get(k):
            return env[k]
    return None
