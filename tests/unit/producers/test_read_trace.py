"""Reading trace files: gzip or not, damaged files, and the real traces in shared/traces."""

import gc
import gzip

import pytest

from gpufleet.analyze import analyze_file
from producers.traces.read import TraceError, open_trace, read_trace
from tests.support.traces import SHARED_TRACES, cpu_op, kernel, runtime, write_trace


def test_gzip_and_plain_read_the_same(tmp_path):
    events = [runtime("cudaLaunchKernel", 0, 2, corr=1), kernel("gemm", 3, 4, corr=1)]
    plain = read_trace(write_trace(tmp_path / "a.json", events))
    gz = read_trace(write_trace(tmp_path / "a.json.gz", events, gz=True))
    assert plain.events == gz.events and len(plain.events) == 2
    assert not plain.partial and plain.error is None


def test_kineto_layout_and_generic_json_read_the_same(tmp_path):
    events = [runtime("cudaLaunchKernel", i * 10, 2, corr=i) for i in range(50)]
    events += [kernel("gemm", i * 10 + 3, 4, corr=i) for i in range(50)]
    generic = read_trace(write_trace(tmp_path / "a.json", events))
    kineto = read_trace(write_trace(tmp_path / "b.json.gz", events, gz=True, kineto_layout=True))
    assert kineto.events == generic.events and kineto.events_seen == generic.events_seen == 101
    assert not kineto.partial


def test_unusual_items_in_a_kineto_block_read_as_the_generic_parser_reads_them(tmp_path):
    # An args that is not an object and an event with null fields do not fit the typed
    # parse of a block: that block is parsed generically, with the same result.
    events = [runtime("cudaLaunchKernel", i * 10, 2, corr=i) for i in range(40)]
    events += [kernel("gemm", i * 10 + 3, 4, corr=i) for i in range(40)]
    events[5]["args"] = ["not", "an", "object"]
    events[6]["dur"] = None
    generic = read_trace(write_trace(tmp_path / "a.json", events))
    kineto = read_trace(write_trace(tmp_path / "b.json", events, kineto_layout=True))
    assert kineto.events == generic.events and not kineto.partial
    assert kineto.events_seen == generic.events_seen == 81
    assert len(kineto.events) == 79  # the call without dur is not kept
    call = next(e for e in kineto.events if e["ts"] == 50 and e["kind"] == "runtime")
    assert call["correlation"] == -1  # its args were not an object: read as none


@pytest.mark.parametrize("kineto_layout", [False, True])
def test_an_event_named_by_a_number_is_read_not_a_crash(tmp_path, kineto_layout):
    events = [runtime("cudaLaunchKernel", 0, 2, corr=1), kernel("gemm", 3, 4, corr=1), cpu_op("x", 1, 1)]
    events[2]["name"] = 17
    events[0]["name"] = None
    trace = read_trace(write_trace(tmp_path / "t.json", events, kineto_layout=kineto_layout))
    assert not trace.partial and [e["name"] for e in trace.events] == ["", "gemm"]


@pytest.mark.parametrize("kineto_layout", [False, True])
def test_a_name_that_would_drive_a_terminal_or_forge_a_line_is_read_with_those_characters_escaped(
        tmp_path, kineto_layout):
    """An operator's or annotation's name is the training code's to choose (``record_function``),
    and a trace is its job's. Before, ``gpufleet analyze`` and ``diff`` printed the names as they
    came: an escape sequence cleared the operator's screen (or set their clipboard), a newline
    drew a line of the trace's choosing in the report, in an owner's e-mail and in a webhook's
    message. Control, format and line-separating characters are read as their escapes; every
    other name (a template kernel's, a name in any script) as it is."""
    hostile = "step\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07\nTry: rm -rf ~\u2028\u202e"
    events = [runtime("cudaLaunchKernel", 0, 2, corr=1), kernel("fill_kernel<float>", 3, 4, corr=1),
              cpu_op(hostile, 1, 1), cpu_op("名前\u00a0x", 2, 1)]
    trace = read_trace(write_trace(tmp_path / "t.json", events, kineto_layout=kineto_layout), cpu_ops=True)
    names = {e["name"] for e in trace.events}
    assert r"step\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07\nTry: rm -rf ~\u2028\u202e" in names
    assert {"fill_kernel<float>", "名前\u00a0x"} <= names  # (a no-break space is printed as one: kept)


