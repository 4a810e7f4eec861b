"""A property-based campaign over every parser of outside input: the Avro codec, the sample
checks, the columnar decoding of sample blocks and the trace reader.

The property is the same everywhere: whatever comes in, out comes a result or the module's
own error with a reason (``CodecError``, ``TraceError``) -- never another exception, never a
crash. Hypothesis draws the structured inputs (records of every schema with hostile values,
blocks whose columns disagree, trace files of odd events); each structured example is then
damaged ``VARIANTS`` ways with a random generator Hypothesis seeds (truncated, bits flipped,
bytes spliced in), which costs far less than drawing a new example: 105,000 inputs in all
(``INPUTS``), in about a minute and a half. The seed is fixed, so CI runs the same campaign
each time; ``HYPOTHESIS_PROFILE=explore`` draws new inputs (and ``GPUFLEET_FUZZ_SCALE=10`` ten
times as many) to look further.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import struct
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producers.traces.read import TraceError, read_trace
from schemas.codec import SCHEMA_DIR, Codec, CodecError, load_catalog
from schemas.sample_columns import COLUMNS, blocks_of, samples_checked
from schemas.validate_ids import ids_error
from schemas.validate_sample import validate_sample
from streams.traces.analyze import TraceAnalyzer
from streams.traces.batch import columns_error, event_error
from streams.traces.sessions import TraceSessionConfig, TraceSessions

SCALE = float(os.environ.get("GPUFLEET_FUZZ_SCALE", "1"))
VARIANTS = 10  # damaged copies of each structured example
# Inputs per test: Hypothesis examples, times VARIANTS + 1 where an example is damaged.
INPUTS = {"bytes": 30_000, "mutations": 30_000, "samples": 25_000, "traces": 20_000, "kernel_events": 3_000}
EXAMPLES = {"bytes": INPUTS["bytes"], "kernel_events": INPUTS["kernel_events"],
            **{k: INPUTS[k] // (VARIANTS + 1) for k in ("mutations", "samples", "traces")}}

settings.register_profile("ci", derandomize=True, database=None, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("explore", database=None, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def campaign(name: str):
    return settings(max_examples=int(EXAMPLES[name] * SCALE))


CODEC = Codec()
CATALOG = load_catalog()
LATEST = {v.name: v for v in sorted(CATALOG, key=lambda v: v.version)}
SAMPLE_SCHEMAS = ("GpuSample", "GpuSampleBatch", "GpuSampleColumns")

# Strings a job's environment or a hostile host could send: control characters, markup,
# quotes, right-to-left overrides, lone surrogates are impossible in UTF-8 (Avro strings are).
hostile_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", " ", "wf\nBcc: x@example.com", "<script>", "'; DROP TABLE t; --", "\u202eevil", "a" * 300,
                     "idle", "unattributed", "slurm-1", "\x00", "../../etc/passwd"]),
)
numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1e308, -1e-308]))
longs = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, -1, 946_684_800_000, 2**62]))
ints = st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, -1, 1, 1000, 3_600_001]))


def avro(schema, named: dict | None = None):
    """Records that the Avro ``schema`` (as parsed from JSON) accepts, with hostile values."""
    named = {} if named is None else named
    if isinstance(schema, str):
        primitives = {"null": st.none(), "boolean": st.booleans(), "int": ints, "long": longs, "float": numbers,
                      "double": numbers, "string": hostile_text, "bytes": st.binary(max_size=40)}
        if schema in primitives:
            return primitives[schema]
        return st.deferred(lambda: named[schema.split(".")[-1]])
    if isinstance(schema, list):
        return st.one_of([avro(s, named) for s in schema])
    kind = schema["type"]
    if kind == "record":
        fields = {f["name"]: avro(f["type"], named) for f in schema["fields"]}
        named[schema["name"]] = st.fixed_dictionaries(fields)
        return named[schema["name"]]
    if kind == "array":
        return st.lists(avro(schema["items"], named), max_size=6)
    if kind == "map":
        return st.dictionaries(st.text(max_size=8), avro(schema["values"], named), max_size=4)
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    return avro(kind, named)


RAW = {v.name: json.loads((SCHEMA_DIR / v.file).read_text()) for v in LATEST.values()}
RECORDS = {name: avro(raw) for name, raw in RAW.items()}


@st.composite
def columns_block(draw):
    """A GpuSampleColumns record whose columns mostly agree on their length (and sometimes not)."""
    n = draw(st.integers(0, 5))
    fields = {f["name"]: f["type"] for f in RAW["GpuSampleColumns"]["fields"]}
    block = {k: draw(avro(fields[k])) for k in ("host", "workflow_id", "owner", "team")}
    for k in COLUMNS:
        kind = fields[k]
        nullable = isinstance(kind, list)
        items = (kind[1] if nullable else kind)["items"]
        if nullable and draw(st.booleans()):
            block[k] = None
            continue
        length = n if draw(st.integers(0, 9)) else draw(st.integers(0, 6))
        block[k] = draw(st.lists(avro(items), min_size=length, max_size=length))
    return block


def check_samples(name: str, record: dict) -> None:
    """What the worker and the sink do with a decoded message that may carry samples."""
    if name not in SAMPLE_SCHEMAS:
        return
    for sample, reason in samples_checked(name, record):
        assert reason is None or (isinstance(reason, str) and reason)
        if sample is not None and reason is None:
            assert validate_sample(sample) is None
    good, reasons = blocks_of(name, record)
    assert all(isinstance(r, str) and r for r in reasons)
    for block in good:  # what passes as a block passes sample by sample too
        for sample, reason in samples_checked("GpuSampleColumns", block):
            assert reason is None, reason


def decode_or_say_why(data: bytes) -> None:
    try:
        name, record = CODEC.decode(data)
    except CodecError as exc:
        assert str(exc)
        return
    check_samples(name, record)
    check_kernel_events(name, record)


def check_kernel_events(name: str, record: dict) -> None:
    """What the trace stage does with a decoded message on its topic: refused with a reason, or
    analysed (and the trace ended, so that every analysis gives its result) without a crash."""
    if name not in ("KernelEventColumns", "KernelEvent"):
        return
    reason = ids_error(record) or (columns_error(record) if name == "KernelEventColumns" else event_error(record))
    if reason is not None:
        assert isinstance(reason, str) and reason
        return
    end = {"trace_id": record["trace_id"], "workflow_id": record["workflow_id"], "rank": record["rank"],
           "events": 1, "events_read": 1, "source": None, "partial": False, "error": None, "last_step_dropped": False,
           "memory_peak_bytes": None, "memory_total_bytes": None, "flops": None, "gpu_name": None, "published_at": 0,
           "system": None}
    result = TraceSessions(TraceSessionConfig(), {}).apply(0, [(name, record), ("TraceEnd", end)], now_ms=0)
    (analysis,) = result.analyses
    CODEC.encode("TraceAnalysis", analysis)  # what the stage publishes: on the wire as it is
    for finding in result.findings:
        CODEC.encode("Finding", finding)


@st.composite
def kernel_columns(draw):
    """A KernelEventColumns record whose columns mostly hold together (and sometimes not), with
    hostile names, times and ids."""
    n = draw(st.integers(1, 8))
    fields = {f["name"]: f["type"] for f in RAW["KernelEventColumns"]["fields"]}
    strings = draw(st.lists(st.one_of(hostile_text, st.sampled_from(
        ["kernel", "cuda_runtime", "gpu_memcpy", "cudaLaunchKernel", "cudaMemcpyAsync",
         "Memcpy DtoD (Device -> Device)", "ncclKernel_AllReduce", "ProfilerStep#1", "DataLoader",
         "gpu_user_annotation", "sm90_gemm"])),
        min_size=1, max_size=8))
    index = st.integers(0, len(strings) - 1) if draw(st.integers(0, 9)) else ints
    record = {k: draw(avro(fields[k])) for k in ("trace_id", "workflow_id", "rank")}
    record.update(first_seq=draw(st.one_of(st.integers(0, 10), longs)), strings=strings)
    small = st.one_of(st.integers(-5, 50), longs)
    column = {"kind": avro(fields["kind"]["items"]), "cat": index, "name": index, "ts": small, "dur": small,
              "stream": st.one_of(st.integers(-1, 3), ints), "device": ints,
              "correlation": st.one_of(st.integers(-1, 5), longs), "tid": st.one_of(st.integers(-1, 2), longs)}
    for k, values in column.items():
        length = n if draw(st.integers(0, 19)) else draw(st.integers(0, 9))
        record[k] = draw(st.lists(values, min_size=length, max_size=length))
    record["extras"] = draw(st.lists(avro(fields["extras"]["items"]), max_size=3))
    for x in record["extras"]:
        if draw(st.integers(0, 9)):
            x["row"] = draw(st.integers(0, n - 1))
    return record


@campaign("kernel_events")
@given(kernel_columns())
def test_hostile_kernel_event_columns_are_refused_with_a_reason_or_analysed(record):
    try:
        data = CODEC.encode("KernelEventColumns", record)
    except CodecError:
        return  # a value the schema cannot carry: never on the wire
    decode_or_say_why(data)


@campaign("bytes")
@given(st.one_of(
    st.binary(max_size=64),
    st.tuples(st.sampled_from(sorted(v.id for v in CATALOG)), st.binary(max_size=300)).map(
        lambda t: struct.pack(">BI", 0, t[0]) + t[1]),
))
def test_any_bytes_decode_or_say_why(data):
    decode_or_say_why(data)


def damaged(data: bytes, rng, keep: int = 0) -> bytes:
    """``data`` cut short, with bits flipped, or with bytes appended or spliced in (the first
    ``keep`` bytes left alone: a header that must stay recognisable)."""
    data = bytearray(data)
    how = rng.choice(("truncate", "flip", "append", "splice"))
    if how == "truncate":
        del data[rng.randint(0, len(data)):]
    elif how == "flip" and len(data) > keep:
        for _ in range(rng.randint(1, 4)):
            data[rng.randint(keep, len(data) - 1)] ^= 1 << rng.randint(0, 7)
    elif how == "append":
        data += rng.randbytes(rng.randint(1, 16))
    else:
        i = rng.randint(min(keep, len(data)), len(data))
        data[i:i] = rng.randbytes(rng.randint(1, 8))
    return bytes(data)


@campaign("mutations")
@given(st.sampled_from(sorted(RECORDS)).flatmap(
    lambda name: st.tuples(st.just(name), columns_block() if name == "GpuSampleColumns" else RECORDS[name])),
    st.randoms(use_true_random=False))
def test_damaged_records_of_every_schema_decode_or_say_why(named, rng):
    name, record = named
    data = CODEC.encode(name, record)
    decode_or_say_why(data)
    for _ in range(VARIANTS):
        decode_or_say_why(damaged(data, rng, keep=rng.choice((0, 5))))


def hostile_variant(name: str, record: dict, rng) -> dict:
    """``record`` with one value made impossible or hostile: NaN, infinities, negatives, a
    time in the future or before 2000, an id with a newline, a column of another length."""
    record = dict(record)
    rows = record if name == "GpuSample" else None
    if name == "GpuSampleBatch":
        if not record["samples"]:
            return record
        record["samples"] = list(record["samples"])
        i = rng.randrange(len(record["samples"]))
        rows = record["samples"][i] = dict(record["samples"][i])
    if rows is not None:
        field = rng.choice([k for k, v in rows.items() if isinstance(v, int | float | str)] or ["workflow_id"])
    else:
        field = rng.choice(("host", "workflow_id", "owner", "team", *COLUMNS))
    bad = rng.choice((math.nan, math.inf, -math.inf, -1, 0, 2**62, 10**4, "wf\nBcc: x", "", " ", "a" * 300))
    target = rows if rows is not None else record
    if rows is None and field in COLUMNS:
        column = record[field]
        if column is None or not column or rng.random() < 0.2:
            record[field] = [] if column else [0]  # a column of another length
            return record
        column = list(column)
        column[rng.randrange(len(column))] = bad
        target[field] = column
    else:
        target[field] = bad
    return record


def check_record(name: str, record: dict) -> None:
    """Through the codec (which refuses what the schema cannot hold) and the sample checks."""
    try:
        data = CODEC.encode(name, record)
    except CodecError:
        return  # a value the schema cannot carry: never on the wire
    name, decoded = CODEC.decode(data)
    check_samples(name, decoded)
    if name == "GpuSample":
        util = decoded["utilization_pct"]
        if util is not None and not 0 <= util <= 100:  # NaN included
            assert validate_sample(decoded) is not None


@campaign("samples")
@given(st.one_of(st.tuples(st.just("GpuSampleColumns"), columns_block()),
                 st.tuples(st.just("GpuSample"), RECORDS["GpuSample"]),
                 st.tuples(st.just("GpuSampleBatch"), RECORDS["GpuSampleBatch"])),
       st.randoms(use_true_random=False))
def test_impossible_and_hostile_samples_are_refused_with_a_reason_never_a_crash(named, rng):
    name, record = named
    check_record(name, record)
    for _ in range(VARIANTS):
        check_record(name, hostile_variant(name, record, rng))


event_values = st.one_of(st.none(), st.booleans(), longs, numbers, hostile_text, st.lists(ints, max_size=3))
kineto_event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "i", "f", "s"]), "cat": st.one_of(st.sampled_from(
        ["kernel", "cuda_runtime", "cpu_op", "gpu_memcpy", "user_annotation", "Trace", "cuda_sync"]), event_values),
     "name": st.one_of(st.sampled_from(["sgemm", "ProfilerStep#1", "ProfilerStep#2", "cudaLaunchKernel", "[memory]",
                                        "Event Sync", "Stream Wait Event", "Context Sync", "cudaGraphLaunch",
                                        "cudaStreamSynchronize", "cudaEventRecord", "cudaMemcpy", "aten::linear"]),
                       event_values),
     "ts": st.one_of(longs, numbers, event_values), "dur": st.one_of(ints, numbers, event_values)},
    optional={"pid": event_values, "tid": event_values,
              "args": st.one_of(event_values, st.dictionaries(
                  st.sampled_from(["stream", "correlation", "device", "bytes", "Total Allocated", "Device Id",
                                   "External id", "grid", "block", "wait_on_stream",
                                   "wait_on_cuda_event_record_corr_id"]), event_values, max_size=5))},
)


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN; the reader sees a string where a number belongs
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


@st.composite
def trace_file(draw):
    events = [_json_safe(e) for e in draw(st.lists(kineto_event, max_size=12))]
    doc = {"schemaVersion": 1, "distributedInfo": draw(st.one_of(
        st.fixed_dictionaries({"rank": event_values}), event_values)), "traceEvents": events}
    if draw(st.booleans()):  # as the profiler lays it out: the block reader's path
        body = ",\n".join("  {\n    " + json.dumps(e)[1:-1] + "\n  }" for e in events)
        return ('{\n  "schemaVersion": 1,\n  "traceEvents": [\n' + body + "\n]}").encode()
    return json.dumps(doc).encode()


TRACE_DIR = Path(tempfile.mkdtemp(prefix="gpufleet-fuzz-"))


def read_or_say_why(data: bytes) -> None:
    path = TRACE_DIR / ("t.json.gz" if data[:2] == b"\x1f\x8b" else "t.json")
    path.write_bytes(data)
    try:
        read = read_trace(path)
    except TraceError as exc:
        assert str(exc)
        return
    assert read.partial in (True, False)
    if read.partial:
        assert read.error
    for event in read.events:
        assert isinstance(event["ts"], int) and isinstance(event["name"], str)
    # What gpufleet analyze --critical-path --kernel-sequences does with what was read
    read = read_trace(path, cpu_ops=True)
    analyzer = TraceAnalyzer(critical_path=True, infer_syncs=read.sync_events == 0,
                             kernel_sequences=["aten::linear", "sgemm", ""])
    for event in read.events:
        analyzer.add(event)
    result = analyzer.result()
    for step in result["critical_path"]["steps"]:
        parts = sum(step[k] for k in ("cpu_us", "gpu_compute_us", "communication_us", "launch_overhead_us",
                                      "kernel_gap_us"))
        assert step["path_us"] >= 0 and math.isclose(parts, step["path_us"], rel_tol=1e-9, abs_tol=1e-6)
    for found in result["kernel_sequences"].values():
        assert all(s["count"] >= 1 and len(s["sequence"]) >= 4 for s in found["top"])


@campaign("traces")
@given(trace_file(), st.randoms(use_true_random=False))
def test_any_trace_file_is_read_or_refused_with_a_reason(data, rng):
    read_or_say_why(data)
    for _ in range(VARIANTS):
        variant = damaged(data, rng) if rng.random() < 0.7 else data
        if rng.random() < 0.3:  # compressed, and maybe cut short after that
            variant = gzip.compress(variant)
            if rng.random() < 0.5:
                variant = variant[:rng.randint(0, len(variant))]
        read_or_say_why(variant)
