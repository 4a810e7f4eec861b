"""Builders of small Kineto-format traces for tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

SHARED_TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
# A trace captured by gpufleet's own profiling hook on one H200 (tests/data/README.md).
HOOK_TRACE = Path(__file__).resolve().parents[1] / "data" / "hook-trace-h200.json.gz"


def kernel(name: str, ts: float, dur: float, stream: int = 7, corr: int = -1, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"stream": stream, "correlation": corr, "device": 0}}


def memcpy(ts: float, dur: float, stream: int = 7, corr: int = -1, nbytes: int = 1024) -> dict:
    e = kernel("Memcpy HtoD (Pageable -> Device)", ts, dur, stream, corr, cat="gpu_memcpy")
    e["args"]["bytes"] = nbytes
    return e


def runtime(name: str, ts: float, dur: float, corr: int) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "cbid": 211}}


def step(n: int, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1,
            "ts": ts, "dur": dur, "args": {}}


def cpu_op(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}}


def memory(ts: float, total_allocated: int, device: int = 0) -> dict:
    return {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
            "args": {"Device Type": 1, "Device Id": device, "Total Allocated": total_allocated}}


def write_trace(path: Path, events: list[dict], rank: int | None = 0, gz: bool = False,
                device_memory: int | None = None, kineto_layout: bool = False) -> Path:
    doc: dict = {"schemaVersion": 1}
    if device_memory is not None:
        doc["deviceProperties"] = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": device_memory}]
    if rank is not None:
        doc["distributedInfo"] = {"rank": rank}
    doc["traceEvents"] = [*events, {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler", "ts": 0, "dur": 1}]
    if kineto_layout:  # as the profiler writes it: each event a block from "  {" to "  }"
        events_text = ",\n".join("  {\n    " + json.dumps(e)[1:-1] + "\n  }" if type(e) is dict
                                  else "  " + json.dumps(e) for e in doc.pop("traceEvents"))
        head = json.dumps(doc, indent=2)[:-2]
        data = (head + ',\n  "traceEvents": [\n' + events_text + "\n]}").encode()
    else:
        data = json.dumps(doc).encode()  # one line: not the profiler's layout, read by the generic parser
    if gz:
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def cuda_graph_step_trace(path: Path, graph: bool) -> Path:
    """A step that launches six kernels (stream 7: four of 100 us back to back; stream 8: two
    of 50 us) and waits for them (cudaStreamSynchronize, with the profiler's Stream Sync).
    ``graph``: as one cudaGraphLaunch (one correlation id for all six), else one launch each."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
               "ts": 0, "dur": 1000, "args": {}},
              cpu_op("aten::forward", 10, 40)]
    if graph:
        events.append(runtime("cudaGraphLaunch", 20, 20, corr=1))
        corrs = [1] * 6
    else:
        events += [runtime("cudaLaunchKernel", 12 + 4 * i, 3, corr=1 + i) for i in range(6)]
        corrs = list(range(1, 7))
    starts7 = [50, 150, 250, 350]
    events += [kernel(f"k7_{i}", ts, 100, stream=7, corr=c) for i, (ts, c) in enumerate(zip(starts7, corrs))]
    events += [kernel(f"k8_{i}", ts, 50, stream=8, corr=c) for i, (ts, c) in enumerate(zip((60, 110), corrs[4:]))]
    events += [runtime("cudaStreamSynchronize", 60, 400, corr=100),
               {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": 0, "tid": 7, "ts": 61, "dur": 398,
                "args": {"stream": 7, "correlation": 100, "device": 0}},
               cpu_op("aten::item", 470, 10)]
    return write_trace(path, events)