@pytest.mark.parametrize("kineto_layout", [False, True])
@pytest.mark.parametrize("field, value", [("cat", []), ("cat", 7), ("dur", ""), ("ts", "3"), ("ts", 1e300),
                                          ("dur", True), ("ts", 2**60)])
def test_an_event_with_a_time_or_category_of_the_wrong_type_is_skipped_not_a_crash(tmp_path, kineto_layout, field,
                                                                                  value):
    """Found by tests/property: a category [] raised 'unhashable type', a duration "" a TypeError."""
    events = [runtime("cudaLaunchKernel", 0, 2, corr=1), kernel("gemm", 3, 4, corr=1), kernel("relu", 9, 1, corr=2)]
    events[2][field] = value
    trace = read_trace(write_trace(tmp_path / "t.json", events, kineto_layout=kineto_layout))
    assert not trace.partial and [e["name"] for e in trace.events] == ["cudaLaunchKernel", "gemm"]
    assert trace.events_seen == 4


@pytest.mark.parametrize("kineto_layout", [False, True])
@pytest.mark.parametrize("tid", [[], {"a": 1}, [1, 2], 2.5, True, "worker thread"])
def test_an_event_whose_thread_is_of_any_type_is_read_not_a_crash(tmp_path, kineto_layout, tid):
    """Found by tests/property (this session's full run): a thread id [] raised 'unhashable
    type: list' in the reader instead of reading the event or saying why not."""
    events = [cpu_op("aten::mm", 0, 10), runtime("cudaLaunchKernel", 1, 2, corr=1), kernel("gemm", 3, 4, corr=1)]
    events[0]["tid"] = events[1]["tid"] = tid
    trace = read_trace(write_trace(tmp_path / "t.json", events, kineto_layout=kineto_layout))
    assert not trace.partial and {e["name"] for e in trace.events} >= {"cudaLaunchKernel", "gemm"}


@pytest.mark.parametrize("kineto_layout", [False, True])
@pytest.mark.parametrize("field, value", [("stream", 9.223372036854776e18), ("stream", 2**64),
                                          ("correlation", -(2**70)), ("device", 2**63)])
def test_an_id_beyond_64_bits_is_read_as_none_not_a_crash(tmp_path, kineto_layout, field, value):
    """Found by tests/property: a stream of 9.2e18 raised 'int too big to convert'."""
    events = [runtime("cudaLaunchKernel", 0, 2, corr=1), kernel("gemm", 3, 4, corr=1), kernel("relu", 9, 1, corr=2)]
    events[2]["args"][field] = value
    trace = read_trace(write_trace(tmp_path / "t.json", events, kineto_layout=kineto_layout))
    assert {e["name"] for e in trace.events} >= {"cudaLaunchKernel", "gemm"}
    # read (the id as none), or, where the streaming parser cannot hold the number, damage with a reason
    assert not trace.partial or "damaged after 2 events" in trace.error


def test_a_number_too_large_for_the_streaming_parser_ends_the_read_as_damage(tmp_path):
    events = [runtime("cudaLaunchKernel", 0, 2, corr=1), kernel("gemm", 3, 4, corr=1), kernel("relu", 9, 1, corr=2)]
    events[2]["ts"] = 10**30  # beyond 64 bits: ijson stops there
    trace = read_trace(write_trace(tmp_path / "t.json", events))
    assert trace.partial and "trace damaged after 2 events" in trace.error and len(trace.events) == 2


