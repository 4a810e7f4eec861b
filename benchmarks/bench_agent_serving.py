"""Benchmark 6 of ``bench_agent.py`` (run by it, or alone with ``--serving-only`` there): the
agent reading a serving engine's endpoint per replica per tick (``--serving-endpoint``: 8
replicas of one GPU, each a vLLM endpoint of ~430 lines, as vLLM's histograms make it, then a TGI
endpoint of ~1,900 lines sent whole, as TGI's router makes it: ``engine_pages.py``; served by
another process) against the agent as before, at 8 GPUs: CPU per tick, the two alternating,
medians; then each part of a reading alone against what the goal leaves it. Goal: at most 5 %
more. ``--nvml``: the host's own GPUs through NVML instead of the fake's 8, a replica a GPU (on a
GPU machine: the honest baseline, a tick as NVML costs it there). ``--budget-s S``: as many
rounds as fit in about S seconds of wall time (at least 5), sized from the warm-up's ticks (a lent
GPU machine's time is short: ``benchmarks/gpu_machine.sh``)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.engine_pages import tgi_page, vllm_page
from producers.agent.allocations.allocation import Allocation, Allocations
from producers.agent.gpus.attribute_process import ProcessAttributor
from producers.agent.gpus.sample_nvml import NvmlSampler
from producers.agent.host_agent import AgentSettings, HostAgent
from producers.agent.links import AgentLinks
from producers.agent.spool.disk import Spool
from producers.serving import engines
from producers.serving.fetch import Fetcher
from producers.serving.scrape import Endpoint, ServingObserver, ServingReader
from schemas.codec import Codec
from schemas.topics import GPU_SAMPLES
from tests.support.fake_nvml import FakeGpu, FakeNvml, FakeProcess
from tests.support.proc_tree import make_process


def at_one_hertz(agent: HostAgent) -> HostAgent:
    """``agent`` with a wall clock a second later at each tick, as the agent's loop ticks at 1 Hz:
    a benchmark ticks it back to back, and the samples still stand for a second each."""
    start = time.time()
    agent.clock = lambda: start + agent.ticks
    return agent


# An engine's endpoint in a process of its own: HTTP/1.1, connections kept open (as uvicorn, which
# vLLM and SGLang serve with, and Triton's and TGI's servers do). With "library", the page is
# exposed through the Prometheus client library, as vLLM and SGLang expose theirs: it answers
# ``name[]`` with those samples alone; without, the whole page whatever is asked (TGI, Triton).
# Its counters move between two readings, as a replica's that serves: every counter and every
# histogram's sum and count grows at each request, so no reading parses the same text twice.
ENGINE_SERVER = """
import sys, urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
page = open(sys.argv[1]).read()
library = sys.argv[2] == "library"
families = list(text_string_to_metric_families(page))
served = [0]
def grown(sample):
    moves = sample.name.endswith(("_total", "_sum", "_count")) or "_bucket" in sample.name
    return sample._replace(value=sample.value + served[0]) if moves else sample
class Page:
    def collect(self):
        for f in families:
            moved = type(f)(f.name, f.documentation, f.type, f.unit)
            moved.samples = [grown(s) for s in f.samples]
            yield moved
registry = CollectorRegistry(auto_describe=True)
registry.register(Page())
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as uvicorn's sockets: no 40 ms wait between headers and body
    def do_GET(self):
        served[0] += 1
        names = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("name[]")
        body = generate_latest(registry.restricted_registry(names) if library and names else registry)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ThreadingHTTPServer.request_queue_size = 128  # (as uvicorn's backlog: 8 connections at once are no SYN dropped)
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


class Holding:
    """An allocation source whose one job holds every GPU: on real GPUs (no process of ours on
    them), their samples are still a workflow's, whose replicas' readings are sent."""

    scheduler = "slurm"

    def __init__(self, gpus: int) -> None:
        self.job = Allocation(scheduler="slurm", job_id="1", workflow_id="slurm-1", owner="ana", team="ml",
                              gpus=tuple(str(i) for i in range(gpus)), started_ms=int(time.time() * 1000))

    def read(self, now_ms: int) -> Allocations:
        return Allocations((self.job,))

    def forget(self, ended) -> None:
        pass


