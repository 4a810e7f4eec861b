"""The worker's fixes to faust are held to what they were reviewed and proven on: another
release, or an upstream part with other source, stops the worker before it starts, with one
line naming it (``streams.faust_fixes.review``)."""

import pytest
from faust.transport.consumer import Consumer

from streams import faust_fixes
from streams.faust_fixes import review


@pytest.fixture(autouse=True)
def fixed():
    """Each test runs with the fixes applied, and Faust is as it was after it."""
    with faust_fixes.applied():
        yield


def test_the_installed_faust_is_the_one_the_fixes_were_proven_on():
    assert faust_fixes.check() == []


def test_another_release_is_refused_with_one_line_naming_it(monkeypatch):
    monkeypatch.setattr(faust_fixes, "_verified", False)
    real = review.installed
    monkeypatch.setattr(review, "installed", lambda d: "0.15.4" if d == "faust-streaming" else real(d))
    with pytest.raises(faust_fixes.NotAsReviewed) as refused:
        faust_fixes.apply()
    line = str(refused.value)
    assert "\n" not in line and line.startswith("faust-streaming 0.15.4 is installed; the fixes were proven on 0.15.3")
    assert "docs/upgrading-faust.md" in line


def test_a_changed_upstream_part_is_refused_naming_it(monkeypatch):
    """A part the fixes replace or call, with other source (a release that kept its version,
    or a patched install), is named with its role."""

    async def _commit_tps(self, tps, start_new_transaction):  # not faust's
        return False

    monkeypatch.setattr(faust_fixes, "_verified", False)
    monkeypatch.setattr(Consumer, "_commit_tps", _commit_tps)
    problems = faust_fixes.check()
    assert len(problems) == 1 and problems[0].startswith(
        "faust.transport.consumer:Consumer._commit_tps (copied into fix 5's commit) changed since it was reviewed")
    with pytest.raises(faust_fixes.NotAsReviewed, match="Consumer._commit_tps"):
        faust_fixes.apply()


def test_the_worker_refuses_to_start_with_that_line(monkeypatch, capsys):
    from gpufleet.cli import main

    monkeypatch.setattr(faust_fixes, "_verified", False)
    monkeypatch.setattr(faust_fixes, "check", lambda: ["aiokafka 0.15.0 is installed; the fixes were proven on 0.14.0"])
    assert main(["worker", "--bootstrap", "127.0.0.1:1"]) == 1
    assert capsys.readouterr().err.startswith("gpufleet worker: aiokafka 0.15.0 is installed")
