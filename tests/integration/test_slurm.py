"""What a real Slurm allocated, through the whole pipeline: a one-node Slurm (slurmctld, slurmd,
slurmdbd on MariaDB, munge) with 15 GPUs as GRES, gpufleet's shipped prolog and epilog, the agent
as a process of its own reading their records (a fake NVML at the pynvml boundary sees the
processes the jobs start), a worker process, the ClickHouse sink, the enforcer acting with
``scancel`` and the writer of Slurm's AdminComment, on the real broker.

Real Unix users (``ana`` and ``bo`` of this test, made with useradd) submit their own jobs with
``sbatch`` (through ``runuser``), of every end a cluster sees:

====  =====  ==================================================  ===================================
job   user   what it does                                        how it ends
====  =====  ==================================================  ===================================
a     ana    2 GPUs, uses both                                   COMPLETED
b     ana    2 GPUs, uses one                                    COMPLETED (partial use alerted)
c     bo     2 GPUs, opens neither                               CANCELLED by the ladder (root)
d     bo     1 GPU, opens none, in the exempt partition          COMPLETED, exempt
e     bo     1 GPU, opens none, QoS exempt, named $'c\\nd\\x1fe'  COMPLETED, exempt (the name hides nothing)
f     ana    1 GPU, a 2-minute limit, runs on                    TIMEOUT
g     ana    1 GPU, cancelled by its owner after 70 s            CANCELLED by ana
k     ana    1 GPU, exits 3                                      FAILED
h1    bo     2 GPUs, 62 s                                        COMPLETED, its GPUs then go to h2
h2    bo     2 GPUs, after h1 (the only GPUs free then)          COMPLETED
arr   ana    an array of 2 tasks of 1 GPU                        COMPLETED, each its own workflow
====  =====  ==================================================  ===================================

The agent is killed (SIGKILL) 20 s into the jobs and started again 20 s later. Every job's
GPU-seconds (observed and unobserved) hold GPUs x Slurm's Elapsed within 0.1 %, its summary's
start and end are Slurm's to the second, its end state is Slurm's, and no alert of an ended
job is left firing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from gpufleet.reports.workflows import slurm_job, workflow_summary
from kafka_client.config import consumer_config
from schemas.codec import Codec
from schemas.goodput_buckets import BUCKETS
from schemas.topics import WORKFLOW_SUMMARIES
from sinks.enforce_jobs import Enforcer
from sinks.job_report import job_report, right_size_of
from sinks.slurm_comments import SlurmComments
from streams.enforcement.ladder import load_ladders
from tests.support.integration import print_log_tail, running_sink, wait_until, worker_process
from tests.support.slurm_cluster import SlurmCluster, missing
from tests.support.slurm_gpus import JobGpus

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")

GPUS = 15
ANA, BO = "gf-ana", "gf-bo"  # the Unix users of this test
WINDOW_S, DETECTOR_MIN_S, ACTION_MIN, STARTUP_S = 10, 20, 2.5, 10
OUTAGE_S = 20
GPU_JOB = Path(__file__).with_name("gpu_job.py")
PYTHON = "/usr/bin/python3"  # the job's interpreter as its user runs it (the tests' own lives under /root)
HOSTILE = "c\nd\x1fe"


@pytest.fixture(scope="module")
def shared():
    """A folder the users' jobs can write (their output, the registry of what they opened)."""
    path = Path(tempfile.mkdtemp(prefix="gpufleet-slurm-jobs-"))
    path.chmod(0o1777)
    (path / "registry").mkdir()
    (path / "registry").chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm():
    root = Path(tempfile.mkdtemp(prefix="gpufleet-slurm-"))
    cluster = SlurmCluster(root / "cluster", GPUS, str(Path(sys.executable).with_name("gpufleet")), root / "alloc",
                           users=(ANA, BO))
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # for scancel and sacctmgr run by the enforcer and the writer
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        shutil.rmtree(root, ignore_errors=True)


def policy(path: Path) -> Path:
    path.write_text(f"""
[[ladder]]
name = "idle-gpus"
detector = "idle_allocated"
first_warning_min = 0.5
second_warning_min = 1.0
action_min = {ACTION_MIN}
command = ["scancel", "{{scheduler_job_id}}"]
act = true
exempt_partitions = ["exempt"]
exempt_qos = ["exempt"]
""")
    return path


