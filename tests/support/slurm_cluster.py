"""A real one-node Slurm for tests: munged, MariaDB with slurmdbd (accounting: QoS, sacct,
AdminComment), slurmctld and slurmd, all under a temporary directory with their own ports,
running gpufleet's shipped prolog and epilog (``docker/slurm``). The node has GPUs as GRES
backed by character device files made for it with ``mknod``; slurmd then gives each job its
own ``SLURM_JOB_GPUS`` and ``CUDA_VISIBLE_DEVICES``. Real Unix users (``useradd``, removed
again by ``stop``) are in its accounting and submit their own jobs (``sbatch(..., user=)``,
through ``runuser``); the cluster's files are readable by them, as a site's are. Needs root and
Debian's ``slurm-wlm``, ``slurmdbd``, ``munge`` and ``mariadb-server`` (``make test`` installs
them where it can); ``missing()`` says what is not there."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from gpufleet.local.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "docker" / "slurm"
DAEMONS = ("munged", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "squeue", "scancel", "sacct", "sacctmgr", "useradd", "userdel", "runuser")


def missing() -> str | None:
    """Why no Slurm can be started here, or None."""
    if os.geteuid() != 0:
        return "a Slurm cluster needs root (slurmd runs jobs as their users)"
    absent = [
        name for name in (*DAEMONS, *CLIENTS) if shutil.which(name) is None and not Path("/usr/sbin", name).exists()
    ]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} missing; make test installs slurm-wlm, slurmdbd, " \
               f"munge and mariadb-server with apt where it can)"
    return None


def _which(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class SlurmCluster:
    def __init__(
        self,
        root: Path,
        gpus: int,
        gpufleet: str,
        allocations_dir: Path,
        partitions: tuple[str, ...] = ("gpu", "exempt"),
        accounts: tuple[str, ...] = ("vision", "ops"),
        users: tuple[str, ...] = (),
    ) -> None:
        self.root, self.gpus, self.gpufleet, self.allocations_dir = root, gpus, gpufleet, allocations_dir
        self.partitions, self.accounts, self.users = partitions, accounts, users
        self.created_users: list[str] = []
        self.node = socket.gethostname()
        self.cluster = "gftest"
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs: list[subprocess.Popen] = []
        self.pids: list[Path] = []

    # -- start and stop -----------------------------------------------------------------------

    def start(self) -> SlurmCluster:
        r = self.root
        for d in ("state", "spool", "log", "run", "munge", "db", "dev", "prolog.d", "epilog.d"):
            (r / d).mkdir(parents=True, exist_ok=True)
        for folder in (r, *r.parents):  # users' clients read slurm.conf and reach munge's socket
            if folder.stat().st_mode & 0o005 != 0o005 and str(folder).startswith(tempfile.gettempdir()):
                folder.chmod(folder.stat().st_mode | 0o005)
        (r / "munge").chmod(0o700)
        for user in self.users:
            if subprocess.run(["id", user], capture_output=True, check=False).returncode != 0:
                self._run([_which("useradd"), "--no-create-home", "--shell", "/bin/sh", user])
                self.created_users.append(user)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for i in range(self.gpus):  # the GPUs' device files: GRES needs files; nothing opens them
            os.mknod(r / "dev" / f"nvidia{i}", 0o600 | 0o020000, os.makedev(195, i))
        self._install_scripts()
        self._write_configs()
        sock = r / "run" / "munge.sock"
        self._run([_which("munged"), f"--key-file={key}", f"--socket={sock}", f"--log-file={r}/log/munged.log",
                   f"--pid-file={r}/run/munged.pid", f"--seed-file={r}/munge/seed", "--force"])
        self.pids.append(r / "run" / "munged.pid")
        self._start_mariadb()
        self._daemon([_which("slurmdbd"), "-D"], "slurmdbd")
        self._wait(lambda: self._ok(["sacctmgr", "-n", "list", "cluster"]), 60, "slurmdbd")
        self._run(["sacctmgr", "-i", "add", "cluster", self.cluster])
        self._run(["sacctmgr", "-i", "add", "qos", "exempt"])
        self._run(["sacctmgr", "-i", "add", "account", ",".join(self.accounts)])
        for user in ("root", *self.users):
            self._run(["sacctmgr", "-i", "add", "user", user, f"account={','.join(self.accounts)}",
                       "qos=normal,exempt"])
        self._daemon([_which("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld")
        self._daemon([_which("slurmd"), "-D", "-f", str(self.conf)], "slurmd")
        self._wait(lambda: "idle" in self._out(["sinfo", "-h", "-o", "%T"]), 60, "the node to be idle")
        return self

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for pid_file in self.pids:
            try:
                os.kill(int(pid_file.read_text().split()[0]), 15)
            except (OSError, ValueError):
                pass
        for user in self.created_users:
            subprocess.run([_which("userdel"), user], capture_output=True, check=False)

    def _install_scripts(self) -> None:
        """gpufleet's prolog and epilog as shipped, with the env file they read beside them."""
        env = (f"GPUFLEET={self.gpufleet}\nGPUFLEET_SLURM_DIR={self.allocations_dir}\n")
        for kind in ("prolog", "epilog"):
            folder = self.root / f"{kind}.d"
            shutil.copy(SHIPPED / f"gpufleet-{kind}.sh", folder / "gpufleet.sh")
            (folder / "gpufleet.sh").chmod(0o755)
            (folder / "gpufleet-slurm.env").write_text(env)

    def _write_configs(self) -> None:
        r, ports = self.root, [free_port() for _ in range(4)]
        self.ctld_port, self.slurmd_port, self.dbd_port, self.db_port = ports
        shipped = (SHIPPED / "slurm.conf.gpufleet").read_text().replace("/etc/slurm", str(r))
        gpus = f"[0-{self.gpus - 1}]" if self.gpus > 1 else "0"
        partitions = "\n".join(f"PartitionName={p} Nodes={self.node} MaxTime=INFINITE State=UP DefMemPerCPU=100"
                               + (" Default=YES" if i == 0 else "") for i, p in enumerate(self.partitions))
        self.conf.write_text(f"""
ClusterName={self.cluster}
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={r}/run/munge.sock
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={self.dbd_port}
AccountingStoragePass={r}/run/munge.sock
AccountingStorageEnforce=associations,qos
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=3600
{shipped}
NodeName={self.node} NodeAddr=127.0.0.1 CPUs=16 RealMemory=8000 Gres=gpu:{self.gpus} State=UNKNOWN
{partitions}
""")
        (r / "gres.conf").write_text(f"NodeName={self.node} Name=gpu File={r}/dev/nvidia{gpus}\n")
        dbd = r / "slurmdbd.conf"
        dbd.write_text(f"""
AuthType=auth/munge
AuthInfo=socket={r}/run/munge.sock
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={self.dbd_port}
SlurmUser=root
LogFile={r}/log/slurmdbd.log
PidFile={r}/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.db_port}
StorageUser=slurm
StoragePass=gpufleet-test
StorageLoc=slurm_acct_db
""")
        dbd.chmod(0o600)

    def _start_mariadb(self) -> None:
        r = self.root
        self._run([_which("mariadb-install-db"), "--no-defaults", f"--datadir={r}/db", "--user=root",
                   "--auth-root-authentication-method=normal", "--skip-test-db"])
        sock = r / "run" / "mysql.sock"
        self._daemon([_which("mariadbd"), "--no-defaults", f"--datadir={r}/db", f"--socket={sock}",
                      f"--port={self.db_port}", "--bind-address=127.0.0.1", "--user=root",
                      f"--pid-file={r}/run/mysql.pid", f"--log-error={r}/log/mariadb.err"], "mariadb")
        self._wait(lambda: self._ok(["mariadb", f"--socket={sock}", "-uroot", "-e", "SELECT 1"]), 60, "MariaDB")
        self._run(["mariadb", f"--socket={sock}", "-uroot", "-e",
                   ("CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'gpufleet-test'; "
                    "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")])

    # -- what tests ask of it -------------------------------------------------------------------

    def sbatch(self, *args: str, user: str | None = None) -> str:
        """A job submitted (as ``user``, where given: a real Unix user's own job); its id."""
        out = self._out([*self.as_user(user), "sbatch", "--parsable", *args])
        return out.strip().split(";")[0]

    def as_user(self, user: str | None) -> list[str]:
        """The prefix that runs a client command as ``user`` (nothing: as root)."""
        return [] if user is None else [_which("runuser"), "-u", user, "--"]

    def scancel(self, job_id: str, user: str | None = None) -> None:
        self._run([*self.as_user(user), "scancel", job_id])

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict of its fields (the one-line form)."""
        line = self._out(["scontrol", "show", "job", "-o", job_id]).strip()
        fields: dict[str, str] = {}
        for token in line.split(" "):
            key, sep, value = token.partition("=")
            if sep and key:
                fields[key] = value
        return fields

    def sacct(self, job_id: str, fields: str) -> str:
        return self._out(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", fields]).strip()

    def accounting(self, job_id: str) -> dict[str, str]:
        """What accounting says of one job (its raw id), times in epoch seconds."""
        fields = ("JobIDRaw", "JobID", "State", "ExitCode", "Start", "End", "User", "Account", "Partition", "QOS")
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", ",".join(fields)],
                             env={**self.env, "SLURM_TIME_FORMAT": "%s"}, capture_output=True, text=True,
                             timeout=60, check=True).stdout
        (row,) = [dict(zip(fields, line.split("|"))) for line in out.splitlines() if line.startswith(f"{job_id}|")]
        return row

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.root / "log" / name
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    # -- plumbing -----------------------------------------------------------------------------

    def _daemon(self, argv: list[str], name: str) -> None:
        log = (self.root / "log" / f"{name}.out").open("ab")
        self.procs.append(subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True))

    def _run(self, argv: list[str]) -> None:
        out = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:4])}: {out.stdout}{out.stderr}")

    def _out(self, argv: list[str]) -> str:
        out = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:4])}: {out.stdout}{out.stderr}")
        return out.stdout

    def _ok(self, argv: list[str]) -> bool:
        try:
            return subprocess.run(argv, env=self.env, capture_output=True, timeout=10, check=False).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def _wait(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return
            except RuntimeError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{what} did not come up in {timeout:g} s:\n{self.log_tail('slurmctld.log')}\n"
                           f"{self.log_tail('slurmd.log')}\n{self.log_tail('slurmdbd.log')}")
