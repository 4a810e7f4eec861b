"""Trace diff: what changed between two profiles, per step, and when it is a regression."""

from __future__ import annotations

import pytest

from gpufleet.analyze import analyze_file, analyze_profile
from streams.profiling.diff import (
    RegressionConfig,
    diff_profiles,
    profile_figures,
    regression,
    regression_finding,
)
from tests.support.traces import COMPUTE_KERNELS, synthetic_job_trace

SLOW = COMPUTE_KERNELS[3]


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    d = tmp_path_factory.mktemp("profiles")
    return {
        "base": synthetic_job_trace(d / "base.json"),
        "slow": synthetic_job_trace(d / "slow.json", slower={SLOW: 4.0}),
    }


def _figures(*paths):
    return profile_figures(*analyze_profile(list(paths)))


def test_a_profile_against_itself_changes_nothing(profiles):
    d = diff_profiles(_figures(profiles["base"]), _figures(profiles["base"]))
    assert all(s["delta"] in (0, None) for s in d["summary"])
    assert all(k["delta_us"] == 0 and k["status"] == "changed" for k in d["kernels"])
    assert regression(d, RegressionConfig()) is None


def test_the_kernel_that_slowed_down_leads_the_diff(profiles):
    d = diff_profiles(_figures(profiles["base"]), _figures(profiles["slow"]))
    gpu = d["summary"][0]
    assert gpu["metric"] == "gpu_time_us" and gpu["delta"] > 0
    top = d["kernels"][0]
    assert top["name"] == SLOW and top["status"] == "changed"
    assert top["cand_us"] == pytest.approx(4 * top["base_us"], rel=0.03)  # (times are rounded to the microsecond)
    assert top["base_launches"] == top["cand_launches"]
    assert d["kernel_types"][0]["delta_us"] > 0
    found = regression(d, RegressionConfig(min_pct=5))
    assert found is not None and found["delta_pct"] == pytest.approx(gpu["delta_pct"])
    assert regression(d, RegressionConfig(min_pct=gpu["delta_pct"] + 1)) is None  # under the threshold


def test_figures_are_per_step_and_per_rank(profiles):
    one = analyze_file(profiles["base"])
    twice_as_long = {**one, "profiler_steps": 2 * one["profiler_steps"], "kernel_time_us": 2 * one["kernel_time_us"],
                     "top_kernels": [{**k, "launches": 2 * k["launches"], "time_us": 2 * k["time_us"]}
                                     for k in one["top_kernels"]]}
    d = diff_profiles(profile_figures([one]), profile_figures([twice_as_long]))
    assert d["summary"][0]["delta"] == pytest.approx(0, abs=1e-9)
    assert all(k["delta_us"] == pytest.approx(0, abs=1e-9) for k in d["kernels"])
    # Two ranks alike: the same per-step figures as one.
    two_ranks = _figures(profiles["base"], profiles["base"])
    assert two_ranks["ranks"] == 2 and two_ranks["gpu_time_us"] == pytest.approx(
        _figures(profiles["base"])["gpu_time_us"]
    )
    one_rank = _figures(profiles["base"])["kernels"]
    assert set(two_ranks["kernels"]) == set(one_rank)
    for key, (launches, time_us) in one_rank.items():
        assert two_ranks["kernels"][key] == [pytest.approx(launches), pytest.approx(time_us)]


def test_profiles_without_steps_are_never_called_a_regression(profiles):
    base, slow = analyze_file(profiles["base"]), analyze_file(profiles["slow"])
    d = diff_profiles(
        profile_figures([{**base, "profiler_steps": 0}]), profile_figures([{**slow, "profiler_steps": 0}])
    )
    assert not d["per_step"] and d["summary"][0]["delta"] > 0
    assert regression(d, RegressionConfig(min_pct=1)) is None


