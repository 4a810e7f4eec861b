"""docs/benchmarks.md is made from what the benchmarks printed, never typed: each result's output
appears whole, with its command, commit and date; a benchmark with no result says how to run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_page_holds_each_benchmarks_output_whole(tmp_path, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    # what benchmarks/run.py writes for a benchmark that printed two lines
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "agent", "--", sys.executable, "-c",
                    "print('NVML calls per GPU per tick: 11'); print('CPU per tick: 1.00x')"],
                   cwd=ROOT, check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", "GPUFLEET_BENCH_RESULTS": str(results)})
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import write_docs

    doc = tmp_path / "benchmarks.md"
    write_docs.main(results, doc)
    page = doc.read_text()
    assert "NVML calls per GPU per tick: 11\nCPU per tick: 1.00x" in page
    assert "## agent" in page and "commit: " not in page and "-c print(" in page
    assert "## trace analysis" in page and "No result yet: run `make bench`." in page
    assert "No result yet: run `make bench-fleet`." in page  # the fleet's benchmarks