class Agent:
    """The node's agent as its own process: started, killed with SIGKILL, started again."""

    def __init__(self, slurm: SlurmCluster, shared: Path, tmp_path: Path, bootstrap: str, prefix: str) -> None:
        self.argv = [sys.executable, "-m", "tests.support.slurm_agent", "--registry", str(shared / "registry"),
                     "--allocations", str(slurm.allocations_dir), "--spool", str(tmp_path / "spool"),
                     "--bootstrap", bootstrap, "--prefix", prefix, "--host", slurm.node, "--cluster", slurm.cluster,
                     "--gpus", str(GPUS)]
        self.log = tmp_path / "agent.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
                                     cwd=Path(__file__).parents[2], stdin=subprocess.DEVNULL)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def published_at(bootstrap: str, topic: str) -> dict[str, int]:
    """Each summary's workflow and when it was published (the broker's timestamp, ms)."""
    c = Consumer(consumer_config(bootstrap, "test-summaries"))
    codec, out = Codec(), {}
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        for m in c.consume(num_messages=10_000, timeout=3):
            if not m.error():
                out.setdefault(codec.decode(m.value())[1]["workflow_id"], m.timestamp()[1])
    finally:
        c.close()
    return out


def coverage(client, database: str, workflow_id: str, start_ms: int, end_ms: int) -> dict:
    """A job's stored samples per GPU against its allocation: the spans between start and end that
    no sample covers (where, how long) and those covered twice, in ms; the unobserved windows."""
    rows = client.query(f"SELECT gpu_uuid, toUnixTimestamp64Milli(event_time) AS t, interval_ms "
                        f"FROM {database}.gpu_samples WHERE workflow_id = {{wf:String}} ORDER BY gpu_uuid, t",
                        parameters={"wf": workflow_id}).result_rows
    out: dict = {}
    for uuid in sorted({r[0] for r in rows}):
        edge, holes = start_ms, []
        for _, t, interval in (r for r in rows if r[0] == uuid):
            if t - interval != edge:
                holes.append((edge, t - interval - edge))  # > 0: no sample; < 0: counted twice
            edge = t
        if edge != end_ms:
            holes.append((edge, end_ms - edge))
        out[uuid] = holes
    out["unobserved"] = client.query(
        f"SELECT toUnixTimestamp64Milli(window_start), unobserved_gpu_seconds FROM {database}.workflow_windows FINAL "
        f"WHERE workflow_id = {{wf:String}} AND unobserved_gpu_seconds > 0 ORDER BY 1",
        parameters={"wf": workflow_id}).result_rows
    return out


NAMES = ["tab\there", "quote'\"s", "$(id) `id`", "pipe|exempt|N/A", "x" * 300, "é训练" * 40, "a\nb\nc", "\x1f\x1e\x1d",
         "12|12|N/A|N/A|gf-bo|ops|gpu|normal|UNLIMITED|0|0|RUNNING|None|n"]


def test_the_prolog_reads_every_name_a_user_can_give(slurm, shared):
    """The shipped prolog, on the real Slurm, for a real user's jobs of an exempt QoS with every
    kind of name (and one of bytes that are no UTF-8): each record has the QoS, the account and
    the name, and names nothing unknown."""
    from producers.agent.allocations.slurm import ENDED, JOBS, SlurmAllocations, SlurmDirectory

    def submit(name: str | bytes) -> str:
        argv = [*slurm.as_user(BO), "sbatch", "--parsable", "-c", "1", "-A", "ops", "--qos", "exempt",
                "-o", "/dev/null", "--chdir", str(shared), b"--job-name=" + (name if isinstance(name, bytes)
                                                                            else name.encode()), "--wrap", "sleep 300"]
        out = subprocess.run(argv, env=slurm.env, capture_output=True, timeout=60, check=True)
        return out.stdout.decode().strip().split(";")[0]

    ids = {submit(name): name for name in [*NAMES, b"\xff\xfe-bytes"]}
    directory = SlurmDirectory(slurm.allocations_dir)
    try:
        def recorded():
            got = {a.job_id: a for a in directory.records(JOBS)}
            return got if set(ids) <= set(got) else None

        records = wait_until(recorded, 60, "every job's prolog record")
        for job, name in ids.items():
            a = records[job]
            assert (a.qos, a.team, a.owner, a.partition, a.unknown) == ("exempt", "ops", BO, "gpu", ()), (name, a)
            want = name if isinstance(name, str) else name.decode("utf-8", "backslashreplace")
            assert a.name == want, (a.name, want)
            assert a.started_ms is not None and a.workflow_id == f"slurm-{job}"
    finally:
        for job in ids:
            slurm.scancel(job)
        wait_until(lambda: not set(ids) & {a.job_id for a in directory.records(JOBS)}, 60, "their epilogs")
        source = SlurmAllocations(slurm.allocations_dir)
        source.forget(directory.records(ENDED))  # (no agent here to spool them)