def serving_cost(tmp: Path, ticks: int = 60, rounds: int = 21, real_nvml: bool = False,
                 budget_s: float | None = None) -> None:
    """CPU per tick of the agent reading a replica's endpoint per GPU (each read every tick, then
    every 10, in the agent's ticks as it reads them) against the same agent without: the
    endpoints exposed as vLLM and SGLang do (the client library: ``name[]`` answered), then as a
    whole page whatever is asked (TGI, Triton). 8 GPUs of the fake NVML; with ``real_nvml``, the
    host's own GPUs through NVML (``--nvml``: on a GPU machine, the tick as it costs there). With
    ``budget_s``, the rounds are as many as fit in about that many seconds (``sized``)."""
    (tmp / "www").mkdir()
    for exposition, (_, page, _) in PAGES.items():
        (tmp / "www" / exposition).write_text(page())
    proc = tmp / "proc-serving"
    for i in range(8):
        make_process(proc, 3000 + i, {"GPUFLEET_WORKFLOW_ID": f"svc-{i}", "USER": "ana"})
    for exposition in ("library", "page"):
        _serving_cost(tmp, proc, exposition, ticks, rounds, real_nvml, None if budget_s is None else budget_s / 2)


def _sampler(real_nvml: bool) -> tuple[NvmlSampler, Holding | None, int, str]:
    """The agent's GPUs: 8 of the fake NVML, or the host's own (with a job holding them all); how
    many, and in words."""
    if real_nvml:
        sampler = NvmlSampler()
        sampler.open()
        readings = sampler.tick()
        return sampler, Holding(len(readings)), len(readings), f"{len(readings)} x {readings[0].name} (real NVML)"
    gpus = [FakeGpu(f"GPU-{i}", processes=[FakeProcess(3000 + i, sm_util=20)], minor=i) for i in range(8)]
    sampler = NvmlSampler(FakeNvml(gpus))
    sampler.open()
    return sampler, None, 8, "8 GPUs (fake NVML)"


# Each case's engine, its page, and how it is sent: vLLM's (and SGLang's) through the Prometheus
# client library, which answers ``name[]`` with those samples alone; TGI's whole whatever is asked,
# the largest page of the four engines (Triton's holds some 20 lines a model).
PAGES: dict[str, tuple[str, Callable[[], str], str]] = {
    "library": ("vLLM", vllm_page, "exposed by the client library (vLLM, SGLang: only the samples read are sent)"),
    "page": ("TGI", tgi_page, "exposed as a whole page, as TGI's router makes it (TGI, Triton: all of it sent)"),
}

TICK_GAP_S = 0.01  # between two benchmarked ticks: the agent sleeps a second; here the engine's answers come meanwhile


