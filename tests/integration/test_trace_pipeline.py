"""A trace file through the agent side, Kafka and the worker: the TraceAnalysis that lands in
Kafka and ClickHouse equals what `gpufleet analyze` prints for the same file."""

from __future__ import annotations

import pytest

from gpufleet.analyze import analyze_file, analyze_file_with_findings
from producers.publish_kafka import Publisher
from producers.traces.publish import kernel_event_columns, kernel_event_records, publish_trace
from producers.traces.read import read_trace
from schemas.topics import DEAD_LETTERS, FINDINGS, KERNEL_EVENTS, TRACE_ANALYSES, trace_id_for
from tests.support.integration import CODEC, read_topic, running_sink, wait_until, worker_process
from tests.support.traces import SHARED_TRACES, kernel, write_trace

RESNET = SHARED_TRACES / "resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"


def analyses(kafka, prefix, n):
    def got():
        found = {r["trace_id"]: r for *_, name, r in read_topic(kafka.bootstrap, prefix + TRACE_ANALYSES.name,
                                                               TRACE_ANALYSES.partitions) if name == "TraceAnalysis"}
        return found if len(found) >= n else None
    return got


def test_streamed_analysis_equals_the_offline_one(kafka, prefix, tmp_path, chdb_client, database):
    if not RESNET.exists():
        pytest.skip(f"{RESNET} is not here")
    # A damaged trace too: what precedes the damage is analysed, and the result says it is partial.
    damaged = write_trace(tmp_path / "damaged.json", [kernel("gemm", i * 10, 5, corr=i) for i in range(300)])
    damaged.write_bytes(damaged.read_bytes()[:20_000])
    unreadable = tmp_path / "unreadable.json"
    unreadable.write_text("{ not json")

    publisher = Publisher(kafka.bootstrap, CODEC)
    ends = [publish_trace(p, "wf-trace", publisher, topic_prefix=prefix) for p in (RESNET, damaged, unreadable)]
    # An older agent's trace, a KernelEvent record per event; and a columns message that does not hold together.
    older = write_trace(tmp_path / "older.json", [kernel("gemm", i * 10, 5, corr=i) for i in range(50)])
    older_end = _publish_as_records(older, publisher, prefix)
    bogus = next(kernel_event_columns(read_trace(older), "wf-trace/bogus", "wf-trace"))
    bogus["dur"] = bogus["dur"][:-1]
    publisher.publish(KERNEL_EVENTS, [bogus], topic=prefix + KERNEL_EVENTS.name, schema="KernelEventColumns")
    assert publisher.flush() == 0
    assert publisher.failed == 0, publisher.last_error
    assert [e["partial"] for e in ends] == [False, True, True]

    with running_sink(kafka.bootstrap, prefix, chdb_client, database):
        with worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker") as worker:
            streamed = wait_until(analyses(kafka, prefix, 4), 120, "four trace analyses")
            assert worker.poll() is None
        wait_until(lambda: chdb_client.query(
            f"SELECT count() FROM {database}.trace_analyses FINAL").result_rows[0][0] == 4, 60,
            "the analyses in ClickHouse")
        offline_findings = analyze_file_with_findings(RESNET, "wf-trace")[1]
        wait_until(lambda: chdb_client.query(
            f"SELECT count() FROM {database}.findings FINAL WHERE trace_id = %(t)s",
            parameters={"t": ends[0]["trace_id"]}).result_rows[0][0] == len(offline_findings), 60,
            "the findings in ClickHouse")

    for path, end in zip((RESNET, damaged, older), (*ends[:2], older_end)):
        offline = analyze_file(path, workflow_id="wf-trace")
        online = streamed[end["trace_id"]]
        for key in offline:
            if key not in ("analyzed_at",):
                assert online[key] == offline[key], key
    assert streamed[ends[1]["trace_id"]]["partial"] and "damaged" in streamed[ends[1]["trace_id"]]["error"]
    bad = streamed[ends[2]["trace_id"]]
    assert bad["partial"] and "not a readable JSON trace" in bad["error"] and bad["events"] == 0

    letters = [r for *_, n, r in read_topic(kafka.bootstrap, prefix + DEAD_LETTERS.name, 1)
               if n == "DeadLetter" and r["stage"] == "trace-ingest"]
    assert sorted(r["source_topic"] for r in letters) == sorted(f"file:{p}" for p in (damaged, unreadable))
    (refused,) = [r for *_, n, r in read_topic(kafka.bootstrap, prefix + DEAD_LETTERS.name, 1)
                  if n == "DeadLetter" and r["stage"] == "trace-analysis"]
    assert refused["reason"] == "KernelEventColumns with 50 events but 49 values of dur"
    assert "wf-trace/bogus" not in streamed

    idle, launches = chdb_client.query(
        f"SELECT idle_time_us, launches FROM {database}.trace_analyses FINAL WHERE trace_id = %(t)s",
        parameters={"t": ends[0]["trace_id"]}).result_rows[0]
    assert (idle, launches) == (327463.0, 7580)  # HTA 0.5.0's numbers for this file

    # The findings, too, are the same online and offline; the ResNet trace with num_workers=0
    # is input-bound, and the finding says so.
    online = {r["rule"]: r for *_, n, r in read_topic(kafka.bootstrap, prefix + FINDINGS.name, FINDINGS.partitions)
              if n == "Finding" and r["trace_id"] == ends[0]["trace_id"]}
    offline = {f["rule"]: f for f in offline_findings}
    assert set(online) == set(offline) and "input_pipeline_stall" in online
    for rule, f in offline.items():
        for key in ("severity", "evidence", "gpu_seconds_at_stake", "recommendation", "finding_id"):
            assert online[rule][key] == f[key], (rule, key)


