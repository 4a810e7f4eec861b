"""Makes docs/benchmarks.md from the results the benchmarks wrote (``benchmarks/results/*.txt``,
each by ``benchmarks/run.py``): every figure in it is a benchmark's own output, with the command,
commit and date of the run that printed it. ``make bench`` runs the benchmarks, then this."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "benchmarks.md"

# What each benchmark measures, in the order the page shows them.
ABOUT = {
    "trace_analysis": "`gpufleet analyze` against Holistic Trace Analysis 0.5.0 on the same files: whole "
                      "process time, CPU and peak memory of each side (medians of alternating runs), every "
                      "compared figure side by side, and how many figures of the order-sensitive summaries "
                      "differ from HTA's own, HTA with a stable sort, and HTA with a stable sort and an exact sum.",
    "window_utilization": "The worker's event-time windows: samples a second through decode, validation and "
                          "aggregation, columns against one record per sample.",
    "agent": "The host agent's tick: CPU and NVML calls per GPU per tick with the fake NVML, and what reading "
             "the scheduler's allocations adds.",
    "sink": "The ClickHouse sink: rows a second into the embedded engine, by path.",
    "query_server": "The sink's query server: a second analyst's SELECT 1 while another query runs to its limit.",
    "stream": "The whole worker on a real broker: samples a second against bare consume and decode, and the "
              "alert latency.",
}


def main() -> None:
    files = sorted(RESULTS.glob("*.txt"), key=lambda p: (list(ABOUT).index(p.stem) if p.stem in ABOUT else 99, p.stem))
    out = ["# Benchmarks", "",
           ("Made by `make bench` (`benchmarks/write_docs.py`) from what each benchmark printed "
           "(`benchmarks/results/`): nothing here is typed by hand. Ratios are taken within one run, "
           "the baseline measured beside the candidate; these machines are shared and noisy, so read "
           "the medians and the spread."), ""]
    out += [f"- [{p.stem.replace('_', ' ')}](#{p.stem.replace('_', '-')})" for p in files]
    for p in files:
        text = p.read_text()
        head, _, body = text.partition("\n\n")
        meta = dict(line.split(": ", 1) for line in head.splitlines() if ": " in line)
        out += ["", f"## {p.stem.replace('_', ' ')}", "", ABOUT.get(p.stem, ""), "",
                (f"`{meta.get('command', '?')}` at {meta.get('commit', '?')}, {meta.get('date', '?')} "
                f"({meta.get('machine', '?')})"), "", "```", body.rstrip(), "```"]
    DOC.write_text("\n".join(out) + "\n")
    print(f"wrote {DOC.relative_to(ROOT)} from {len(files)} results")


if __name__ == "__main__":
    main()
