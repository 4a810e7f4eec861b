"""Multi-rank analysis: the straggler named from the order in which ranks reach each collective."""

from __future__ import annotations

import pytest

from gpufleet.analyze import analyze_file
from streams.traces.collectives import stragglers
from tests.support.traces import synthetic_rank_traces


def _ranks(paths):
    records = [analyze_file(p) for p in paths]
    return {r["rank"]: r["collectives"] for r in records}, records


def test_the_rank_that_arrives_last_is_named_with_the_time_the_others_waited(tmp_path):
    ranks, _ = _ranks(synthetic_rank_traces(tmp_path, ranks=4, straggler=2, steps=8))
    s = stragglers(ranks)
    # The last step is dropped (HTA's rule): 7 all-reduces, each matched on 4 ranks.
    assert s["collectives"] == 7
    assert s["straggler"] is not None and s["straggler"]["rank"] == 2 and s["straggler"]["last_share"] == 1.0
    by_rank = {row["rank"]: row for row in s["ranks"]}
    assert by_rank[2]["waited_us"] == 0 and by_rank[2]["last"] == 7
    # What the others waited is what the straggler caused: ~30 % of ~1000 us per step, per rank.
    others = sum(by_rank[r]["waited_us"] for r in (0, 1, 3))
    assert by_rank[2]["caused_us"] == pytest.approx(others)
    assert 3 * 7 * 200 < others < 3 * 7 * 450


def test_without_a_straggler_none_is_named(tmp_path):
    ranks, _ = _ranks(synthetic_rank_traces(tmp_path, ranks=4, straggler=None, steps=12))
    s = stragglers(ranks)
    assert s["collectives"] == 11 and s["straggler"] is None
    assert sum(row["last"] for row in s["ranks"]) == 11


def test_clocks_of_different_hosts_do_not_matter(tmp_path):
    """The hosts' clocks are up to 50 ms apart in these traces, 100 times a step's length:
    arrival order is read from the kernels' durations, never compared across clocks."""
    a = stragglers(_ranks(synthetic_rank_traces(tmp_path / "a", straggler=1, seed=1))[0])
    b = stragglers(_ranks(synthetic_rank_traces(tmp_path / "b", straggler=1, seed=2))[0])
    assert a["straggler"]["rank"] == b["straggler"]["rank"] == 1


def test_collectives_on_one_rank_only_are_not_compared(tmp_path):
    ranks, _ = _ranks(synthetic_rank_traces(tmp_path, ranks=2, straggler=0, steps=4))
    ranks[1] = [{"name": "ncclKernel_Broadcast", "durations_us": [5.0, 6.0]}]
    assert stragglers(ranks)["collectives"] == 0 and stragglers(ranks)["straggler"] is None


def test_gpufleet_analyze_puts_the_ranks_side_by_side_and_names_the_straggler(tmp_path):
    import json

    from gpufleet.analyze import run

    paths = [str(p) for p in synthetic_rank_traces(tmp_path, ranks=3, straggler=1)]
    text, rc = run(paths, as_json=False)
    assert rc == 0 and "job: 3 ranks side by side; 7 collectives matched" in text
    assert "STRAGGLER: rank 1 came last to 100 % of the collectives" in text
    doc = json.loads(run(paths, as_json=True)[0])
    assert len(doc["traces"]) == 3 and doc["job"]["straggler"]["rank"] == 1
    assert [r["rank"] for r in doc["job"]["ranks"]] == [0, 1, 2]
    # One file: no job section.
    assert json.loads(run(paths[:1], as_json=True)[0])["job"] is None


def test_the_ranks_critical_paths_side_by_side(tmp_path):
    """With --critical-path each rank's path per step and its shares; the straggler waits least
    in the collectives, so the smallest share of its path is communication."""
    import json

    from gpufleet.analyze import run

    paths = [str(p) for p in synthetic_rank_traces(tmp_path, ranks=4, straggler=2)]
    text, _ = run(paths, as_json=False, critical_path=True)
    assert "critical path per rank" in text
    job = json.loads(run(paths, as_json=True, critical_path=True)[0])["job"]
    shares = {r["rank"]: r["critical_path"] for r in job["ranks"]}
    for p in shares.values():
        assert p["path_per_step_us"] > 0
        assert p["cpu_pct"] + p["gpu_compute_pct"] + p["communication_pct"] + p["waiting_pct"] == pytest.approx(100)
    assert min(shares, key=lambda r: shares[r]["communication_pct"]) == 2
    assert all(r["critical_path"] is None for r in json.loads(run(paths, as_json=True)[0])["job"]["ranks"])


def test_the_worker_names_the_straggler_of_a_requested_profile_as_its_ranks_arrive(tmp_path):
    from schemas.topics import trace_id_of
    from streams.profiling.diff import ComparisonConfig
    from streams.stages.comparison_step import compare, expired

    records = [analyze_file(p, "wf") for p in synthetic_rank_traces(tmp_path, ranks=3, straggler=1)]
    for r in records:
        r["trace_id"] = trace_id_of("req-1", f"host{r['rank']}", r["rank"])
    state: dict = {}
    config = ComparisonConfig()
    findings, _ = compare(state, 0, [records[0]], config, 1000)
    assert findings == []  # one rank: nothing to compare with
    findings, _ = compare(state, 0, [records[1]], config, 2000)
    assert [(f["rule"], f["rank"]) for f in findings] == [("straggler_rank", 1)]
    findings, changed = compare(state, 0, [records[2]], config, 3000)
    (f,) = findings
    assert f["finding_id"] == "profile/req-1:straggler_rank" and f["trace_id"] == records[1]["trace_id"]
    assert "across 3 ranks" in f["evidence"] and f["gpu_seconds_at_stake"] > 0
    assert "profile\x00wf\x00req-1" in changed
    # A file's trace (not a requested profile) is never grouped with others.
    assert compare({}, 0, [{**records[0], "trace_id": "wf/rank0.json"}], config, 1000)[0] == []
    # The ranks are forgotten an hour after the last one arrived.
    assert expired(state, 3000 + 3_600_000, config) == {}
    assert expired(state, 3001 + 3_600_000, config) == {"profile\x00wf\x00req-1": 0}