def test_what_slurm_allocated_is_what_gpufleet_measures_alerts_and_acts_on(slurm, shared, kafka, prefix, tmp_path,
                                                                            chdb_client, database):
    agent = Agent(slurm, shared, tmp_path, kafka.bootstrap, prefix)
    stop = threading.Event()
    ladders = load_ladders(policy(tmp_path / "enforcement.toml"))
    enforcer = Enforcer(kafka.bootstrap, ladders, act=True, group_id=f"{prefix}enforcer", topic_prefix=prefix)
    comments = SlurmComments(kafka.bootstrap, group_id=f"{prefix}slurm", topic_prefix=prefix, cluster=slurm.cluster)
    threads = [threading.Thread(target=enforcer.run, args=(stop,), daemon=True),
               threading.Thread(target=comments.run, args=(stop,), daemon=True)]
    options = ("--window-s", str(WINDOW_S), "--lateness-s", "2", "--detector-min-s", str(DETECTOR_MIN_S),
               "--startup-max-s", str(STARTUP_S), "--enforcement", str(tmp_path / "enforcement.toml"),
               "--no-periodic-profiles", "--idle-partition-s", "5")
    with worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker", *options), \
            running_sink(kafka.bootstrap, prefix, chdb_client, database):
        agent.start()
        for t in threads:
            t.start()
        try:
            def job(user: str, gpus: int, opens: str, seconds: float, *more: str, exit_code: int = 0) -> str:
                return slurm.sbatch(f"--gres=gpu:{gpus}", "-c", "1", "-o", str(shared / "slurm-%j.out"),
                                    "--chdir", str(shared), *more, "--wrap",
                                    f"{PYTHON} {GPU_JOB} --registry {shared / 'registry'} --open {opens} "
                                    f"--seconds {seconds} --exit {exit_code}", user=user)

            ids = {
                "h1": job(BO, 2, "all", 62, "-A", "vision"),
                "a": job(ANA, 2, "all", 75, "-A", "vision"),
                "b": job(ANA, 2, "first", 75, "-A", "vision"),
                "c": job(BO, 2, "none", 900, "-A", "vision"),
                "d": job(BO, 1, "none", 150, "-A", "ops", "-p", "exempt"),
                "e": job(BO, 1, "none", 150, "-A", "ops", "--qos", "exempt", f"--job-name={HOSTILE}"),
                "f": job(ANA, 1, "all", 900, "-A", "vision", "--time", "2"),
                "g": job(ANA, 1, "all", 900, "-A", "vision"),
                "k": job(ANA, 1, "all", 70, "-A", "vision", exit_code=3),
                "arr": job(ANA, 1, "all", 65, "-A", "vision", "--array", "0-1"),
            }
            ids["h2"] = job(BO, 2, "all", 65, "-A", "vision", "--dependency", f"afterany:{ids['h1']}")
            first = [k for k in ids if k not in ("h2", "arr")]
            wait_until(lambda: all(slurm.job(ids[k])["JobState"] == "RUNNING" for k in first), 60, "the jobs to run")
            stop.wait(OUTAGE_S)
            agent.kill()  # kill -9: what it held is lost, its checkpoint stays
            stop.wait(OUTAGE_S)
            agent.start()
            wait_until(lambda: slurm.job(ids["g"])["RunTime"] >= "00:01:10", 120, "job (g) to run 70 s")
            slurm.scancel(ids["g"], user=ANA)  # its owner cancels it
            arr = [f"{ids['arr']}_0", f"{ids['arr']}_1"]
            everything = [ids[k] for k in ids if k != "arr"] + arr
            wait_until(lambda: all(slurm.job(j)["JobState"] in ("COMPLETED", "CANCELLED", "TIMEOUT", "FAILED")
                                   for j in everything), 600, "every job to end")
            workflows = {k: f"slurm-{ids[k]}" for k in ids if k != "arr"} | {
                f"arr_{i}": f"slurm-{arr[i]}" for i in (0, 1)}

            def summaries():
                rows = chdb_client.query(f"SELECT * FROM {database}.workflow_summaries FINAL").named_results()
                got = {r["workflow_id"]: r for r in rows}
                return got if all(wf in got for wf in workflows.values()) else None

            stored = wait_until(summaries, 90, "every job's summary in ClickHouse")
            wait_until(lambda: all(slurm.sacct(ids[k], "AdminComment").startswith("gpufleet:")
                                   for k in ("a", "c", "e", "g", "k")), 90, "the efficiency lines in accounting")
        except BaseException:
            print_log_tail(agent.log)
            raise
        finally:
            stop.set()
            agent.stop()
            for t in threads:
                t.join(30)

    accounting = {k: slurm.accounting(ids[k]) for k in ids if k != "arr"}
    for i in (0, 1):  # an array's tasks each have their own raw id
        (task,) = [slurm.accounting(line.split("|")[0]) for line in
                   slurm.sacct(ids["arr"], "JobIDRaw,JobID").splitlines() if line.endswith(f"_{i}")]
        accounting[f"arr_{i}"] = task
    gpus = {"a": 2, "b": 2, "c": 2, "d": 1, "e": 1, "f": 1, "g": 1, "k": 1, "h1": 2, "h2": 2, "arr_0": 1, "arr_1": 1}
    users = {"a": ANA, "b": ANA, "c": BO, "d": BO, "e": BO, "f": ANA, "g": ANA, "k": ANA, "h1": BO, "h2": BO,
             "arr_0": ANA, "arr_1": ANA}

    # Owner and team are Slurm's user and account; the start and end are Slurm's, to its second.
    for k, wf in workflows.items():
        s, acct = stored[wf], accounting[k]
        assert (s["owner"], s["team"]) == (users[k], acct["Account"]), k
        assert int(s["allocated_at"].timestamp() * 1000) == int(acct["Start"]) * 1000, k
        assert int(s["ended_at"].timestamp() * 1000) == int(acct["End"]) * 1000, k
    # Every GPU-second once: observed + unobserved = GPUs x Slurm's Elapsed, within 0.1 %.
    ratios, unseen = {}, {}
    for k, wf in workflows.items():
        s, elapsed = stored[wf], int(accounting[k]["End"]) - int(accounting[k]["Start"])
        assert elapsed >= 60, (k, elapsed)
        assert sum(s[f"{b}_gpu_seconds"] for b in BUCKETS) == pytest.approx(s["gpu_seconds"], rel=1e-9), k
        ratios[k] = s["gpu_seconds"] / (gpus[k] * elapsed)
        unseen[k] = s["unobserved_gpu_seconds"] / gpus[k]
    print("GPU-seconds / (GPUs x Slurm's Elapsed):", {k: round(r, 5) for k, r in ratios.items()})
    print("unobserved seconds per GPU:", {k: round(u, 1) for k, u in unseen.items()})
    off = [k for k, r in ratios.items() if abs(r - 1) > 0.001]
    for k in off:  # where the time went missing or was counted twice: the stored samples, GPU by GPU
        print(k, coverage(chdb_client, database, workflows[k], int(accounting[k]["Start"]) * 1000,
                          int(accounting[k]["End"]) * 1000))
    assert not off, ratios
    # The agent's outage is the jobs' unobserved time, no more (what it held when killed: at most 5 s).
    for k in ("a", "b", "c", "d", "e", "f", "g", "k", "h1"):
        assert OUTAGE_S - 2 <= unseen[k] <= OUTAGE_S + 7, (k, unseen[k])
    # The agent that started again continued its jobs: one STARTED per job.
    started = chdb_client.query(f"SELECT workflow_id, count() FROM {database}.workflow_events FINAL "
                                "WHERE event = 'STARTED' GROUP BY workflow_id").result_rows
    assert all(n == 1 for wf, n in started if wf in workflows.values()), started
    # How each ended, as Slurm says: in the summary, the job report and AdminComment.
    ends = {k: (stored[wf]["end_state"], stored[wf]["cancelled_by"], stored[wf]["exit_code"])
            for k, wf in workflows.items()}
    assert ends["a"] == ends["h2"] == ends["arr_0"] == ("COMPLETED", None, 0)
    assert ends["c"] == ("CANCELLED", "root", 0) and ends["g"] == ("CANCELLED", ANA, 0)
    assert ends["f"][0] == "TIMEOUT" and ends["k"] == ("FAILED", None, 3)
    assert "ended cancelled by root" in slurm.sacct(ids["c"], "AdminComment")
    assert "ended failed (exit code 3)" in slurm.sacct(ids["k"], "AdminComment")
    # Each job's summary was published within 15 s of its end.
    published = published_at(kafka.bootstrap, prefix + WORKFLOW_SUMMARIES.name)
    delays = {k: (published[wf] - int(accounting[k]["End"]) * 1000) / 1000 for k, wf in workflows.items()}
    print("summary published after the job's end (s):", delays)
    assert all(0 <= delay <= 15 for delay in delays.values()), delays

    alerts = chdb_client.query(f"SELECT workflow_id, detector, message FROM {database}.alert_transitions FINAL "
                               "WHERE status = 'FIRING'").result_rows
    fired = {(wf, detector) for wf, detector, _ in alerts}
    assert (workflows["c"], "idle_allocated") in fired and (workflows["e"], "idle_allocated") in fired
    assert not [x for x in fired if x[0] == workflows["a"]]  # (a) used both: nothing to say
    # No alert of an ended job is left firing: each resolved when it ended, with the reason.
    last = chdb_client.query(f"SELECT workflow_id, alert_id, status, message FROM {database}.alerts FINAL").result_rows
    assert all(status == "RESOLVED" for wf, _, status, _ in last if wf in workflows.values()), last
    assert any("the workflow ended (slurm: CANCELLED by root)" in m for wf, _, _, m in last if wf == workflows["c"])
    # (b): the GPU it never opened, named as NVML knows it (Slurm's second GPU of the job).
    unused = (shared / f"slurm-{ids['b']}.out").read_text().split()[0].split(",")[1]  # its CUDA_VISIBLE_DEVICES
    nvml_index = next(i for i, g in enumerate(JobGpus(shared, GPUS).gpus) if g.minor == int(unused))
    sizes = [(r["kind"], r["current"], r["recommended"]) for r in right_size_of(stored[workflows["b"]])]
    assert ("gpu_count", "2 GPUs", "1 GPUs") in sizes, sizes
    partial = [m for wf, detector, m in alerts if (wf, detector) == (workflows["b"], "partial_use")]
    assert partial and f"no process of the job ever opened them: {slurm.node}/gpu{nvml_index}." in partial[0], alerts
    # The ladder cancelled (c) with scancel, and only (c): (d) is in an exempt partition, and (e)
    # of an exempt QoS, which its name (a newline, a unit separator) no longer hides.
    steps = chdb_client.query(f"SELECT workflow_id, step, reason FROM {database}.enforcement FINAL").result_rows
    assert (workflows["c"], "ACTED") in {(wf, s) for wf, s, _ in steps}
    exempt = {wf: r for wf, s, r in steps if s == "EXEMPT"}
    assert exempt[workflows["d"]].startswith("partition exempt")
    assert exempt[workflows["e"]].startswith("quality of service exempt")
    assert not [s for wf, s, _ in steps if wf in (workflows["d"], workflows["e"]) and s in ("ACTION_DUE", "ACTED")]
    assert accounting["e"]["State"] == "COMPLETED" and accounting["c"]["State"].startswith("CANCELLED")
    # A GPU handed from h1 to h2 is charged to one at a time.
    handed = (shared / f"slurm-{ids['h1']}.out").read_text().split()[0]
    assert (shared / f"slurm-{ids['h2']}.out").read_text().split()[0] == handed  # the same GPUs (the only free)
    spans = chdb_client.query(f"""
        SELECT workflow_id, gpu_uuid, min(toUnixTimestamp64Milli(event_time) - interval_ms),
               max(toUnixTimestamp64Milli(event_time))
        FROM {database}.gpu_samples WHERE workflow_id IN %(jobs)s GROUP BY workflow_id, gpu_uuid""",
        parameters={"jobs": [workflows["h1"], workflows["h2"]]}).result_rows
    for uuid in {u for _, u, _, _ in spans}:
        (h1_end,) = [end for wf, u, _, end in spans if u == uuid and wf == workflows["h1"]]
        (h2_begin,) = [begin for wf, u, begin, _ in spans if u == uuid and wf == workflows["h2"]]
        assert h1_end <= h2_begin, (uuid, h1_end, h2_begin)
    # The job report, as `gpufleet job ID` prints it; an array by its id lists its tasks.
    summary, cluster = workflow_summary(chdb_client, database, workflows["c"])
    text, _ = job_report(summary, cluster=cluster)
    assert text.startswith(f"gpufleet job report: {workflows['c']}") and f"owner {BO}, team vision" in text
    assert "ended: slurm: CANCELLED by root" in text and "unobserved (no agent sampled)" in text
    workflow, tasks = slurm_job(chdb_client, database, ids["arr"])
    assert workflow is None and [t[0] for t in tasks] == [workflows["arr_0"], workflows["arr_1"]]
    assert slurm_job(chdb_client, database, accounting["arr_0"]["JobIDRaw"])[0] == workflows["arr_0"]