def kernel_sequence_trace(path: Path, seed: int = 1, steps: int = 6, layers: int = 8) -> Path:
    """A trace for frequent kernel sequences: each step's forward runs ``layers`` aten::linear
    operators (aten::t, then aten::addmm launching one of two GEMMs, mostly a bias kernel and
    often a ReLU, sometimes a memset first; some too short to count), and a backward thread
    runs aten::linear_backward deeper in its stack (the name matches too: HTA counts only the
    matches at the smallest depth). Its HTA results are ``tests/data/hta/kernel-sequences.json``."""
    import random

    rng = random.Random(seed)
    events: list[dict] = []
    corr, t = 0, 1000

    def launch(name: str, at: int, tid: int, dur: int, stream: int = 7) -> int:
        nonlocal corr
        corr += 1
        events.append({**runtime("cudaLaunchKernel", at, 3, corr), "tid": tid})
        cat = "gpu_memset" if name.startswith("Memset") else "kernel"
        events.append(kernel(name, at + 20 + rng.randint(0, 5), dur, stream=stream, corr=corr, cat=cat))
        return at + 4

    def op(name: str, at: int, dur: int, tid: int = 1) -> None:
        events.append({**cpu_op(name, at, dur), "tid": tid})

    for n in range(steps):
        start = t
        for _ in range(layers):
            roll = rng.random()
            op("aten::linear", t, 40)
            op("aten::t", t + 1, 3)
            op("aten::addmm", t + 5, 30)
            at = t + 6
            if roll < 0.2:
                at = launch("Memset (Device)", at, 1, 2)
            at = launch("void gemm_a<float>(float const*, float*)" if rng.random() < 0.7
                        else "void gemm_b<float>(float const*, float*)", at, 1, 30)
            if roll < 0.9:
                at = launch("void bias_add<float>(float*)", at, 1, 5)
            if rng.random() < 0.6:
                launch("void relu<float>(float*)", at, 1, 3)
            t += 50
        events.append(step(n + 1, start, t - start))
        for _ in range(layers):  # the backward thread
            op("autograd::engine::evaluate_function: AddmmBackward0", t, 40, tid=2)
            op("AddmmBackward0", t + 1, 38, tid=2)
            op("aten::linear_backward", t + 2, 36, tid=2)
            at = launch("void gemm_a<float>(float const*, float*)", t + 3, 2, 20)
            at = launch("void gemm_b<float>(float const*, float*)", at, 2, 20)
            launch("void bias_grad<float>(float*)", at, 2, 5)
            t += 50
    return write_trace(path, sorted(events, key=lambda e: e["ts"]))


COMPUTE_KERNELS = tuple(f"void gemm_{i}<float, {i * 32}>(float const*, float*)" for i in range(14)) + (
    "ampere_sgemm_128x64_tn", "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float> >")
NCCL_KERNELS = ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
                "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                "ncclKernel_ReduceScatter_RING_LL_Sum_float(ncclWorkElem)")
COPIES = ("Memcpy HtoD (Pinned -> Device)", "Memcpy DtoH (Device -> Pinned)", "Memset (Device)")


