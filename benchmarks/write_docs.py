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
    "trace_stage": "The worker's trace stage per kernel event: a trace's messages decoded and applied to its "
                   "session, a batch at a time, against decoding alone; KernelEventColumns (what the agents send) "
                   "against one KernelEvent message per event (older agents).",
    "window_utilization": "The worker's event-time windows: samples a second through decode, validation and "
                          "aggregation, columns against one record per sample.",
    "agent": "The host agent's tick: CPU and NVML calls per GPU per tick with the fake NVML, and what reading "
             "the scheduler's allocations adds.",
    "agent_serving": "The host agent reading a serving engine's endpoint per replica beside its GPUs, in its "
                     "ticks: CPU per tick against the agent without, alone and beside a scraper asking the same "
                     "pages at the same point of its tick (the three agents ticking in turn, 10 ms apart, the "
                     "engines' answers coming between), read every tick and every 10 (the default).",
    "agent_serving_gpu": "The same comparison on a machine with NVIDIA GPUs, against a tick of its own GPUs "
                         "through NVML (a replica a GPU; `bench_agent_serving.py --nvml`): the agent's cost as a GPU "
                         "host pays it, where the fake NVML's tick is the cheap side.",
    "serving_stage": "The window stage with serving replicas' traffic beside their GPU samples: GPU samples a "
                     "second against the samples alone.",
    "replay": "`gpufleet replay`'s memory: what making a day of 200 containers' records holds beyond the "
              "readings it reads (Python's allocations, traced), sending them one tick after the other.",
    "sink": "The ClickHouse sink: rows a second into the embedded engine, by path.",
    "query_server": "The sink's query server: a second analyst's SELECT 1 while another query runs to its limit.",
    "job_page": "The owners' service: the page of a 7-day job on 64 GPUs at 1 Hz against a 1-hour job's, "
                "over HTTP from the embedded engine's query server.",
    "owners_load": "50 owners loading their job pages while the sink ingests at its full rate: the sink's rate "
                   "against its rate alone, and the pages' latency (the sink, the service and the owners as "
                   "processes of their own on this host).",
    "services": "The serving services' load as `gpufleet serving` and the owners' pages compute it: a week of "
                "a fleet's serving windows summed by ClickHouse into spans and replicas, against the windows read "
                "into Python and summed there by the same rule.",
    "stream": "The whole worker on a real broker: samples a second against bare consume and decode, and the "
              "alert latency.",
    "fleet": "Several workers on a 3-broker cluster: two workers against one, a worker or the leading broker "
             "killed, the window state's changelog bytes, a restore (`make bench-fleet`).",
    "sink_kafka": "One sink against the worker on the agents' messages, through a real broker "
                  "(`make bench-fleet`).",
    "soak": "Half an hour of random SIGKILLs to brokers, workers, sinks, the notifier and the enforcer, and the "
            "oracle's check that every GPU-second, sample, alert and action ended where it should, once "
            "(`make bench-fleet`).",
}
MADE_BY = {"fleet": "make bench-fleet", "sink_kafka": "make bench-fleet", "soak": "make bench-fleet",
           "agent_serving_gpu": "benchmarks/gpu_machine.sh run"}
WHERE = {"agent_serving_gpu": " on a machine with NVIDIA GPUs (`benchmarks/gpu_machine.sh wheels` here first)"}


def main(results: Path = RESULTS, doc: Path = DOC) -> None:
    files = sorted(results.glob("*.txt"), key=lambda p: (list(ABOUT).index(p.stem) if p.stem in ABOUT else 99, p.stem))
    out = ["# Benchmarks", "",
           ("Made by `make bench` (`benchmarks/write_docs.py`) from what each benchmark printed "
           "(`benchmarks/results/`): nothing here is typed by hand. Ratios are taken within one run, "
           "the baseline measured beside the candidate; these machines are shared and noisy, so read "
           "the medians and the spread."), ""]
    out += [f"- [{name.replace('_', ' ')}](#{name.replace('_', '-')})"
            for name in [p.stem for p in files] + [n for n in ABOUT if not (results / f"{n}.txt").exists()]]
    for p in files:
        text = p.read_text()
        head, _, body = text.partition("\n\n")
        meta = dict(line.split(": ", 1) for line in head.splitlines() if ": " in line)
        out += ["", f"## {p.stem.replace('_', ' ')}", "", ABOUT.get(p.stem, ""), "",
                (f"`{meta.get('command', '?')}` at {meta.get('commit', '?')}, {meta.get('date', '?')} "
                f"({meta.get('machine', '?')})"), "", "```", body.rstrip(), "```"]
    for name in (n for n in ABOUT if not (results / f"{n}.txt").exists()):
        out += ["", f"## {name.replace('_', ' ')}", "", ABOUT[name], "",
                f"No result yet: run `{MADE_BY.get(name, 'make bench')}`{WHERE.get(name, '')}."]
    doc.write_text("\n".join(out) + "\n")
    print(f"wrote {doc} from {len(files)} results")


if __name__ == "__main__":
    main()