def test_objects_after_trace_events_are_not_read_as_events(tmp_path):
    # After traceEvents, top-level objects close with "  }" lines too: the block that holds
    # the end of traceEvents is cut there.
    events = [kernel("gemm", i * 10, 5, corr=i) for i in range(300)]
    path = write_trace(tmp_path / "t.json", events, kineto_layout=True)
    text = path.read_text()
    assert text.endswith("\n]}")
    path.write_text(text[:-1] + ',\n  "distributedInfo": {\n    "rank": 3\n  },\n  "x": [\n  {\n  }\n  ]\n}')
    trace = read_trace(path)
    assert not trace.partial and trace.events_seen == 301 and len(trace.events) == 300


@pytest.mark.parametrize("kineto_layout", [False, True])
def test_truncated_trace_is_analysed_up_to_the_damage(tmp_path, kineto_layout):
    events = [kernel("gemm", i * 10, 5, corr=i) for i in range(200)]
    path = write_trace(tmp_path / "t.json", events, kineto_layout=kineto_layout)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    trace = read_trace(path)
    assert trace.partial and "damaged" in trace.error
    assert 50 < len(trace.events) < 200
    result = analyze_file(path)
    assert result["partial"] and "damaged" in result["error"] and result["gpu_events"] == len(trace.events)


def test_corrupt_event_in_the_middle_stops_there(tmp_path):
    events = [kernel("gemm", i * 10, 5, corr=i) for i in range(100)]
    path = write_trace(tmp_path / "t.json", events, kineto_layout=True)
    data = path.read_bytes()
    cut = data.index(b'"ts": 500')
    path.write_bytes(data[:cut] + b'"ts": 5#0' + data[cut + 9:])
    trace = read_trace(path)
    assert trace.partial and "invalid event" in trace.error
    assert len(trace.events) == 50


def test_an_event_that_lost_its_start_is_damage_not_skipped(tmp_path):
    events = [kernel("gemm", i * 10, 5, corr=i) for i in range(100)]
    path = write_trace(tmp_path / "t.json", events, kineto_layout=True)
    data = path.read_bytes()
    start = data.index(b'\n  {\n    "ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 500')
    path.write_bytes(data[:start] + data[start + 4:])  # the "  {" line of the 51st event is gone
    trace = read_trace(path)
    assert trace.partial and "not an event" in trace.error
    assert len(trace.events) == 50


def test_truncated_gzip_is_partial(tmp_path):
    events = [kernel("gemm", i * 10, 5, corr=i) for i in range(2000)]
    path = write_trace(tmp_path / "t.json.gz", events, gz=True, kineto_layout=True)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    trace = read_trace(path)
    assert trace.partial and trace.error
    assert 0 < len(trace.events) < 2000


def test_gzip_members_and_padding_read_as_one_file(tmp_path):
    # gzip.open reads concatenated members and skips zero padding after them: so do we.
    events = [kernel("gemm", i * 10, 5, corr=i) for i in range(3000)]
    plain = write_trace(tmp_path / "t.json", events, kineto_layout=True)
    data = plain.read_bytes()
    cut = len(data) // 3
    (tmp_path / "m.json.gz").write_bytes(gzip.compress(data[:cut]) + gzip.compress(data[cut:]) + b"\0" * 512)
    assert read_trace(tmp_path / "m.json.gz").events == read_trace(plain).events
    with open_trace(tmp_path / "m.json.gz") as fh:
        assert fh.read(10) == data[:10] and fh.read() == data[10:] and fh.read(10) == b""


def test_gzip_cut_before_any_event_is_a_clear_error(tmp_path):
    data = write_trace(tmp_path / "t.json.gz", [kernel("gemm", 0, 5)], gz=True).read_bytes()
    (tmp_path / "cut.json.gz").write_bytes(data[:12])
    with pytest.raises(TraceError, match="no event could be read"):
        read_trace(tmp_path / "cut.json.gz")


def test_gzip_checksum_mismatch_is_partial(tmp_path):
    # The events all parse, but the trailer's CRC says the data is not what was written.
    events = [kernel("gemm", i * 10, 5, corr=i) for i in range(3000)]
    data = bytearray(write_trace(tmp_path / "t.json.gz", events, gz=True, kineto_layout=True).read_bytes())
    data[-8] ^= 0xFF
    (tmp_path / "bad.json.gz").write_bytes(bytes(data))
    trace = read_trace(tmp_path / "bad.json.gz")
    assert trace.partial and "corrupt gzip data" in trace.error