def synthetic_job_trace(path: Path, seed: int = 1, steps: int = 6, kernels_per_step: int = 60,
                        min_dur: float = 1.0, slower: dict[str, float] | None = None, cpu_ops: int = 0,
                        first_correlation: int = 1) -> Path:
    """A deterministic trace of the shape the shared traces lack: a data-parallel training
    step with computation on two streams, NCCL collectives on two more that overlap it,
    copies on a fifth, nanosecond (float) timestamps, many distinct kernel names, profiler
    steps, and GPU user annotations. Its HTA results are ``tests/data/hta/synthetic-<seed>.json``
    (``benchmarks/hta_reference.py``): change this function and those files are made again.

    ``min_dur``: the shortest kernel. HTA rounds a kernel of under 1 us to an interval that
    ends before it starts, and then its figures depend on how an unstable sort orders equal
    start times (see docs/trace-analysis.md): the traces compared with HTA have none. ``slower``: kernel
    name -> factor on its durations (a regression; the random draws stay the same).
    ``cpu_ops``: nested CPU operators around each launch, with shapes and call stacks, as a
    trace recorded with ``record_shapes=True, with_stack=True`` has (most of its events).
    ``first_correlation``: the first launch's correlation id (a long-running process's are
    large; HTA 0.5.0 fails on a trace of over 2**15 events whose ids are all under 2**15)."""
    import random

    rng = random.Random(seed)
    events: list[dict] = []
    corr = first_correlation - 1
    t = 1000.0
    for n in range(steps):
        step_start = t
        gpu_t = {7: t + 20.0, 11: t + 25.0, 20: t + 30.0, 24: t + 40.0, 13: t + 5.0}
        for phase in ("forward", "backward"):
            phase_start = t
            for i in range(kernels_per_step):
                corr += 1
                launch = round(t + rng.uniform(2, 8), 3)
                cpu_dur = round(rng.uniform(3, 9), 3)
                roll = rng.random()
                if roll < 0.12:
                    stream, name, cat = rng.choice((20, 24)), rng.choice(NCCL_KERNELS), "kernel"
                    dur = round(rng.uniform(20, 400), 3)
                elif roll < 0.2:
                    stream, name = 13, rng.choice(COPIES)
                    cat = "gpu_memset" if name.startswith("Memset") else "gpu_memcpy"
                    dur = round(rng.uniform(1, 60), 3)
                else:
                    stream, name, cat = rng.choice((7, 7, 7, 11)), rng.choice(COMPUTE_KERNELS), "kernel"
                    dur = round(max(rng.expovariate(1 / 40), min_dur), 3)
                dur = round(dur * (slower or {}).get(name, 1.0), 3)
                start = round(max(gpu_t[stream] + rng.choice((0.0, 0.0, rng.uniform(0, 30))), launch + 4.0), 3)
                gpu_t[stream] = start + dur
                runtime_name = "cudaMemcpyAsync" if cat == "gpu_memcpy" else (
                    "cudaMemsetAsync" if cat == "gpu_memset" else "cudaLaunchKernel")
                for depth in range(cpu_ops):  # around the launch, outermost first
                    events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op_{depth}_{i % 7}", "pid": 1,
                                   "tid": 1, "ts": round(launch - 1.0 - 0.01 * (cpu_ops - depth), 3),
                                   "dur": round(cpu_dur + 2.0 + 0.02 * (cpu_ops - depth), 3),
                                   "args": {"External id": corr * cpu_ops + depth,
                                            "Input Dims": [[64, 1024], [1024]],
                                            "Input type": ["float", "float"], "Call stack":
                                            "model.py(120): forward;torch/nn/modules/module.py(1501): _call_impl"}})
                events.append({"ph": "X", "cat": "cuda_runtime", "name": runtime_name, "pid": 1, "tid": 1,
                               "ts": launch, "dur": cpu_dur, "args": {"correlation": corr, "cbid": 211}})
                args = {"stream": stream, "correlation": corr, "device": 0, "context": 1}
                if cat == "kernel":
                    args.update(grid=[rng.randint(1, 512), 1, 1], block=[256, 1, 1])
                else:
                    args["bytes"] = rng.randint(1 << 10, 1 << 24)
                    args["memory bandwidth (GB/s)"] = args["bytes"] / (dur * 1e3)  # as the profiler writes it
                events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": start,
                               "dur": dur, "args": args})
                t = launch + cpu_dur
            gpu_end = max(gpu_t.values())
            events.append({"ph": "X", "cat": "user_annotation", "name": phase, "pid": 1, "tid": 1,
                           "ts": phase_start, "dur": round(t - phase_start, 3), "args": {}})
            events.append({"ph": "X", "cat": "gpu_user_annotation", "name": phase, "pid": 0, "tid": 7,
                           "ts": round(phase_start + 20.0, 3), "dur": round(gpu_end - phase_start - 20.0, 3),
                           "args": {"External id": n * 2 + (phase == "backward")}})
        t = max(t, max(gpu_t.values())) + rng.uniform(50, 400)  # the next step's input
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n + 1}", "pid": 1, "tid": 1,
                       "ts": step_start, "dur": round(t - step_start, 3), "args": {}})
    events.sort(key=lambda e: e["ts"])
    doc = {"schemaVersion": 1,
           "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85_000_000_000}],
           "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},
           "traceEvents": events}
    path.write_text(json.dumps(doc))
    return path


def synthetic_rank_traces(directory: Path, ranks: int = 4, straggler: int | None = 2, steps: int = 8,
                          seed: int = 7, slow: float = 1.3) -> list[Path]:
    """One trace per rank of a data-parallel job: each step, forward and backward kernels,
    then an all-reduce that ends on every rank when the last one has arrived. ``straggler``:
    the rank whose computation takes ``slow`` times as long (None: ranks differ only by
    jitter). Each host's clock is off by up to 50 ms, as clocks of different hosts are."""
    import random

    rng = random.Random(seed)
    clock = [rng.uniform(-50_000, 50_000) for _ in range(ranks)]
    events: list[list[dict]] = [[] for _ in range(ranks)]
    corr = [0] * ranks
    t = 1_000_000.0
    for n in range(steps):
        compute = [rng.uniform(900, 1100) * (slow if r == straggler else 1.0) for r in range(ranks)]
        comm = rng.uniform(200, 300)
        arrive = [t + 50.0 + c for c in compute]
        end = max(arrive) + comm
        for r in range(ranks):
            ev, off = events[r], clock[r]
            kt = t + 50.0
            for i, share in enumerate((0.3, 0.3, 0.4)):
                corr[r] += 1
                launch = t + 5.0 + i * 10.0
                ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": round(launch + off, 3), "dur": 4.0, "args": {"correlation": corr[r]}})
                dur = compute[r] * share
                ev.append({"ph": "X", "cat": "kernel", "name": f"void gemm_{i}<float>(float*)", "pid": 0, "tid": 7,
                           "ts": round(kt + off, 3), "dur": round(dur, 3),
                           "args": {"stream": 7, "correlation": corr[r], "device": 0}})
                kt += dur
            corr[r] += 1
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": round(t + 40.0 + off, 3), "dur": 4.0, "args": {"correlation": corr[r]}})
            ev.append({"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
                       "pid": 0, "tid": 20, "ts": round(arrive[r] + off, 3), "dur": round(end - arrive[r], 3),
                       "args": {"stream": 20, "correlation": corr[r], "device": 0}})
            ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n + 1}", "pid": 1, "tid": 1,
                       "ts": round(t + off, 3), "dur": round(end + 100 - t, 3), "args": {}})
        t = end + 100.0
    paths = []
    directory.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": r, "world_size": ranks},
               "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85_000_000_000}],
               "traceEvents": sorted(events[r], key=lambda e: e["ts"])}
        path = directory / f"rank{r}.json"
        path.write_text(json.dumps(doc))
        paths.append(path)
    return paths


