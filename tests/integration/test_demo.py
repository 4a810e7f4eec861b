"""The README's main command, small: `gpufleet demo` runs end to end, then `gpufleet sql` reads its data."""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
import subprocess
import sys
import urllib.request


def gpufleet(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpufleet", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_demo_then_sql(tmp_path):
    data = str(tmp_path / "data")
    demo = gpufleet("--data-dir", data, "demo", "--hosts", "2", "--gpus-per-host", "4", "--workflows", "4",
                    "--sim-minutes", "20", "--speed", "120", "--max-wall-s", "150", timeout=240)
    out = demo.stdout
    assert demo.returncode == 0, out + demo.stderr
    assert "Per-workflow summary" in out and "(10 rows)" in out  # 4 jobs and 6 serving replicas
    # 14 GPUs x 1200 ticks, every one stored (one GPU no job holds among them, 6 the replicas'); 19
    # closed windows per workflow, and for the unallocated capacity in a table of its own (the 20th
    # is still open).
    assert "rows stored: gpu_samples 16800, workflow_windows 190, capacity_windows 19," in out
    # The serving deployment: what the pipeline measured of it is what the simulator planted.
    serving = out[out.index("The serving deployment"):out.index("The enforcement ladder")]
    for row in ("replicas", "replicas that served no request", "busiest 10 min, requests/s", "replicas needed"):
        line = rf"^{re.escape(row)}(?: \(\+20%\))? +(\S+) +(\S+)$"
        measured, planted = re.search(line, serving, re.MULTILINE).groups()
        assert measured == planted, serving
    assert "served no request: svc-chat-llm-2, svc-chat-llm-3, svc-chat-llm-4, svc-chat-llm-5 (planted: the same)" \
        in serving
    assert "idle-replica alerts: svc-chat-llm-2, svc-chat-llm-3, svc-chat-llm-4, svc-chat-llm-5" in serving
    assert f'gpufleet --data-dir {data} sql "' in out
    assert "wall-time limit" not in out
    # The goodput waterfall, measured through Kafka, the worker and ClickHouse, against what
    # the simulator planted: every bucket within 0.5 % of the allocated GPU-hours.
    worst = float(out.split("largest difference: ")[1].split("%")[0])
    assert "goodput: " in out and worst <= 0.5, out
    # The scheduler's view: the capacity no job held, and the GPUs held that no process opened,
    # each equal to what was planted; and the job that never opened its GPUs was told so.
    measured, planted = map(float, re.search(r"unallocated \(no job held them\) +([\d.]+) +([\d.]+)", out.split(
        "Against what the simulator planted")[1]).groups())
    assert measured == planted > 0, out
    measured, planted = map(float, re.search(r"held on GPUs no process opened: measured ([\d.]+), planted ([\d.]+)",
                                             out).groups())
    assert measured == planted > 0, out
    assert "the scheduler gave the job sat at 0 % and no process opened them" in out
    # The enforcement ladder (warn at 5 and 10 simulated minutes, act at 15, a dry run): the
    # GPU-hours it would have freed equal the idle time planted after the action point.
    ladder = out.split("The enforcement ladder")[1]
    assert "steps: ACTION_DUE 2, FIRST_WARNING 2, SECOND_WARNING 2, WOULD_ACT 2" in ladder  # zombie, CPU-only
    freed, planted = map(float, re.search(r"would have freed: ([\d.]+) .*; planted idle after the action "
                                          r"point: ([\d.]+)", ladder).groups())
    assert freed == planted > 0, ladder

    # What the demo tells the user to try next works from any directory, as its comment says.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    tries = [line.split("   #")[0].strip() for line in out.split("\nTry:\n")[1].splitlines() if line.startswith("  ")]
    assert len(tries) == 6 and tries[-1].endswith("serve --dev")
    for command in tries[:-1]:  # (the last serves until stopped: run below)
        done = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=120, cwd=elsewhere,
                              check=False)
        assert done.returncode == 0, command + "\n" + done.stdout + done.stderr

    sql = gpufleet("--data-dir", data, "sql", "--format", "csv",
                   "SELECT count() AS n FROM gpufleet.workflow_windows FINAL", timeout=60)
    assert sql.returncode == 0, sql.stderr
    assert sql.stdout.split() == ["n", "190"]  # the jobs' windows only: a sum over them is allocated time

    refused = gpufleet("--data-dir", data, "sql", "DROP TABLE gpufleet.gpu_samples", timeout=60)
    assert refused.returncode != 0 and "DROP is refused on the read path" in refused.stderr

    # One vocabulary (schemas.vocabulary): every command counts the same allocated and wasted
    # GPU-hours from the same closed windows.
    def number(pattern: str, text: str) -> float:
        found = re.search(pattern, text, re.MULTILINE)
        assert found, text
        return float(found.group(1).replace(",", ""))

    def ok(*args: str) -> str:
        done = gpufleet("--data-dir", data, *args, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    goodput = ok("goodput", "--since", "all")
    allocated, wasted = number(r"^allocated +([\d,.]+)", goodput), number(r"^wasted: ([\d,.]+) GPU-hours", goodput)
    assert 0 < wasted < allocated
    page = tmp_path / "report.html"
    assert number(r"\(([\d,.]+) GPU-hours allocated", ok("report", "--since", "all", "--html", str(page))) == allocated
    assert number(r"Wasted GPU-hours<b>([\d,.]+)</b>", page.read_text()) == wasted
    causes = list(
        csv.DictReader(io.StringIO(ok("opportunities", "--since", "all", "--format", "csv", "--limit", "100")))
    )
    assert abs(sum(float(r["gpu_hours"]) for r in causes if ":" not in r["cause"]) - wasted) <= 0.01, causes
    listed = list(csv.DictReader(io.StringIO(ok("workflows", "--since-minutes", "100000", "--format", "csv"))))
    assert abs(sum(float(r["gpu_hours"]) for r in listed) - allocated) <= 0.01, listed
    assert abs(sum(float(r["wasted_gpu_hours"]) for r in listed) - wasted) <= 0.01, listed
    for r in listed:  # each job report says what the list says of its workflow
        report = ok("workflow", r["workflow"])
        assert abs(number(r"^allocated +([\d,.]+)", report) - float(r["gpu_hours"])) <= 0.006, report
        assert abs(number(r"^wasted: ([\d,.]+) GPU-hours", report) - float(r["wasted_gpu_hours"])) <= 0.006, report


    # The owners' service: the demo named the page of the job that never opened its GPUs; after
    # it, `gpufleet serve --dev` on loopback serves that page with the numbers `workflow` prints.
    idle = re.search(r"the job that never opened its GPUs, on the owners' service: "
                     r"http://127\.0\.0\.1:\d+/jobs/(\S+)", out).group(1)
    listed = ok("jobs", "--since", "all")
    assert idle in listed and "(10 rows)" in listed
    # Its report names its one cause, and it had one alert for it (issue 42), not start-up advice.
    told = ok("workflow", idle)
    assert "No process of the job ever opened its" in told and "Start-up took long" not in told, told
    alerts = gpufleet("--data-dir", data, "sql", "--format", "csv", "SELECT DISTINCT detector FROM "
                      f"gpufleet.alerts FINAL WHERE workflow_id = '{idle}' ORDER BY detector", timeout=60)
    assert alerts.stdout.split() == ["detector", "idle_allocated"], alerts.stdout
    serve = subprocess.Popen([sys.executable, "-m", "gpufleet", "--data-dir", data, "serve", "--dev",
                              "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        said = [serve.stdout.readline(), serve.stdout.readline()]  # the demo's broker is gone: the pages alone
        assert said[0].startswith("gpufleet serve: no actions (no --bootstrap given and no local broker"), said
        url = re.search(r"the owners' service at (http://\S+)", said[1]).group(1)
        with urllib.request.urlopen(f"{url}/api/jobs/{idle}", timeout=60) as answer:
            job = json.loads(answer.read())
        assert job["report"].splitlines()[0] == f"gpufleet job report: {idle}"
        assert abs(job["gpu_hours"] - number(r"^allocated +([\d,.]+)", ok("workflow", idle))) <= 0.006
        with urllib.request.urlopen(f"{url}/jobs/{idle}", timeout=60) as answer:
            assert answer.status == 200 and "/static/plotly.min.js" in answer.read().decode()
    finally:
        serve.terminate()
        serve.wait(30)


def test_the_demo_on_a_secure_cluster_runs_each_component_as_its_own_user(tmp_path):
    data = tmp_path / "data"
    demo = gpufleet("--data-dir", str(data), "demo", "--secure", "--hosts", "2", "--gpus-per-host", "2",
                    "--workflows", "4", "--sim-minutes", "3", "--speed", "60", "--max-wall-s", "150", timeout=240)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "SASL_SSL with mutual TLS and ACLs" in demo.stdout
    assert "rows stored: gpu_samples 1800, workflow_windows 20," in demo.stdout  # 4 GPUs and 6 replicas
    worker_log = (data / "worker.log").read_text()
    assert "(SASL_SSL, User:worker)" in worker_log  # as itself
    assert "AUTHORIZATION_FAILED" not in worker_log  # and it had what it needed
    assert "SASL_SSL" in (data / "kafka" / "node-1" / "server.properties").read_text()