def test_the_regression_finding_names_what_grew(profiles):
    base, slow = analyze_file(profiles["base"], "wf"), analyze_file(profiles["slow"], "wf")
    d = diff_profiles(profile_figures([base]), profile_figures([slow]))
    finding = regression_finding(d, regression(d, RegressionConfig(min_pct=5)), slow, base, 1)
    assert finding["rule"] == "profile_regression" and finding["finding_id"] == f"{slow['trace_id']}:profile_regression"
    assert "gemm_3" in finding["evidence"] and base["trace_id"] in finding["evidence"]
    assert finding["gpu_seconds_at_stake"] == pytest.approx(d["summary"][0]["delta"] * slow["profiler_steps"] / 1e6)


def test_gpufleet_diff_takes_files_directories_or_lists_around_vs(profiles, tmp_path, capsys):
    import json

    from gpufleet.cli import main
    from gpufleet.commands.traces import split_profiles

    assert split_profiles(["a", "b"]) == (["a"], ["b"])
    assert split_profiles(["a0", "a1", "vs", "b0", "b1"]) == (["a0", "a1"], ["b0", "b1"])
    for bad in (["a"], ["a", "b", "c"], ["vs", "b"], ["a", "vs"], ["a", "vs", "b", "vs", "c"]):
        with pytest.raises(ValueError):
            split_profiles(bad)

    assert main(["diff", str(profiles["base"]), str(profiles["slow"])]) == 0
    text = capsys.readouterr().out
    assert "per step" in text and "gemm_3" in text.split("kernels that changed most")[1].splitlines()[1]

    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for r in range(2):
        (ranks / f"rank{r}.json").write_bytes(profiles["slow"].read_bytes())
    assert main(["diff", "--json", str(profiles["base"]), str(profiles["base"]), "vs", str(ranks)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["base"]["ranks"] == 2 and d["cand"]["ranks"] == 2 and d["kernels"][0]["name"] == SLOW

    capsys.readouterr()
    assert main(["diff", str(profiles["base"]), str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith("gpufleet diff: no trace file at")
    (tmp_path / "empty").mkdir()
    assert main(["diff", str(profiles["base"]), str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err.startswith("gpufleet diff: no trace files in")


def test_gpufleet_diff_says_which_file_cannot_be_read(profiles, tmp_path, capsys):
    from gpufleet.cli import main

    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert main(["diff", str(profiles["base"]), str(bad)]) == 2
    assert "the top level is an array" in capsys.readouterr().err


def test_the_stage_compares_each_rank_with_its_previous_complete_profile(profiles):
    from streams.profiling.diff import ComparisonConfig
    from streams.stages.comparison_step import compare

    base = {**analyze_file(profiles["base"], "wf"), "analyzed_at": 1}
    slow = {**analyze_file(profiles["slow"], "wf"), "analyzed_at": 2}
    config = ComparisonConfig(regressions=RegressionConfig(min_pct=5))
    baselines: dict = {}
    assert compare(baselines, 0, [base], config, 10) == ([], {"rank\x00wf\x000"})
    assert (
        baselines["rank\x00wf\x000"]["trace_id"] == base["trace_id"] and baselines["rank\x00wf\x000"]["partition"] == 0
    )
    # A partial profile is neither compared nor kept; another rank has its own baseline.
    assert compare(baselines, 0, [{**slow, "partial": True}, {**slow, "rank": 1}], config, 10) == (
        [],
        {"rank\x00wf\x001"},
    )
    findings, changed = compare(baselines, 0, [slow], config, 10)
    assert [f["rule"] for f in findings] == ["profile_regression"] and changed == {"rank\x00wf\x000"}
    assert findings[0]["trace_id"] == slow["trace_id"] and base["trace_id"] in findings[0]["evidence"]
    # The same profile again (a replay) and an older one that came late change nothing.
    assert compare(baselines, 0, [slow, {**base, "trace_id": "old", "analyzed_at": 0}], config, 10) == ([], set())
    # Faster again: no finding, and the faster profile is the new baseline.
    assert compare(baselines, 0, [{**base, "trace_id": "again", "analyzed_at": 3}], config, 10) == (
        [],
        {"rank\x00wf\x000"},
    )
