"""What a real Slurm allocated, through the whole pipeline: a one-node Slurm (slurmctld, slurmd,
slurmdbd on MariaDB, munge) with 8 GPUs as GRES, gpufleet's shipped prolog and epilog, the agent
reading their records (with a fake NVML at the pynvml boundary that sees the processes the jobs
start), a worker process, the ClickHouse sink, the enforcer acting with ``scancel`` and the
writer of Slurm's AdminComment, on the real broker.

Four real ``sbatch`` jobs of 2 GPUs each: (a) uses both, (b) uses one of its two, (c) opens
neither (CPU-only code), (d) like (c) in a partition the enforcement ladder exempts."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from gpufleet.enforcer import Enforcer
from gpufleet.workflows import workflow_summary
from kafka_client.config import consumer_config
from producers.attribute_process import ProcessAttributor
from producers.forward_spool import Forwarder
from producers.host_agent import AgentSettings, HostAgent
from producers.run_agent import run_agent
from producers.sample_nvml import NvmlSampler
from producers.slurm_allocations import SlurmAllocations, slurm_time_ms
from producers.spool import Spool
from schemas.codec import Codec
from schemas.goodput_buckets import BUCKETS
from schemas.topics import WORKFLOW_SUMMARIES
from sinks.job_report import job_report
from sinks.slurm_comments import SlurmComments
from streams.enforcement.ladder import load_ladders
from tests.support.fake_nvml import FakeGpu, FakeNvml, FakeProcess
from tests.support.integration import running_sink, wait_until, worker_process
from tests.support.slurm_cluster import SlurmCluster, missing

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")

GPUS = 8
JOB_S = 200  # each job's work; (c) is cancelled before by the ladder
WINDOW_S, DETECTOR_MIN_S, ACTION_MIN = 10, 20, 2.5
GPU_JOB = Path(__file__).with_name("gpu_job.py")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm")
    cluster = SlurmCluster(root / "cluster", GPUS, str(Path(sys.executable).with_name("gpufleet")), root / "alloc")
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


class JobGpus:
    """The fake GPUs as the jobs' processes use them: each registry entry (a live pid) opens the
    GPUs Slurm named to it (its CUDA_VISIBLE_DEVICES: Slurm's indexes, in the order of the
    device files), which NVML knows by minor number; NVML's own order differs."""

    def __init__(self, registry: Path) -> None:
        self.registry = registry
        # NVML index i has minor number MINOR[i]: Slurm's GPU 0 is NVML's GPU 1, and so on.
        minors = [1, 0, 3, 2, 5, 4, 7, 6]
        self.gpus = [FakeGpu(f"GPU-{i:02d}-{minors[i]}", util=0, mem_used=0, minor=minors[i], processes=[])
                     for i in range(GPUS)]
        self.by_minor = {g.minor: g for g in self.gpus}

    def refresh(self) -> None:
        for g in self.gpus:
            g.processes, g.util, g.mem_used = [], 0, 0
        for entry in self.registry.glob("*.json"):
            pid = int(entry.stem)
            try:
                os.kill(pid, 0)
                opened = json.loads(entry.read_text())
            except (OSError, ValueError):
                continue  # gone, or being written
            for index in opened["gpus"]:
                g = self.by_minor[int(index)]
                g.processes.append(FakeProcess(pid, sm_util=int(opened["util"])))
                g.util, g.mem_used = int(opened["util"]), g.mem_used + (48 << 30)  # 60 % of an 80 GB GPU