def test_the_cycle_collector_is_back_on_after_a_read_even_a_failed_one(tmp_path):
    events = [kernel("gemm", i * 10, 5, corr=i) for i in range(100)]
    path = write_trace(tmp_path / "t.json", events, kineto_layout=True)
    path.write_bytes(path.read_bytes()[:2000])
    read_trace(path)  # damaged: partial
    assert gc.isenabled()
    with pytest.raises(TraceError):
        read_trace(tmp_path / "missing.json")
    assert gc.isenabled()
    gc.disable()
    try:
        read_trace(write_trace(tmp_path / "ok.json", events))
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()


def test_unreadable_files_give_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("this is not json")
    with pytest.raises(TraceError, match="not a readable JSON trace"):
        read_trace(bad)
    with pytest.raises(TraceError, match="no trace file"):
        read_trace(tmp_path / "missing.json")
    result = analyze_file(bad)
    assert result["unreadable"] and "not a readable JSON trace" in result["error"]


# Numbers printed by Holistic Trace Analysis 0.5.0 (get_temporal_breakdown,
# get_idle_time_breakdown, get_cuda_kernel_launch_stats) on these unmodified files.
HTA_REFERENCE = {
    "resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz": {
        "temporal": (830494, 327463, 492891, 10140),
        "idle": {7: (318934, 8529, 0)},
        "launch": (7580, 81929231, 31889, 4788, 5, 6048),
    },
    "resnet50_num_workers_4__worker0.1623212756351.pt.trace.json.gz": {
        "temporal": (677173, 164699, 495912, 16562),
        "idle": {7: (154426, 8804, 1469)},
        "launch": (7715, 41123646, 23544, 5072, 6, 5769),
    },
    "simple_add__benchmark_result_493459_1694039959_trace.json.gz": {
        "temporal": (16464339, 16414376, 10676, 39287),
        "idle": {7: (15976739, 91, 0), 20: (13582776, 8, 0)},
        "launch": (98, 10264, 874, 29, 10, 22),
    },
    "cuda_event_sync__event_sync_trace.json.gz": {
        "temporal": (263, 207, 49, 7),
        "idle": {7: (212, 0, 0)},
        "launch": (5, 5, 2, 3, 0, 0),
    },
}


@pytest.mark.parametrize("name", sorted(HTA_REFERENCE))
def test_real_traces_give_hta_numbers(name):
    path = SHARED_TRACES / name
    if not path.exists():
        pytest.skip(f"{path} is not here (shared/traces sits beside the checkout)")
    r = analyze_file(path)
    ref = HTA_REFERENCE[name]
    assert (r["kernel_time_us"], r["idle_time_us"], r["compute_time_us"], r["non_compute_time_us"]) == ref["temporal"]
    idle = {s["stream"]: (s["host_wait_us"], s["kernel_wait_us"], s["other_us"]) for s in r["idle_by_stream"]}
    assert idle == ref["idle"]
    assert (r["launches"], r["launch_delay_total_us"], r["launch_delay_max_us"],
            r["short_kernels"], r["runtime_outliers"], r["launch_delay_outliers"]) == ref["launch"]
    assert r["comp_comm_overlap_pct"] is None  # single-GPU traces: no communication kernels


@pytest.mark.parametrize("name", ["cupti_profiler__benchmark_result_924719_1679055439_trace.json.gz",
                                  "distributed_info_unavailable__distributed_info_not_found.json.gz"])
def test_other_real_traces_read_without_error(name):
    path = SHARED_TRACES / name
    if not path.exists():
        pytest.skip(f"{path} is not here")
    r = analyze_file(path)
    assert not r.get("unreadable") and not r["partial"] and r["rank"] == 0


