"""The programs each side of bench_trace_analysis runs on a trace, each in a fresh interpreter
(gpufleet's in its own, HTA's in benchmarks/.venv-hta): every analysis both have, the critical
path, the kernel sequences, and every figure of the order-sensitive summaries. Each prints one
JSON line."""

from __future__ import annotations

# Reading alone: decompress and parse into the columns the analysers are fed (the limit an
# analysis over those columns can approach).
READ = r"""
import json, sys
from producers.traces.read import no_cycle_collection, read_trace
with no_cycle_collection():
    t = read_trace(sys.argv[1])
print(json.dumps({"events": len(t.events)}))
"""

OURS = r"""
import json, sys
from gpufleet.analyze import analyze_file
r = analyze_file(sys.argv[1])
print(json.dumps({"kernel_us": r["kernel_time_us"], "idle_us": r["idle_time_us"], "compute_us": r["compute_time_us"],
  "non_compute_us": r["non_compute_time_us"],
  "overlap_pct": None if r["comp_comm_overlap_pct"] is None else round(r["comp_comm_overlap_pct"], 2),
  "idle_by_stream": {str(s["stream"]): [s["host_wait_us"], s["kernel_wait_us"], s["other_us"]]
                     for s in r["idle_by_stream"]},
  "launches": r["launches"], "launch_delay_total_us": r["launch_delay_total_us"],
  "kernel_types": {k["kernel_type"]: k["time_us"] for k in r["kernel_types"]},
  "memory_bw_samples": {m["kind"]: m["bw_samples"] for m in r["memory_copies"] if m["bw_samples"]},
  "queue_samples": {str(q["stream"]): q["samples"] for q in r["queue_lengths"]}}))
"""


HTA = r"""
import json, logging, math, os, shutil, sys, tempfile
logging.disable(logging.WARNING)
import warnings; warnings.filterwarnings("ignore")
from hta.trace_analysis import TraceAnalysis
d = tempfile.mkdtemp()
os.symlink(os.path.abspath(sys.argv[1]), os.path.join(d, os.path.basename(sys.argv[1])))
a = TraceAnalysis(trace_dir=d)
tb = a.get_temporal_breakdown(visualize=False).iloc[0]
ov = a.get_comm_comp_overlap(visualize=False).iloc[0]["comp_comm_overlap_pctg"]
idle = a.get_idle_time_breakdown(visualize=False)
idle = idle[0] if isinstance(idle, tuple) else idle
by_stream = {}
for _, row in idle.iterrows():
    cause = ["host_wait", "kernel_wait", "other"].index(row["idle_category"])
    by_stream.setdefault(str(int(row["stream"])), [0.0, 0.0, 0.0])[cause] = float(row["idle_time"])
ls = a.get_cuda_kernel_launch_stats(visualize=False)[0]
kt, _ = a.get_gpu_kernel_breakdown(visualize=False)
bw = a.get_memory_bw_summary()
a.get_gpu_user_annotation_breakdown(visualize=False)
ql = a.get_queue_length_summary(ranks=[0])
a.get_time_spent_blocked_on_full_queue(a.get_queue_length_time_series(ranks=[0]))
print(json.dumps({"kernel_us": float(tb["kernel_time(us)"]), "idle_us": float(tb["idle_time(us)"]),
  "compute_us": float(tb["compute_time(us)"]), "non_compute_us": float(tb["non_compute_time(us)"]),
  "overlap_pct": None if math.isnan(ov) else float(ov), "idle_by_stream": by_stream,
  "launches": int(len(ls)), "launch_delay_total_us": float(ls["launch_delay"].sum()),
  "kernel_types": {r["kernel_type"]: float(r["sum"]) for _, r in kt.iterrows() if r["sum"] > 0},
  "memory_bw_samples": {} if bw is None else {name: int(row.iloc[0]) for (_, name), row in bw.iterrows()},
  "queue_samples": {} if ql is None else {str(int(stream)): int(row.iloc[0]) for (_, stream), row in ql.iterrows()}}))
"""


FIGURES = r"""
import json, sys
from gpufleet.analyze import analyze_file
r = analyze_file(sys.argv[1])
print(json.dumps({k: r[k] for k in ("memory_copies", "queue_lengths", "idle_by_stream")}))
"""


OURS_CP = r"""
import json, sys
from gpufleet.analyze import analyze_file
cp = analyze_file(sys.argv[1], critical_path=True)["critical_path"]
first = cp["steps"][0] if cp["steps"] else {}
print(json.dumps({"steps": len(cp["steps"]), **{k: first.get(k) for k in ("path_us", "cpu_us", "gpu_compute_us",
  "communication_us", "launch_overhead_us", "kernel_gap_us")}}))
"""


HTA_CP = r"""
import json, logging, os, sys, tempfile
logging.disable(logging.WARNING)
import warnings; warnings.filterwarnings("ignore")
sys.path.insert(0, sys.argv[2])
from hta_reference import _critical_path
from hta.trace_analysis import TraceAnalysis
d = tempfile.mkdtemp()
os.symlink(os.path.abspath(sys.argv[1]), os.path.join(d, os.path.basename(sys.argv[1])))
cp = _critical_path(TraceAnalysis(trace_dir=d))
if "hta_error" in cp:
    sys.exit(cp["hta_error"])
b = cp["bound_by"]
print(json.dumps({"steps": 1, "path_us": cp["path_us"], "cpu_us": b.get("cpu_bound", 0),
  "gpu_compute_us": b.get("gpu_compute_bound", 0), "communication_us": b.get("gpu_communication_bound", 0),
  "launch_overhead_us": b.get("gpu_kernel_launch_overhead", 0),
  "kernel_gap_us": b.get("gpu_kernel_kernel_overhead", 0)}))
"""


OURS_SEQ = r"""
import json, sys
from streams.traces import kernel_sequences
kernel_sequences.TOP = 10**6
from gpufleet.analyze import analyze_file
x = analyze_file(sys.argv[1], kernel_sequences=[sys.argv[3]])["kernel_sequences"][sys.argv[3]]
print(json.dumps({"sequences": {"|".join(s["sequence"]): [s["count"], s["gpu_us"], s["cpu_us"]] for s in x["top"]}}))
"""


HTA_SEQ = r"""
import json, logging, os, sys, tempfile
logging.disable(logging.WARNING)
import warnings; warnings.filterwarnings("ignore")
from hta.trace_analysis import TraceAnalysis
d = tempfile.mkdtemp()
os.symlink(os.path.abspath(sys.argv[1]), os.path.join(d, os.path.basename(sys.argv[1])))
df = TraceAnalysis(trace_dir=d).get_frequent_cuda_kernel_sequences(sys.argv[3], tempfile.mkdtemp(), visualize=False)
print(json.dumps({"sequences": {r["pattern"]: [int(r["count"]), float(r["GPU kernel duration (us)"]),
  float(r["CPU op duration (us)"])] for _, r in df.iterrows()}}))
"""
