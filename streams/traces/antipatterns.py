"""What the antipattern rules need from one rank's trace, collected in the same pass as the
analysis: ``AntipatternCollector`` is fed the same time-ordered events as the analysers and
keeps O(streams) state plus a fixed-size utilisation histogram; its ``summary()`` is what
``streams.traces.rules`` judges."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import msgspec

from streams.traces.analysis import Finished, Options
from streams.traces.batch import EventBatch

if TYPE_CHECKING:
    from streams.traces.launch_stats import Call

GAP_US = 500_000
CHUNKS = 30
CHUNK_UTILIZATION = 0.5
HIST_BUCKETS = 1024
SYNC_CALLS = frozenset({"cudaDeviceSynchronize", "cudaStreamSynchronize"})
SMALL_HTOD_BYTES = 64_000
TRAIN_LENGTH = 10
SHORT_CALL_US = 50
MATMUL_RE = re.compile(r"gemm|conv|cutlass|cudnn|wgrad|dgrad|fprop|matmul|xmma", re.IGNORECASE)
TENSOR_CORE_RE = re.compile(
    r"h884|h1688|s1688|i8816|hmma|wmma|tensorop|xmma|_tc_|bf16|f16f16|fp16|half|gmma|sm80_|sm90_|884|1688|16816",
    re.IGNORECASE,
)


def _matmul_kind(name: str) -> tuple[bool, bool]:
    """(a GEMM or convolution kernel, on tensor cores). Kernel names are long C++ templates
    and a trace repeats a few hundred of them thousands of times: match each once."""
    matmul = MATMUL_RE.search(name) is not None
    kind = _MATMUL_KINDS[name] = (matmul, matmul and TENSOR_CORE_RE.search(name) is not None)
    if len(_MATMUL_KINDS) > 65_536:
        _MATMUL_KINDS.clear()
        _MATMUL_KINDS[name] = kind
    return kind


_MATMUL_KINDS: dict[str, tuple[bool, bool]] = {}


class AntipatternCollector(msgspec.Struct):
    # GPU busy coverage, for gaps and the utilisation histogram
    first_ts: float | None = None
    group_start: float = 0.0
    group_end: float = 0.0
    gaps: int = 0
    gap_us: float = 0.0
    bucket_us: float = 1000.0
    buckets: list[float] = msgspec.field(default_factory=list)
    # synchronisation and copies
    sync_calls: int = 0
    sync_us: float = 0.0
    sync_memcpy: int = 0
    sync_memcpy_us: float = 0.0
    pageable_async: int = 0
    pageable_async_us: float = 0.0
    pageable_async_bytes: int = 0
    sync_memset: int = 0
    sync_memset_us: float = 0.0
    # trains of short kernels, per stream: [current run length, idle inside the run, previous end]
    runs: dict[int, list[float]] = msgspec.field(default_factory=dict)
    trains: int = 0
    train_kernels: int = 0
    train_idle_us: float = 0.0
    # input pipeline: DataLoader time, and its union with GPU busy time
    dataloader: list[float] = msgspec.field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])  # Coverage fields
    dataloader_or_gpu: list[float] = msgspec.field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    dataloader_seen: bool = False
    # precision
    matmul_us: float = 0.0
    matmul_tensor_core_us: float = 0.0
    compute_kernel_us: float = 0.0

    # -- feeding ---------------------------------------------------------------------------
    @classmethod
    def create(cls, options: Options) -> AntipatternCollector:
        return cls()

    def add(self, batch: EventBatch) -> None:
        """The batch's events, CPU- and GPU-side, in start order: each concern over the rows it reads."""
        names, kinds, durs, streams = batch.name, batch.kind, batch.dur, batch.stream
        for i in [i for i, name in enumerate(names) if name in SYNC_CALLS]:
            if streams[i] < 0 and kinds[i] == "runtime":
                self.sync_calls += 1
                self.sync_us += durs[i]
        loaders = [i for i, name in enumerate(names) if "DataLoader" in name]
        loaders = [i for i in loaders if streams[i] < 0 and kinds[i] == "cpu_op"]
        self._busy_time(batch, sorted(batch.gpu + loaders) if loaders else batch.gpu)
        self._kernels(batch)
        calls, extras, gpu = batch.calls, batch.extras, batch.gpu
        for j, kind in enumerate(batch.g_kind):
            if (kind == "memcpy" or kind == "memset") and calls[j] is not None:
                self._copy(kind, batch.g_name[j], batch.g_dur[j], extras.get(gpu[j], _NONE), calls[j])

    def _busy_time(self, batch: EventBatch, rows: list[int]) -> None:
        """The GPU's busy time (its gaps and the utilisation histogram) and its union with the
        input pipeline's time (DataLoader ranges on the CPU), over ``rows`` in start order."""
        starts, ends, streams = batch.ts, batch.end, batch.stream
        first, group_start, group_end = self.first_ts, self.group_start, self.group_end
        union = self.dataloader_or_gpu
        seen, union_start, union_end, union_closed = union
        for i in rows:
            ts, end = starts[i], ends[i]
            if streams[i] < 0:  # a DataLoader range
                self.dataloader_seen = True
                _cov_add(self.dataloader, ts, end)
            elif first is None:
                first, group_start, group_end = ts, ts, end
                self.first_ts = first
            elif ts > group_end:
                gap = ts - group_end
                if gap >= GAP_US:
                    self.gaps += 1
                    self.gap_us += gap
                # (most closed groups fall in one bucket: added here, as _histogram would)
                width, buckets = self.bucket_us, self.buckets
                k = int((group_start - first) // width)
                if first <= group_start < group_end <= first + (k + 1) * width and k < len(buckets) \
                        and group_end - first <= width * HIST_BUCKETS:  # (a rounded kernel may end before it starts)
                    buckets[k] += group_end - group_start
                else:
                    self._histogram(group_start, group_end)
                group_start, group_end = ts, end
            elif end > group_end:
                group_end = end
            if not seen:
                seen, union_start, union_end, union_closed = 1.0, ts, end, 0.0
            elif ts > union_end:
                union_closed += union_end - union_start
                union_start, union_end = ts, end
            elif end > union_end:
                union_end = end
        self.group_start, self.group_end = group_start, group_end
        union[:] = [seen, union_start, union_end, union_closed]

    def _kernels(self, batch: EventBatch) -> None:
        """The kernels: the compute time, its share in matrix multiplies (on tensor cores or not),
        and the trains of short launches on each stream."""
        runs, matmul_kinds = self.runs, _MATMUL_KINDS
        for kind, cat, name, ts, end, dur, stream, call in zip(batch.g_kind, batch.g_cat, batch.g_name, batch.g_ts,
                                                               batch.g_end, batch.g_dur, batch.g_stream, batch.calls):
            if kind != "kernel" or (cat != "kernel" and cat != "Kernel"):
                continue
            self.compute_kernel_us += dur
            matmul = matmul_kinds.get(name)
            if matmul is None:
                matmul = _matmul_kind(name)
            if matmul[0]:
                self.matmul_us += dur
                if matmul[1]:
                    self.matmul_tensor_core_us += dur
            run = runs.get(stream)
            if run is None:
                run = runs[stream] = [0, 0.0, end]
            if call is not None and call.dur <= SHORT_CALL_US and dur < call.dur:  # a short launch
                if run[0] > 0:
                    run[1] += max(0.0, ts - run[2])
                run[0] += 1
            elif run[0]:
                self._close_train(run)
            else:
                run[1] = 0.0
            run[2] = end

    def _copy(self, kind: str, name: str, dur: float, extras: dict, call: Call) -> None:
        """A copy or set and its runtime call: synchronous ones, and asynchronous ones from pageable memory."""
        if kind == "memset":
            if call.name == "cudaMemset":
                self.sync_memset += 1
                self.sync_memset_us += call.dur
        elif call.name == "cudaMemcpy":
            nbytes = extras.get("bytes") or 0
            same_device = "DtoD" in name
            small_upload = "HtoD" in name and nbytes <= SMALL_HTOD_BYTES
            if not (same_device or small_upload):
                self.sync_memcpy += 1
                self.sync_memcpy_us += call.dur
        elif call.name == "cudaMemcpyAsync" and "Pageable" in name:
            self.pageable_async += 1
            self.pageable_async_us += dur
            self.pageable_async_bytes += extras.get("bytes") or 0

    def _close_train(self, run: list[float]) -> None:
        if run[0] >= TRAIN_LENGTH:
            self.trains += 1
            self.train_kernels += int(run[0])
            self.train_idle_us += run[1]
        run[0], run[1] = 0, 0.0

    def _histogram(self, start: float, end: float) -> None:
        """Add covered time [start, end) to buckets of ``bucket_us`` from the first event,
        doubling the bucket width (folding pairs) to stay within HIST_BUCKETS."""
        origin = self.first_ts or 0.0
        while end - origin > self.bucket_us * HIST_BUCKETS:
            b = self.buckets
            self.buckets = [sum(b[i:i + 2]) for i in range(0, len(b), 2)]
            self.bucket_us *= 2
        w = self.bucket_us
        pos = max(start, origin)  # (GPU time before the first event's start: events out of order, none to count)
        while pos < end:
            i = int((pos - origin) // w)
            stop = min(end, origin + (i + 1) * w)
            if stop <= pos:  # (times beyond what a double holds to the microsecond: no further step)
                break
            if i >= len(self.buckets):
                self.buckets.extend([0.0] * (i + 1 - len(self.buckets)))
            self.buckets[i] += stop - pos
            pos = stop

    # -- results -----------------------------------------------------------------------------
    def result(self, finished: Finished) -> dict:
        return {"antipatterns": self.summary()}

    def summary(self) -> dict:
        """Evidence numbers (closes the open GPU interval and open trains on a copy)."""
        c = AntipatternCollector.restore(self.snapshot())
        if c.first_ts is not None:
            c._histogram(c.group_start, c.group_end)
        for run in c.runs.values():
            c._close_train(run)
        chunks = c._chunks()
        dl = _cov_total(c.dataloader)
        dl_gpu_union = _cov_total(c.dataloader_or_gpu)
        gpu_busy = sum(c.buckets)
        return {
            "gpu_gaps": c.gaps, "gpu_gap_us": c.gap_us,
            "low_utilization_chunks": [i for i, u in enumerate(chunks) if u < CHUNK_UTILIZATION],
            "chunk_utilization": chunks,
            "chunk_us": (c.group_end - c.first_ts) / CHUNKS if c.first_ts is not None else 0.0,
            "sync_calls": c.sync_calls, "sync_us": c.sync_us,
            "sync_memcpy": c.sync_memcpy, "sync_memcpy_us": c.sync_memcpy_us,
            "pageable_async": c.pageable_async, "pageable_async_us": c.pageable_async_us,
            "pageable_async_bytes": c.pageable_async_bytes,
            "sync_memset": c.sync_memset, "sync_memset_us": c.sync_memset_us,
            "trains": c.trains, "train_kernels": c.train_kernels, "train_idle_us": c.train_idle_us,
            "dataloader_us": dl if c.dataloader_seen else None,
            # GPU idle while DataLoader work ran = |DL| - |DL and GPU| = |DL or GPU| - |GPU|
            "gpu_idle_in_dataloader_us": (dl_gpu_union - gpu_busy) if c.dataloader_seen else None,
            "matmul_us": c.matmul_us, "matmul_tensor_core_us": c.matmul_tensor_core_us,
            "compute_kernel_us": c.compute_kernel_us,
        }

    def _chunks(self) -> list[float]:
        if self.first_ts is None or self.group_end <= self.first_ts:
            return []
        span = self.group_end - self.first_ts
        chunk = span / CHUNKS
        w = self.bucket_us
        buckets = self.buckets
        out = []
        for k in range(CHUNKS):
            lo, hi = k * chunk, (k + 1) * chunk
            covered = 0.0
            for i in range(int(lo // w), min(len(buckets), int(hi // w) + 1)):  # the buckets it touches
                overlap = min(hi, (i + 1) * w) - max(lo, i * w)
                if overlap > 0:
                    covered += buckets[i] * overlap / w  # busy time assumed even within a bucket
            out.append(min(1.0, covered / chunk))
        return out

    def to_state(self) -> dict:
        return {"antipatterns": self.snapshot()}

    def snapshot(self) -> dict:
        state = msgspec.to_builtins(self)  # new lists and dicts: a snapshot, not a view
        state["runs"] = {str(k): v for k, v in state["runs"].items()}
        return state

    @classmethod
    def from_state(cls, state: dict, options: Options) -> AntipatternCollector:
        return cls.restore(state["antipatterns"])

    @classmethod
    def restore(cls, state: dict) -> AntipatternCollector:
        c = cls(**{name: state[name] for name in cls.__struct_fields__})
        c.runs = {int(k): list(v) for k, v in state["runs"].items()}
        c.buckets = list(state["buckets"])
        c.dataloader = list(state["dataloader"])
        c.dataloader_or_gpu = list(state["dataloader_or_gpu"])
        return c


_NONE: dict = {}


def _cov_add(cov: list[float], ts: float, end: float) -> None:
    """Union of intervals fed in start order (as ``coverage.Coverage``), kept in
    a JSON-able 4-float list [seen, start, end, closed] so that it checkpoints as it is."""
    if not cov[0]:
        cov[:] = [1.0, ts, end, 0.0]
    elif ts > cov[2]:
        cov[3] += cov[2] - cov[1]
        cov[1], cov[2] = ts, end
    elif end > cov[2]:
        cov[2] = end


def _cov_total(cov: list[float]) -> float:
    return cov[3] + cov[2] - cov[1] if cov[0] else 0.0
