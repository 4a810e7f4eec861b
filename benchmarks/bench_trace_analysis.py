"""gpufleet's trace analysis against Holistic Trace Analysis 0.5.0 on the same trace files.

For each trace: wall time, CPU time and peak memory (max RSS of a fresh process) of reading
alone (decompressing and parsing into the columns the analysers are fed: the limit), of
`gpufleet analyze` (every analysis it makes, also as a multiple of reading alone) and of HTA
running the analyses both have (temporal breakdown, comm/comp overlap, idle breakdown, launch
statistics, kernel breakdown, memory bandwidth summary, GPU user annotations, launch queue
length and time blocked on a full queue), and both sets of numbers side by side. HTA runs from
its own virtualenv (``make bench-hta`` creates benchmarks/.venv-hta): it is never a dependency
of gpufleet.

    python benchmarks/bench_trace_analysis.py [--scale 10] [--synthetic STEPS] [--dense-steps STEPS]
                                              [--repeat 3] [TRACE ...]

Each side runs ``--repeat`` times per trace, alternately, and the medians are compared: on
a shared machine one run of either can be a third slower than the next.

--scale N also builds a trace N times the largest one (its events repeated later in time,
with fresh correlation ids and step numbers) and runs both on it. --synthetic STEPS adds two
traces of shapes the shared ones lack (tests/support/traces.py), in the profiler's layout: a
data-parallel job with NCCL overlapping computation on five streams, and the same with eight
nested CPU operators (shapes, call stacks) around each launch, as with_stack traces have.
--dense-steps STEPS adds the first of those shapes at another size (at 200 steps it is a quarter
of the largest trace's size, the other shape about as large): HTA's time per event grows with a
trace, gpufleet's does not, so the ratio is a trace size's as much as a shape's.

After the timed runs, every figure of the three summaries where HTA's own result depends on
how its unstable sort orders equal times or on a float sum's drift (memory bandwidth per copy
kind, launch queue length per stream, idle time per stream and cause) is compared, untimed,
with HTA's own, HTA with a stable sort, and HTA with a stable sort and an exact sum
(``benchmarks/hta_reference.py``), and the number that differ from each is printed: a change
that moves any of them is seen (``--no-figures`` leaves this out). ``--made`` adds the traces
of overlapping copies the tests compare (``tests.support.traces.overlapping_copies_trace``), where
the three differ.

--critical-path also times each side's critical path: gpufleet's of every profiler step
(``gpufleet analyze --critical-path``: every analysis and the paths) against HTA's of its first
step (``critical_path_analysis``, the analysis HTA offers), with the first step's path side by
side; HTA's error where it fails. --kernel-sequences OPERATOR times both sides' frequent CUDA
kernel sequences of that operator (gpufleet: every analysis and the sequences; HTA:
``get_frequent_cuda_kernel_sequences``) and compares the sequences found.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
HTA_PYTHON = ROOT / "benchmarks" / ".venv-hta" / "bin" / "python"
sys.path.insert(0, str(ROOT))  # the field names of two summaries, from small modules:
from trace_programs import FIGURES, HTA, HTA_CP, HTA_SEQ, OURS, OURS_CP, OURS_SEQ, READ

from streams.traces.memory_copies import HTA_FIGURES as MEMORY_FIGURES
from streams.traces.queue_length import HTA_FIGURES as QUEUE_FIGURES

PACKAGES = ("gpufleet", "producers", "streams", "sinks", "schemas", "kafka_client")


# The same programs up to their imports: what a run costs before it reads anything.
OURS_STARTUP = OURS.split("r = analyze_file")[0] + "print('{}')\n"
HTA_STARTUP = HTA.split("d = tempfile.mkdtemp()")[0] + "print('{}')\n"


def measure(python: str, code: str, trace: Path, cwd: Path, *extra: str,
            ) -> tuple[dict | None, float, float, float, str]:
    """Run ``code`` on ``trace`` in a fresh interpreter: (result, wall s, CPU s, peak RSS MiB, error)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([python, "-c", PEAK + code, str(trace), str(ROOT / "benchmarks"), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    _, status, usage = os.wait4(proc.pid, 0)  # the outputs are a line each: the pipes cannot fill
    elapsed = time.perf_counter() - t0
    out, err = proc.stdout.read(), proc.stderr.read()
    cpu = usage.ru_utime + usage.ru_stime
    err, peak_kib = peak_of(err, usage.ru_maxrss)  # Linux: kilobytes
    peak_mib = peak_kib / 1024
    if status != 0:
        return None, elapsed, cpu, peak_mib, err.strip().splitlines()[-1] if err.strip() else f"exit {status}"
    return json.loads(out.strip().splitlines()[-1]), elapsed, cpu, peak_mib, ""


# A child's peak memory, as it writes it when it exits (even on an error): the high-water mark of
# its own address space since exec (``VmHWM``). Its ``ru_maxrss`` is no measure of it: Linux keeps a
# process's high-water mark across exec, so every child's would start from this process's size at
# the fork (~24 MiB, above the ~17 MiB gpufleet's whole run takes on a small trace).
PEAK = (
    "import atexit as _a, sys as _s\n"
    "_a.register(lambda: _s.stderr.write("
    "'\\n' + next(l for l in open('/proc/self/status') if l.startswith('VmHWM:'))))\n"
)


def peak_of(err: str, maxrss_kib: int) -> tuple[str, int]:
    """The child's stderr without its peak line, and its peak in KiB (``maxrss_kib`` where it
    wrote none: no /proc)."""
    head, sep, tail = err.rpartition("\nVmHWM:")
    if not sep:
        return err, maxrss_kib
    return head, int(tail.split()[0])


def scaled_trace(source: Path, factor: int, dest: Path) -> Path:
    """``source``'s events ``factor`` times, each copy later in time, with fresh ids."""
    raw = gzip.decompress(source.read_bytes()) if source.suffix == ".gz" else source.read_bytes()
    doc = json.loads(raw)
    events = doc["traceEvents"]
    stamps = [e["ts"] + e.get("dur", 0) for e in events if isinstance(e.get("ts"), int | float)]
    span = max(stamps) - min(stamps) + 1000
    max_corr = max((e.get("args", {}).get("correlation", 0) or 0) for e in events) + 1
    out = []
    for k in range(factor):
        for e in events:
            c = dict(e)
            if isinstance(c.get("ts"), int | float):
                c["ts"] = c["ts"] + k * span
            args = c.get("args")
            if isinstance(args, dict) and isinstance(args.get("correlation"), int) and args["correlation"] >= 0:
                c["args"] = {**args, "correlation": args["correlation"] + k * max_corr}
            if c.get("name", "").startswith("ProfilerStep#"):
                c["name"] = f"ProfilerStep#{int(c['name'].split('#')[1]) + k * 1000}"
            out.append(c)
    del doc["traceEvents"]
    with gzip.open(dest, "wt") as f:  # the profiler's layout: each event a block from "  {" to "  }"
        f.write(json.dumps(doc, indent=2)[:-2] + ',\n  "traceEvents": [\n')
        f.write(",\n".join("  {\n    " + json.dumps(e)[1:-1] + "\n  }" for e in out))
        f.write("\n]}")
    return dest


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--scale", type=int, default=0, help="also run on a trace this many times the largest")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each side per trace (medians are printed)")
    parser.add_argument(
        "--synthetic",
        type=int,
        default=0,
        metavar="STEPS",
        help="also run on synthetic traces of this many steps (NCCL on five streams; CPU-operator heavy)",
    )
    parser.add_argument("--dense-steps", type=int, default=0, metavar="STEPS",
                        help="also run on the kernels-and-launches synthetic trace of this many steps (800: about "
                             "the size of --scale 10's trace)")
    parser.add_argument("--critical-path", action="store_true",
                        help="also time the critical path: gpufleet's of every step, HTA's of the first")
    parser.add_argument("--kernel-sequences", metavar="OPERATOR",
                        help="also time both sides' frequent kernel sequences of this operator")
    parser.add_argument("--made", action="store_true",
                        help="also run on the made traces of copies overlapping on several streams")
    parser.add_argument("--no-figures", action="store_true",
                        help="leave out the untimed comparison of every figure with HTA's three ways")
    parser.add_argument("--make-scaled", nargs=3, metavar=("SOURCE", "FACTOR", "DEST"), help=argparse.SUPPRESS)
    parser.add_argument("--make-synthetic", nargs=3, metavar=("STEPS", "CPU_OPS", "DEST"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.make_scaled:
        source, factor, dest = args.make_scaled
        scaled_trace(Path(source), int(factor), Path(dest))
        return
    if args.make_synthetic:
        steps, cpu_ops, dest = args.make_synthetic
        sys.path.insert(0, str(ROOT))
        from tests.support.traces import synthetic_job_trace

        plain = synthetic_job_trace(Path(dest).with_suffix(".plain"), steps=int(steps), kernels_per_step=200,
                                    cpu_ops=int(cpu_ops), first_correlation=1 << 20)
        scaled_trace(plain, 1, Path(dest))
        plain.unlink()
        return
    traces = [t.resolve() for t in args.traces] or sorted(SHARED.glob("*.json.gz"))
    # Both sides start from compiled modules, as an installed package does (pip compiles on
    # install; HTA's are). Where PYTHONDONTWRITEBYTECODE is set, as on our CI machines, every
    # run would otherwise compile gpufleet's modules from source: ~30 ms of a 0.1 s run.
    subprocess.run([sys.executable, "-m", "compileall", "-q", *PACKAGES], cwd=ROOT, check=True)
    have_hta = HTA_PYTHON.exists()
    if not have_hta:
        print(f"(no HTA at {HTA_PYTHON}: run `make bench-hta` to compare; timing gpufleet alone)\n")
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    if args.scale > 1 and traces:
        largest = max(traces, key=lambda p: p.stat().st_size)
        dest = tmp / f"x{args.scale}_{largest.name}"
        # In a child process: this one must stay small, or its children's peak memory counts it.
        subprocess.run([sys.executable, __file__, "--make-scaled", str(largest), str(args.scale), str(dest)],
                       check=True)
        traces = [*traces, dest]
    synthetic = [("nccl", 0, args.synthetic), ("cpu-heavy", 8, args.synthetic)] if args.synthetic else []
    if args.dense_steps:
        synthetic.append(("nccl", 0, args.dense_steps))
    for label, cpu_ops, steps in synthetic:
        dest = tmp / f"synthetic-{label}-{steps}.json.gz"
        subprocess.run([sys.executable, __file__, "--make-synthetic", str(steps), str(cpu_ops), str(dest)], check=True)
        traces = [*traces, dest]
    if args.made:
        sys.path.insert(0, str(ROOT))
        from tests.support.overlapping_copies import overlapping_copies_trace

        traces = [*traces, *(overlapping_copies_trace(tmp / f"overlapping-copies-{seed}.json", seed=seed)
                             for seed in (1, 2))]
    ours_start, hta_start = Runs(), Runs()
    for _ in range(args.repeat):
        ours_start.add(*measure(sys.executable, OURS_STARTUP, traces[0], ROOT))
        if have_hta:
            hta_start.add(*measure(str(HTA_PYTHON), HTA_STARTUP, traces[0], tmp))
    print(f"start-up (interpreter and imports, no trace)\n  gpufleet:  {ours_start}"
          + (f"\n  HTA 0.5.0: {hta_start}" if have_hta else "") + "\n", flush=True)
    for trace in traces:
        print(analysis_lines(trace, args.repeat, have_hta, tmp, ours_start, hta_start) + "\n", flush=True)
        if have_hta and not args.no_figures:
            print(figure_lines(trace, tmp) + "\n", flush=True)
        if args.critical_path:
            print(critical_path_lines(trace, args.repeat, have_hta, tmp) + "\n", flush=True)
        if args.kernel_sequences:
            print(kernel_sequence_lines(trace, args.kernel_sequences, args.repeat, have_hta, tmp) + "\n", flush=True)


def analysis_lines(trace: Path, repeat: int, have_hta: bool, tmp: Path, ours_start: Runs, hta_start: Runs) -> str:
    """Every analysis both have, each side's time and memory, and their figures side by side."""
    size = trace.stat().st_size / 2**20
    reads, ours, hta = Runs(), Runs(), Runs()
    for _ in range(repeat):  # alternately, so that all three see the same machine
        reads.add(*measure(sys.executable, READ, trace, ROOT))
        ours.add(*measure(sys.executable, OURS, trace, ROOT))
        if have_hta:
            hta.add(*measure(str(HTA_PYTHON), HTA, trace, tmp))
    line = f"{trace.name[:60]} ({size:.1f} MiB)\n  reading:   {reads}\n  gpufleet:  {ours}"
    if not (reads.error or ours.error):
        beyond = (ours.wall - ours_start.wall) / max(reads.wall - ours_start.wall, 1e-9)
        line += (f"\n  every analysis: {ours.wall / reads.wall:5.2f}x the time of reading alone"
                 + (f" ({beyond:.2f}x beyond start-up)" if reads.wall - ours_start.wall > 0.05 else ""))
    if not have_hta:
        return line
    line += f"\n  HTA 0.5.0: {hta}"
    if hta.error or ours.error:
        return line
    line += (f"\n  ratio (medians): {hta.wall / ours.wall:5.1f}x faster ({hta.cpu / ours.cpu:.1f}x in CPU time),"
             f" {ours.peak / hta.peak:5.2f} of HTA's memory")
    ours_work, hta_work = ours.wall - ours_start.wall, hta.wall - hta_start.wall
    if ours_work > 0.05 and hta_work > 0.5:  # else both are start-up and noise
        line += (f"\n  beyond start-up: {hta_work / ours_work:5.1f}x faster"
                 f" ({ours_work:.2f} s against {hta_work:.2f} s)")
    for key in ("kernel_us", "idle_us", "compute_us", "non_compute_us", "overlap_pct",
                "launches", "launch_delay_total_us", "idle_by_stream", "kernel_types",
                "memory_bw_samples", "queue_samples"):
        same = "same" if ours.result[key] == hta.result[key] else "DIFFERENT"
        line += f"\n    {key:22s} gpufleet {ours.result[key]!s:>30.30}  HTA {hta.result[key]!s:>30.30}  {same}"
    return line


def figure_lines(trace: Path, tmp: Path) -> str:
    """How many figures of each summary differ from HTA's own, from HTA's with a stable sort and
    from HTA's with a stable sort and an exact sum (equal: to 1e-9 relative)."""
    ours, *_, error = measure(sys.executable, FIGURES, trace, ROOT)
    proc = subprocess.run([str(HTA_PYTHON), str(ROOT / "benchmarks" / "hta_reference.py"), str(trace)],
                          check=False, capture_output=True, text=True, cwd=tmp)
    if ours is None or proc.returncode:
        return f"  figures: ERROR {error or proc.stderr.strip().splitlines()[-1:]}"
    hta = json.loads(proc.stdout)
    line = "  figures beside HTA (untimed; how many differ from HTA's own / with a stable sort / and an exact sum):"
    summaries = (
        ("memory bandwidth", memory_figures(ours["memory_copies"]),
         [_describe_rows(hta.get(k), "name", MEMORY_FIGURES) for k in ("memory_bw", "memory_bw_stable_sort",
                                                                        "memory_bw_fixed")]),
        ("queue length", queue_figures(ours["queue_lengths"]),
         [_describe_rows((hta.get(k) or {}).get("summary") if isinstance(hta.get(k), dict) else None, "stream",
                         QUEUE_FIGURES) for k in ("queue_length", "queue_length_stable_sort")]),
        ("idle by stream", idle_figures(ours["idle_by_stream"]),
         [{(r["stream"], r["idle_category"]): r["idle_time"] for r in hta.get(k) or [] if r["idle_time"]}
          if isinstance(hta.get(k), list) else {} for k in ("idle", "idle_stable_sort")]),
    )
    for label, mine, theirs in summaries:
        counts = " / ".join(str(_differing(mine, t)) for t in theirs)
        line += f"\n    {label:18s} {len(mine):5d} figures: {counts}"
    return line


def memory_figures(rows: list[dict]) -> dict:
    return {(m["kind"], key): m[field] for m in rows if m["bw_samples"] for field, key in MEMORY_FIGURES.items()}


def queue_figures(rows: list[dict]) -> dict:
    return {(q["stream"], key): q[field] for q in rows for field, key in QUEUE_FIGURES.items()}


def idle_figures(rows: list[dict]) -> dict:
    return {(s["stream"], c): s[f"{c}_us"] for s in rows for c in ("host_wait", "kernel_wait", "other")
            if s[f"{c}_us"]}


def _describe_rows(rows: list[dict] | None, key: str, figures: dict[str, str]) -> dict:
    return {(r[key], name): r[name] for r in rows or [] for name in figures.values()} if isinstance(rows, list) else {}


def _differing(ours: dict, theirs: dict) -> int:
    """The figures of either side that the other lacks or holds another value of."""
    def close(a, b) -> bool:
        if a is None or b is None:
            return a is b
        return a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b))

    return sum(
        1 for k in ours.keys() | theirs.keys() if k not in ours or k not in theirs or not close(ours[k], theirs[k])
    )


def alternately(ours_code: str, hta_code: str, trace: Path, repeat: int, have_hta: bool, tmp: Path,
                *extra: str) -> tuple[Runs, Runs]:
    """Each side ``repeat`` times on ``trace``, alternately, so that both see the same machine."""
    ours, hta = Runs(), Runs()
    for _ in range(repeat):
        ours.add(*measure(sys.executable, ours_code, trace, ROOT, *extra))
        if have_hta:
            hta.add(*measure(str(HTA_PYTHON), hta_code, trace, tmp, *extra))
    return ours, hta


def critical_path_lines(trace: Path, repeat: int, have_hta: bool, tmp: Path) -> str:
    ours, hta = alternately(OURS_CP, HTA_CP, trace, repeat, have_hta, tmp)
    line = f"  critical path\n    gpufleet (all {ours.result['steps'] if ours.result else '?'} steps):  {ours}"
    if have_hta:
        line += f"\n    HTA 0.5.0 (first step): {hta}"
        if not hta.error and not ours.error:
            line += (f"\n    ratio (medians): {hta.wall / ours.wall:5.1f}x faster, "
                     f"{ours.peak / hta.peak:5.2f} of HTA's memory")
            for key in ("path_us", "cpu_us", "gpu_compute_us", "communication_us", "launch_overhead_us",
                        "kernel_gap_us"):
                same = "same" if ours.result[key] == hta.result[key] else "DIFFERENT"
                line += (f"\n      first step {key:20s} gpufleet {ours.result[key]!s:>10}  "
                         f"HTA {hta.result[key]!s:>10}  {same}")
    return line


def kernel_sequence_lines(trace: Path, operator: str, repeat: int, have_hta: bool, tmp: Path) -> str:
    ours, hta = alternately(OURS_SEQ, HTA_SEQ, trace, repeat, have_hta, tmp, operator)
    found = len(ours.result["sequences"]) if ours.result else "?"
    line = f"  kernel sequences of {operator} ({found} found)\n    gpufleet:  {ours}"
    if have_hta:
        line += f"\n    HTA 0.5.0: {hta}"
        if not hta.error and not ours.error:
            same = "the same" if ours.result == hta.result else "DIFFERENT"
            line += (f"\n    ratio (medians): {hta.wall / ours.wall:5.1f}x faster, {ours.peak / hta.peak:5.2f} of "
                     f"HTA's memory; sequences, counts and times {same}")
    return line


class Runs:
    """Repeated runs of one side on one trace: median wall and CPU time, highest peak memory."""

    def __init__(self) -> None:
        self.walls: list[float] = []
        self.cpus: list[float] = []
        self.peak = 0.0
        self.result: dict | None = None
        self.error = ""

    def add(self, result: dict | None, wall: float, cpu: float, peak: float, error: str) -> None:
        self.walls.append(wall)
        self.cpus.append(cpu)
        self.peak = max(self.peak, peak)
        self.result, self.error = result, error or self.error

    @property
    def wall(self) -> float:
        return statistics.median(self.walls)

    @property
    def cpu(self) -> float:
        return statistics.median(self.cpus)

    def __str__(self) -> str:
        spread = f" ({min(self.walls):.2f}-{max(self.walls):.2f})" if len(self.walls) > 1 else ""
        return (f"{self.wall:6.2f} s{spread}, CPU {self.cpu:6.2f} s, {self.peak:7.0f} MiB peak"
                + (f"  ERROR {self.error}" if self.error else ""))

if __name__ == "__main__":
    main()