class Sampler(NvmlSampler):
    def __init__(self, jobs: JobGpus) -> None:
        super().__init__(FakeNvml(jobs.gpus))
        self.jobs = jobs

    def tick(self):
        self.jobs.refresh()
        return super().tick()


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
""")
    return path


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


def test_what_slurm_allocated_is_what_gpufleet_measures_alerts_and_acts_on(slurm, kafka, prefix, tmp_path,
                                                                            chdb_client, database):
    registry = tmp_path / "registry"
    registry.mkdir()
    jobs = JobGpus(registry)
    agent = HostAgent(AgentSettings(slurm.node, interval_s=1.0, cluster=slurm.cluster, topic_prefix=prefix),
                      Spool(tmp_path / "spool"),
                      Codec(), nvml=Sampler(jobs), attributor=ProcessAttributor(),
                      allocations=SlurmAllocations(slurm.allocations_dir))
    agent.nvml.open()
    stop = threading.Event()
    threads = [threading.Thread(target=run_agent, args=(agent, Forwarder(agent.spool, kafka.bootstrap,
                                                                         send_every_s=1.0), stop), daemon=True)]
    ladders = load_ladders(policy(tmp_path / "enforcement.toml"))
    enforcer = Enforcer(kafka.bootstrap, ladders, act=True, group_id=f"{prefix}enforcer", topic_prefix=prefix)
    comments = SlurmComments(kafka.bootstrap, group_id=f"{prefix}slurm", topic_prefix=prefix, cluster=slurm.cluster)
    threads += [threading.Thread(target=enforcer.run, args=(stop,), daemon=True),
                threading.Thread(target=comments.run, args=(stop,), daemon=True)]
    options = ("--window-s", str(WINDOW_S), "--lateness-s", "2", "--detector-min-s", str(DETECTOR_MIN_S),
               "--enforcement", str(tmp_path / "enforcement.toml"), "--no-periodic-profiles", "--idle-partition-s", "5")
    with worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker", *options), \
            running_sink(kafka.bootstrap, prefix, chdb_client, database):
        for t in threads:
            t.start()
        try:
            def job(account: str, partition: str, opens: str) -> str:
                return slurm.sbatch("--gres=gpu:2", "-c", "1", "-A", account, "-p", partition,
                                    "-o", str(tmp_path / "slurm-%j.out"),
                                    "--wrap", f"{sys.executable} {GPU_JOB} --registry {registry} --open {opens} "
                                              f"--seconds {JOB_S}")

            a, b, c = job("vision", "gpu", "all"), job("vision", "gpu", "first"), job("vision", "gpu", "none")
            d = job("ops", "exempt", "none")
            ids = {"a": a, "b": b, "c": c, "d": d}
            wait_until(lambda: slurm.job(c)["JobState"] == "CANCELLED", JOB_S + 60, "the ladder to scancel job (c)")
            d_when_c_ended = slurm.job(d)["JobState"]
            wait_until(lambda: all(slurm.job(j)["JobState"] in ("COMPLETED", "CANCELLED") for j in ids.values()),
                       JOB_S + 60, "every job to end")

            def summaries():
                rows = chdb_client.query(f"SELECT * FROM {database}.workflow_summaries FINAL").named_results()
                got = {r["workflow_id"]: r for r in rows}
                return got if all(f"slurm-{j}" in got for j in ids.values()) else None

            stored = wait_until(summaries, 60, "the four jobs' summaries in ClickHouse")
            wait_until(lambda: all(slurm.sacct(j, "AdminComment").startswith("gpufleet:") for j in ids.values()),
                       60, "the efficiency lines in Slurm's accounting")
        finally:
            stop.set()
            for t in threads:
                t.join(30)

    info = {k: slurm.job(j) for k, j in ids.items()}
    # Owner and team are Slurm's user and account.
    for k, j in ids.items():
        s = stored[f"slurm-{j}"]
        assert (s["owner"], s["team"]) == (info[k]["UserId"].split("(")[0], info[k]["Account"]), k
    # Every job's buckets sum to its GPUs x its run time as Slurm reports it, within 1 %.
    ratios = {}
    for k, j in ids.items():
        s, run_s = (
            stored[f"slurm-{j}"],
            (slurm_time_ms(info[k]["EndTime"]) - slurm_time_ms(info[k]["StartTime"])) / 1000,
        )
        assert sum(s[f"{b}_gpu_seconds"] for b in BUCKETS) == pytest.approx(s["gpu_seconds"], rel=1e-9), k
        ratios[k] = s["gpu_seconds"] / (2 * run_s)
    print("GPU-seconds / (GPUs x Slurm's run time):", {k: round(r, 4) for k, r in ratios.items()})
    assert all(abs(r - 1) <= 0.01 for r in ratios.values()), ratios
    # Each job's summary was published within 15 s of its end.
    published = published_at(kafka.bootstrap, prefix + WORKFLOW_SUMMARIES.name)
    delays = {k: (published[f"slurm-{j}"] - slurm_time_ms(info[k]["EndTime"])) / 1000 for k, j in ids.items()}
    print("summary published after the job's end (s):", delays)
    assert all(0 <= delay <= 15 for delay in delays.values()), delays

    alerts = chdb_client.query(f"SELECT workflow_id, detector, message, window_end, since FROM {database}.alerts FINAL "
                               "WHERE status = 'FIRING'").result_rows
    fired = {(wf, detector) for wf, detector, *_ in alerts}
    assert (f"slurm-{c}", "idle_allocated") in fired and (f"slurm-{d}", "idle_allocated") in fired
    assert not [x for x in fired if x[0] == f"slurm-{a}"]  # (a) used both: nothing to say
    # (b): the GPU it never opened, named as NVML knows it (Slurm's second GPU of the job).
    unused = (tmp_path / f"slurm-{b}.out").read_text().split()[0].split(",")[1]  # its CUDA_VISIBLE_DEVICES
    nvml_index = next(i for i, g in enumerate(jobs.gpus) if g.minor == int(unused))
    from sinks.job_report import right_size_of  # a stored row's records come as tuples or dicts

    sizes = [(r["kind"], r["current"], r["recommended"]) for r in right_size_of(stored[f"slurm-{b}"])]
    assert ("gpu_count", "2 GPUs", "1 GPUs") in sizes, sizes
    partial = [m for wf, detector, m, *_ in alerts if (wf, detector) == (f"slurm-{b}", "partial_use")]
    assert partial and f"no process of the job ever opened them: {slurm.node}/gpu{nvml_index}." in partial[0], alerts
    idle_c = min(end for wf, detector, _, end, _ in alerts if (wf, detector) == (f"slurm-{c}", "idle_allocated"))
    after_start_s = (idle_c.timestamp() * 1000 - slurm_time_ms(info["c"]["StartTime"])) / 1000
    print(f"idle-allocation alert of (c): window ending {after_start_s:.1f} s after its allocation began")
    assert after_start_s <= DETECTOR_MIN_S + WINDOW_S + 1  # (+1: Slurm's start time is whole seconds)
    # The ladder cancelled (c) with scancel, and only (c): (d) is in an exempt partition.
    steps = chdb_client.query(f"SELECT workflow_id, step FROM {database}.enforcement FINAL").result_rows
    assert (f"slurm-{c}", "ACTED") in steps and (f"slurm-{d}", "EXEMPT") in steps
    assert not [s for wf, s in steps if wf == f"slurm-{d}" and s in ("ACTION_DUE", "ACTED")]
    assert info["c"]["JobState"] == "CANCELLED" and d_when_c_ended == "RUNNING" and info["d"]["JobState"] == "COMPLETED"
    # Where HPC admins look: the efficiency line in Slurm's accounting; the whole report from gpufleet.
    line = slurm.sacct(c, "AdminComment")  # never busy, in its first 15 minutes: start-up, as the waterfall says
    assert line.startswith("gpufleet:") and "gpu-hours" in line and "largest loss start-up" in line
    assert "mean gpu utilisation 0.0%" in line
    summary, cluster = workflow_summary(chdb_client, database, f"slurm-{c}")  # what `gpufleet job <id>` prints
    text, _ = job_report(summary, cluster=cluster)
    assert text.startswith(f"gpufleet job report: slurm-{c}") and "owner root, team vision" in text
    assert "ended: its scheduler (slurm) ended it" in text