def sized(rounds: int, span: int, turn_s: float, share_s: float | None) -> tuple[int, int]:
    """How many rounds of how many turns (the three agents' ticks, ``turn_s`` seconds of wall time
    together) fit in ``share_s``: ``rounds`` of ``span`` at most, an odd number of rounds (a median
    of its own) and never under 5; where 5 do not fit, shorter rounds (whole 30s of turns: every
    reading interval's and the agents' order's)."""
    fit = rounds if share_s is None else int(share_s / (span * turn_s))
    if fit >= 5:
        return min(rounds, fit if fit % 2 else fit - 1), span
    return 5, min(span, max(30, int(share_s / (5 * turn_s)) // 30 * 30))


def _serving_cost(tmp: Path, proc: Path, exposition: str, ticks: int, rounds: int, real_nvml: bool,
                  budget_s: float | None) -> None:
    server = subprocess.Popen([sys.executable, "-c", ENGINE_SERVER, str(tmp / "www" / exposition), exposition],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(server.stdout.readline())
        sampled: dict = {}  # how many GPUs the agents sample, and in words
        sent = [0]  # ServingSamples the agent with the endpoints spooled

        def agent(reader: ServingReader | None = None, observer: Callable[[list, dict], None] | None = None
                  ) -> HostAgent:
            sampler, holding, sampled["n"], sampled["gpus"] = _sampler(real_nvml)
            spool, codec = Spool(tmp / f"spool-{exposition}-{id(sampler)}"), Codec()

            def put(schema: str, key, record: dict) -> None:
                sent[0] += 1
                spool.append("bench." + GPU_SAMPLES.name, key, codec.encode(schema, record))

            observers = [ServingObserver(reader, put, "bench-host")] if reader is not None else []
            observers += [observer] if observer is not None else []
            return at_one_hertz(HostAgent(AgentSettings("bench-host", topic_prefix="bench.", checkpoint=False), spool,
                                          codec, nvml=sampler, attributor=ProcessAttributor(proc=proc),
                                          allocations=holding, links=AgentLinks(observers=tuple(observers))))

        plain = agent()
        n, gpus = sampled["n"], sampled["gpus"]
        every = [1]  # read the endpoints every this many ticks (1: each tick; 10: the agent's default, 10 s)
        beat = [0.0]  # the reader's clock, in its intervals: it reads at each whole one
        # the agent's reader as the agent runs it, in its ticks
        reader = ServingReader([Endpoint((i,), f"http://127.0.0.1:{port}/metrics") for i in range(n)], 1.0,
                               monotonic=lambda: beat[0])
        # (the ticks' clock runs ~70x the wall's here: 2 s of it would leave the engine 30 ms to answer
        # when this 2-vCPU machine is busy; no endpoint here hangs)
        reader.timeout_s = 60.0
        serving = agent(reader)

        def serving_tick() -> None:
            beat[0] += 1 / every[0]
            serving.tick()

        def gap(tick):
            def ticked() -> None:
                tick()
                time.sleep(TICK_GAP_S)
            return ticked

        for _ in range(5):
            gap(plain.tick)()
            gap(serving_tick)()
        engine, page, where = PAGES[exposition]
        lines = len(page().splitlines())
        budgets: list[float] = []  # per reading, what 5 % of the agent's tick leaves
        neighbour = Neighbour([reader._url(i) for i in range(n)])  # (the pages the reader asks)

        def asking(samples: list[dict], host: dict) -> None:
            """The neighbour told to ask where the agent's reader asks: in the tick, at its observers."""
            if neighboured.ticks % every[0] == 0:
                neighbour.ask()

        neighboured = agent(observer=asking)
        for _ in range(5):
            gap(neighboured.tick)()
        began = time.perf_counter()  # (a turn: the three agents' ticks, each with its gap)
        for _ in range(5):
            for tick in (plain.tick, neighboured.tick, serving_tick):
                gap(tick)()
        turn_s = (time.perf_counter() - began) / 5

        for every[0] in (1, 10):
            span = ticks * (1 if every[0] == 1 else 4)  # (a round holds 60 readings of each endpoint, or 24)
            # (of the budget, a third to reading every tick, the rest to every 10: its rounds are 4x as long)
            share = None if budget_s is None else budget_s * (0.3 if every[0] == 1 else 0.6)
            runs, span = sized(rounds, span, turn_s, share)
            cost, readings = in_turn([("GPUs only", plain.tick), ("engines asked by another", neighboured.tick),
                                      ("with the endpoints", serving_tick)], span, runs, sent)
            assert not reader.errors, reader.errors
            base, _, with_serving = (statistics.median(v) for v in cost.values())
            ratio = statistics.median(c / a for a, _, c in zip(*cost.values()))
            alike = statistics.median(c / b for _, b, c in zip(*cost.values()))
            per_tick = statistics.median(readings) / span
            print(f"agent, {gpus}, {n} {engine} endpoints ({lines} lines a page) {where}, "
                  f"read every {every[0]} tick(s) of 1 s ({per_tick:.2f} readings a tick): {base * 1e3:.3f} ms CPU "
                  f"per tick sampling the GPUs, {with_serving * 1e3:.3f} ms with the endpoints, ticking in turn; "
                  f"median ratio over {runs} rounds of {span} ticks {ratio:.3f}x, {alike:.3f}x against the agent "
                  f"beside a scraper asking the same pages (goal <= 1.05x); "
                  f"{(with_serving - base) / per_tick * 1e3:.2f} ms per reading")
            budgets.append(0.05 * base / per_tick)
        neighbour.close()
        fetch, parsing = reading_parts(reader)
        stepped, waited = step_cost(reader, readings=100 * n)
        print(f"  a reading's parts: the HTTP request {fetch * 1e3:.3f} ms, the reading of its page "
              f"{parsing * 1e3:.3f} ms; the 5 % goal leaves {budgets[0] * 1e3:.3f} ms a reading read every tick, "
              f"{budgets[1] * 1e3:.3f} ms every 10")
        print(f"  a reading taken in the ticks (asked at one, its answer taken at the next): {stepped * 1e3:.3f} ms "
              f"CPU, against {waited * 1e3:.3f} ms asked and waited for as each answer comes ({stepped / waited:.2f}x)")
    finally:
        server.terminate()
        server.wait(10)


def in_turn(turns: list[tuple[str, Callable[[], object]]], span: int, runs: int, sent: list[int]
            ) -> tuple[dict[str, list[float]], list[int]]:
    """``runs`` rounds of ``span`` ticks of each agent: CPU per tick by agent and round, and the
    readings each round sent (``sent``: the reading agent's count of ServingSamples). The agents
    tick in turn, tick by tick (each tick followed by the gap, the order turning), so that what
    drifts on the machine drifts under all three alike."""
    cost: dict[str, list[float]] = {name: [] for name, _ in turns}
    readings: list[int] = []
    for _ in range(runs):
        spent = dict.fromkeys(cost, 0.0)
        sent0 = sent[0]
        for k in range(span):
            for name, tick in turns[k % 3:] + turns[:k % 3]:
                cpu0 = time.process_time()
                tick()
                spent[name] += time.process_time() - cpu0
                time.sleep(TICK_GAP_S)
        for name, cpu in spent.items():
            cost[name].append(cpu / span)
        readings.append(sent[0] - sent0)
    return cost, readings


# Another process asking the engines the same pages at the same moments (as the cluster's own
# Prometheus would): the agent without the endpoints beside it. The engine's answering takes CPU
# on the machine's other core, which slows whatever shares it (2 vCPUs here): with the engines
# asked as often on both sides, and at the same point of the agent's tick (its observers' turn,
# where the reader asks), the ratio is the agent's own cost alone. As the reader, it asks an
# endpoint again only once its last answer came, and takes the answers as they come, in its own
# process (the agent's reader takes them at its next tick).
NEIGHBOUR = """
import os, select, sys, pycurl
multi, idle = pycurl.CurlMulti(), []
for url in sys.argv[1:]:
    c = pycurl.Curl()
    c.setopt(pycurl.URL, url)
    c.setopt(pycurl.WRITEFUNCTION, lambda chunk: None)
    idle.append(c)
while True:
    r, w, x = multi.fdset()
    ms = multi.timeout()
    if 0 in select.select([0, *r], w, x, 0.05 if ms < 0 else min(ms / 1000, 0.05))[0]:
        told = os.read(0, 4096)
        if not told:
            break
        for c in idle:
            multi.add_handle(c)
        idle = []
    while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
        pass
    while True:
        queued, ok, failed = multi.info_read()
        for c in ok + [f[0] for f in failed]:
            multi.remove_handle(c)
            idle.append(c)
        if not queued:
            break
"""


class Neighbour:
    """A process that asks every endpoint's page when told (those it is not still waiting for),
    without the teller waiting for the answers."""

    def __init__(self, urls: list[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, *urls], stdin=subprocess.PIPE)

    def ask(self) -> None:
        self.proc.stdin.write(b"ask\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


class Counted(ServingReader):
    """A reader that counts the answers it takes."""

    taken = 0

    def _took(self, *args) -> bool:
        self.taken += 1
        return super()._took(*args)


def step_cost(reader: ServingReader, readings: int = 800) -> tuple[float, float]:
    """CPU a reading of ``reader``'s endpoints, the ticks ``TICK_GAP_S`` apart: asked at one tick
    and taken at the next (``step``, as the agent reads them), against asked and waited for as
    each answer comes (``read_all``: a thread that woke for the answers did the same)."""
    beat = [0.0]
    stepped = Counted(reader.endpoints, 1.0, monotonic=lambda: beat[0])
    stepped.timeout_s = 60.0  # (its clock, too, runs far ahead of the wall's)
    cpu0 = time.process_time()
    while stepped.taken < readings:
        stepped.step()
        beat[0] += 0.5  # (asked every other tick: the answers taken at the tick between)
        time.sleep(TICK_GAP_S)
    stepped_cost = (time.process_time() - cpu0) / stepped.taken
    waited = Counted(reader.endpoints, 1.0)
    cpu0 = time.process_time()
    while waited.taken < readings:
        waited.read_all()
        time.sleep(TICK_GAP_S)
    return stepped_cost, (time.process_time() - cpu0) / waited.taken


def reading_parts(reader, n: int = 400) -> tuple[float, float]:
    """CPU of one reading's two parts, each alone: the HTTP request of endpoint 0 over its kept-open
    connection, and the reading of the page it answered (the lines read picked out, then read from
    their values by the layout the client library's parser gave the page's first reading)."""
    url, get = reader._urls.get(0, reader.endpoints[0].url), Fetcher()  # (the reader's may be in flight)
    text = get(url, reader.timeout_s)  # (its connection opened)
    cpu0 = time.process_time()
    for _ in range(n):
        text = get(url, reader.timeout_s)
    fetch = (time.process_time() - cpu0) / n
    get.close()
    cpu0 = time.process_time()
    for _ in range(n):
        engines.parse(text, reader._engines.get(0))  # (as the reader reads it: its engine known)
    return fetch, (time.process_time() - cpu0) / n


def budget(argv: list[str]) -> float | None:
    """``--budget-s S``'s seconds, if given."""
    return float(argv[argv.index("--budget-s") + 1]) if "--budget-s" in argv else None


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-agent-") as d:
        serving_cost(Path(d), real_nvml="--nvml" in sys.argv, budget_s=budget(sys.argv))