def synthetic_operator_trace(path: Path, steps: int = 3, gpu: str = "NVIDIA H100 80GB HBM3",
                             mm_us: float = 343.6, add_us: float = 100.7) -> Path:
    """A trace with FLOPs and shapes (``with_flops=True, record_shapes=True``) on two CPU
    threads: per step, on the forward thread, ``aten::linear`` -> ``aten::addmm`` (bf16,
    2048 x 4096 by 4096 x 4096) and ``aten::add`` (fp32, two vectors of 2**24), then
    ``aten::relu`` (no FLOPs); on the backward thread, open while relu launches, ``aten::mm``
    (bf16, 4096 x 4096 by 4096 x 4096). Each operator launches one kernel of the given duration (``mm_us`` for the
    4096-cube, half of it for addmm; ``add_us`` for the add)."""
    events: list[dict] = []
    corr = 0
    t = 1000.0

    def op(name, ts, dur, tid, flops=None, dims=None, types=None):
        args = {} if flops is None else {"flops": flops, "Input Dims": dims, "Input type": types}
        events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
                       "args": args})

    def launch(ts, tid, kernel_name, gpu_ts, gpu_dur):
        nonlocal corr
        corr += 1
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid,
                       "ts": ts, "dur": 3, "args": {"correlation": corr}})
        events.append({"ph": "X", "cat": "kernel", "name": kernel_name, "pid": 0, "tid": 7, "ts": gpu_ts,
                       "dur": gpu_dur, "args": {"stream": 7, "correlation": corr, "device": 0}})

    for n in range(steps + 1):  # (the last step is dropped, as HTA does)
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1,
                       "ts": t, "dur": 2000, "args": {}})
        at = t + 50
        op("aten::linear", t + 1, 30, 1)
        op("aten::addmm", t + 2, 20, 1, 2 * 2048 * 4096 * 4096, [[4096], [2048, 4096], [4096, 4096]],
           ["c10::BFloat16"] * 3)
        launch(t + 5, 1, "sm90_xmma_gemm_bf16bf16_bf16f32", at, mm_us / 2)
        at += mm_us / 2
        op("aten::add", t + 40, 10, 1, 1 << 24, [[1 << 24], [1 << 24], []], ["float", "float", "Scalar"])
        launch(t + 42, 1, "vectorized_elementwise_kernel<add>", at, add_us)
        at += add_us
        op("aten::relu", t + 102, 10, 1)  # while aten::mm is open on the other thread
        launch(t + 104, 1, "vectorized_elementwise_kernel<relu>", at, 20)
        at += 20
        op("aten::mm", t + 100, 20, 2, 2 * 4096 ** 3, [[4096, 4096], [4096, 4096]], ["c10::BFloat16"] * 2)
        launch(t + 105, 2, "sm90_xmma_gemm_bf16bf16_bf16f32", at, mm_us)
        t += 2000
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": gpu, "totalGlobalMem": 85_000_000_000}],
           "traceEvents": sorted(events, key=lambda e: e["ts"])}
    path.write_text(json.dumps(doc))
    return path


def queue_full_trace(path: Path, launches: int = 1300) -> Path:
    """A host that launches a kernel every microsecond on one stream while each runs for 10:
    the stream's launch queue passes CUDA's 1024 and stays full for a while, then drains."""
    events = []
    for i in range(launches):
        events.append(runtime("cudaLaunchKernel", 1000 + i, 1, corr=i + 1))
        events.append(kernel("gemm", 1005 + 10 * i, 10, corr=i + 1))
    return write_trace(path, events)