@pytest.mark.parametrize("text, reason", [
    ("[1, 2, 3]", "the top level is an array"),
    ('"a string"', "the top level is a string"),
    ('{"traceEvents": 5}', "traceEvents is a number"),
    ('{"traceEvents": {"name": "x"}}', "traceEvents is an object"),
    ('{"schemaVersion": 1, "foo": [1]}', "has no traceEvents"),
    ('{"schemaVersion": 1,\n  "traceEvents": 5\n}', "traceEvents is a number"),
])
def test_json_that_is_not_a_trace_is_a_clear_error_not_an_empty_trace(tmp_path, text, reason):
    path = tmp_path / "shape.json"
    path.write_text(text)
    with pytest.raises(TraceError, match=reason):
        read_trace(path)
    result = analyze_file(path)
    assert result["unreadable"] and reason in result["error"]


def test_an_empty_event_list_is_a_trace_with_no_events(tmp_path):
    path = tmp_path / "empty.json"
    path.write_text('{"traceEvents": []}')
    assert read_trace(path).events == [] and not read_trace(path).partial


@pytest.mark.parametrize("text, says", [
    ('{"traceEvents": [1, "x", null]}',
     "3 items that are not an event were skipped; the first is item 0 of traceEvents: 1 is a number"),
    (('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "gemm", "ts": "abc", "dur": 5,'
     ' "args": {"stream": 7, "correlation": 1}}]}'),
     ("1 event whose time, duration or category has the wrong type was skipped; the first is item 0 of "
     "traceEvents: event 'gemm': ts expected int | float | null, got str")),
    ('{"traceEvents": [{"ph": "X", "cat": 7, "name": "gemm", "ts": 1, "dur": 5}, [1]]}',
     ("1 item that is not an event and 1 event whose time, duration or category has the wrong type were "
     "skipped; the first is item 0 of traceEvents: event 'gemm': cat expected str | null, got int")),
])
def test_a_trace_of_which_nothing_usable_remains_is_an_error_naming_the_first_bad_item(tmp_path, text, says):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(TraceError, match="no usable event: " + says.replace("|", r"\|").replace("(", r"\(")):
        read_trace(path)
    result = analyze_file(path)
    assert result["unreadable"] and says in result["error"]


@pytest.mark.parametrize("kineto_layout", [False, True])
def test_items_that_are_not_usable_events_are_counted_and_the_rest_analysed(tmp_path, kineto_layout):
    events = [runtime("cudaLaunchKernel", i * 10, 2, corr=i) for i in range(40)]
    events += [kernel("gemm", i * 10 + 3, 4, corr=i) for i in range(40)]
    events[41]["ts"] = "abc"  # a kernel whose time is text
    events[50:50] = [7, None, ["a list"]]
    trace = read_trace(write_trace(tmp_path / "t.json", events, kineto_layout=kineto_layout))
    assert trace.skipped == {
        "not_events": 3, "unusable_events": 1, "first": "item 41 of traceEvents: event 'gemm': ts expected "
                                                            "int | float | null, got str",
        "says": "3 items that are not an event and 1 event whose time, duration or category has the wrong type "
                "were skipped; the first is item 41 of traceEvents: event 'gemm': ts expected int | float | "
                "null, got str"}
    assert len(trace.events) == 79 and not trace.partial  # everything else kept
    record = analyze_file(tmp_path / "t.json")
    assert record["skipped"] == trace.skipped and record["gpu_events"] == 39
    from gpufleet.analyze import format_record, status_of

    assert "SKIPPED: 3 items that are not an event and 1 event" in format_record(record)
    assert status_of([record]) == 1  # its figures cover only the usable events


def test_a_well_formed_trace_skips_nothing(tmp_path):
    events = [runtime("cudaLaunchKernel", 0, 2, corr=1), kernel("gemm", 3, 4, corr=1),
              {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "python"}},  # metadata: not used
              {"ph": "i", "s": "t", "name": "marker", "pid": 1, "tid": 1, "ts": 2}]  # an instant: no dur
    trace = read_trace(write_trace(tmp_path / "t.json", events))
    assert trace.skipped is None and "skipped" not in analyze_file(tmp_path / "t.json")