def _publish_as_records(path, publisher: Publisher, prefix: str) -> dict:
    """``path`` as an agent of the release before KernelEventColumns published it: a KernelEvent per event."""
    trace = read_trace(path)
    trace_id = trace_id_for(path, "wf-trace")
    n = publisher.publish(KERNEL_EVENTS, kernel_event_records(trace, trace_id, "wf-trace"),
                          topic=prefix + KERNEL_EVENTS.name)
    end = {"trace_id": trace_id, "workflow_id": "wf-trace", "rank": trace.rank, "events": n,
           "events_read": trace.events_seen, "source": str(path), "partial": False, "error": None,
           "last_step_dropped": trace.last_step_dropped, "memory_peak_bytes": None, "memory_total_bytes": None,
           "flops": None, "gpu_name": trace.gpu_name, "published_at": 0, "system": None}
    publisher.publish(KERNEL_EVENTS, [end], topic=prefix + KERNEL_EVENTS.name, schema="TraceEnd")
    return end


def test_profiles_are_compared_with_the_previous_one_and_across_their_ranks(kafka, prefix, tmp_path, chdb_client,
                                                                            database):
    """Two profiles of a workflow, the second with one kernel 4x slower: the worker compares
    them and reports the regression, which ClickHouse and `opportunities --by regression` show.
    Then a requested profile of three ranks, one of them slow: the worker names the straggler."""
    from gpufleet.reports.opportunities import opportunities
    from schemas.topics import trace_id_of
    from tests.support.traces import (
        COMPUTE_KERNELS,
        synthetic_job_trace,
        synthetic_operator_trace,
        synthetic_rank_traces,
    )

    before = synthetic_job_trace(tmp_path / "before.json")
    after = synthetic_job_trace(tmp_path / "after.json", slower={COMPUTE_KERNELS[3]: 4.0})
    publisher = Publisher(kafka.bootstrap, CODEC)
    with running_sink(kafka.bootstrap, prefix, chdb_client, database):
        with worker_process(kafka.bootstrap, prefix, tmp_path, f"{prefix}worker", "--regression-pct", "5") as worker:
            first = publish_trace(before, "wf-regress", publisher, topic_prefix=prefix)
            assert publisher.flush() == 0
            wait_until(analyses(kafka, prefix, 1), 120, "the first profile's analysis")
            second = publish_trace(after, "wf-regress", publisher, topic_prefix=prefix)
            assert publisher.flush() == 0

            def regression_found():
                found = [r for *_, n, r in read_topic(kafka.bootstrap, prefix + FINDINGS.name, FINDINGS.partitions)
                         if n == "Finding" and r["rule"] == "profile_regression"]
                return found or None

            findings = wait_until(regression_found, 120, "a profile_regression finding")

            for path in synthetic_rank_traces(tmp_path / "ranks", ranks=3, straggler=2):
                rank = int(path.stem.removeprefix("rank"))
                publish_trace(path, "wf-ranks", publisher, topic_prefix=prefix,
                              trace_id=trace_id_of("req-ranks", f"host{rank}", rank))
            assert publisher.flush() == 0

            def straggler_found():
                found = {r["finding_id"]: r for *_, n, r in read_topic(kafka.bootstrap, prefix + FINDINGS.name,
                                                                       FINDINGS.partitions)
                         if n == "Finding" and r["rule"] == "straggler_rank" and "across 3 ranks" in r["evidence"]}
                return found or None

            stragglers = wait_until(straggler_found, 120, "the straggler of the three ranks")

            # The roofline needs what the trace says of its operators (thread, FLOPs, bytes): it
            # comes through Kafka (KernelEvent v2) and equals the offline analysis.
            ops = publish_trace(synthetic_operator_trace(tmp_path / "ops.json"), "wf-ops", publisher,
                                topic_prefix=prefix)
            assert publisher.flush() == 0
            streamed = wait_until(lambda: analyses(kafka, prefix, 1)() and analyses(kafka, prefix, 1)().get(
                ops["trace_id"]), 120, "the operator trace's analysis")
            assert worker.poll() is None
        offline = analyze_file(tmp_path / "ops.json", workflow_id="wf-ops")
        assert streamed["operators"] == offline["operators"] and len(offline["operators"]) == 3
        assert list(stragglers) == ["profile/req-ranks:straggler_rank"]
        assert stragglers["profile/req-ranks:straggler_rank"]["rank"] == 2
        assert [f["trace_id"] for f in findings] == [second["trace_id"]]
        assert first["trace_id"] in findings[0]["evidence"] and "gemm_3" in findings[0]["evidence"]
        wait_until(lambda: chdb_client.query(
            f"SELECT count() FROM {database}.findings FINAL WHERE rule = 'profile_regression'").result_rows[0][0] == 1,
            60, "the regression in ClickHouse")
    columns, rows = opportunities(chdb_client, database, by="regression", since="all")
    assert columns[:2] == ["workflow", "cause"]
    assert [(r[0], r[1]) for r in rows] == [("wf-regress", "antipattern:profile_regression")]
    assert rows[0][2] == pytest.approx(findings[0]["gpu_seconds_at_stake"] / 3600, abs=0.001)
