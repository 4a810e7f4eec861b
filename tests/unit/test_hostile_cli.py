"""Every command given what users get wrong (arguments, files, settings, ports, names): one line
that says what and how to fix it, a non-zero status (2 for a usage mistake, 1 for what goes
wrong running), and never a Python traceback. Each case runs ``gpufleet`` as its own process, as
a user would, with a data directory of its own and no broker."""

from __future__ import annotations

import gzip
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACE = next((ROOT.parent / "shared" / "traces").glob("simple_add*.json.gz"), None)

# Files the cases name: {name} in an argument becomes the file's path.
FILES = {
    "bad.toml": "this is = = not toml\n",
    "empty.toml": "",
    "thresholds-unknown.toml": "[default]\nno_such_threshold = 3\n",
    "thresholds-twenty.toml": '[default]\nlow_util_warn_pct = "twenty"\n',
    "thresholds-negative.toml": "[default]\nidle_min_s = -5\n",
    "thresholds-team-type.toml": '[teams]\nresearch = "loose"\n',
    "policy-unknown-detector.toml": '[[ladder]]\nname = "x"\ndetector = "no_such_detector"\n',
    "policy-brace.toml": '[[ladder]]\nname = "x"\ncommand = ["echo", "{"]\nact = true\n',
    "policy-order.toml": '[[ladder]]\nname = "x"\nfirst_warning_min = 10\nsecond_warning_min = 5\n',
    "policy-act-no-command.toml": '[[ladder]]\nname = "x"\nact = true\n',
    "policy-placeholder.toml": '[[ladder]]\nname = "x"\ncommand = ["kill", "{pid}"]\n',
    "policy-field.toml": '[[ladder]]\nname = "x"\nno_such_field = 1\n',
    "policy-negative.toml": '[[ladder]]\nname = "x"\nfirst_warning_min = -1\n',
    "policy-two-names.toml": '[[ladder]]\nname = "x"\n[[ladder]]\nname = "x"\n',
    "policy-ok.toml": '[[ladder]]\nname = "x"\n',
    "routing-ok.toml": '[default]\nwebhook = "http://127.0.0.1:1/"\n',
    "replay-header.csv": "time,pod,value\n1,a,3\n",
    "replay-metric.csv": "timestamp,container,metric,value\n1700000000,a,gpu_temperature,40\n",
    "replay-value.csv": "timestamp,container,metric,value\n1700000000,a,gpu_util_pct,high\n",
    "replay-nan-time.csv": "timestamp,container,metric,value\nnan,a,gpu_util_pct,40\n",
    "replay-ms-time.csv": "timestamp,container,metric,value\n1700000000000,a,gpu_util_pct,40\n",
    "replay-twice.csv": "timestamp,container,metric,value\n1700000000,a,gpu_util_pct,40\n1700000000,a,gpu_util_pct,9\n",
    "replay-container.csv": 'timestamp,container,metric,value\n1700000000,"a\x1b[2J",gpu_util_pct,40\n',
    "routing-webhook-number.toml": "[default]\nwebhook = 5\n",
    "routing-teams-string.toml": '[default]\nwebhook = "http://x/"\nteams = "all"\n',
    "routing-unknown.toml": '[defaults]\nwebhook = "http://x/"\n',
    "routing-smtp-port.toml": '[smtp]\nhost = "smtp"\nport = "twenty-five"\n',
    "routing-password-file.toml": '[smtp]\nhost = "smtp"\npassword_file = "/no/such/secret"\n',
    "routing-bad-url.toml": '[default]\nwebhook = "not a url"\n',
    "routing-pages.toml": '[default]\npages = "ftp://gpufleet/"\n',
    "routing-digest.toml": '[default]\nserving_digest_s = -5\n',
    "rates-price-number.toml": "price_per_gpu_hour = 5\n",
    "rates-price-text.toml": '[price_per_gpu_hour]\n"A100" = "four"\n',
    "rates-negative.toml": "default_price_per_gpu_hour = -2.0\n",
    "rates-series.toml": "[[grid_series]]\ncluster = 'x'\nstart = 'soon'\ng_per_kwh = 1\n",
    "not-json.json": "{this is not json",
    "empty.json": "",
    "list.json": "[1, 2, 3]",
    "events-wrong.json": '{"traceEvents": 5}',
    "text.txt": "hello\n",
}
BINARY = {
    "truncated.json.gz": lambda: gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "k", "ts": 1, "dur": 2')[:30],
    "not-gzip.json.gz": lambda: b"plain text, not gzip",
    "latin1.json": lambda: '{"traceEvents": [], "x": "\xe9"}'.encode("latin-1"),
}

# (id, arguments after `gpufleet --data-dir <tmp>`, a word the message must have, the status)
U, R = 2, 1
CASES = [
    # global
    ("log-level", ["--log-level", "bogus", "sql", "SELECT 1"], "invalid choice", U),
    ("no-command", [], "required", U),
    ("unknown-command", ["frobnicate"], "invalid choice", U),
    ("data-dir-no-value", ["--data-dir"], "expected one argument", U),
    # kafka
    ("kafka-brokers-0", ["kafka", "start", "--brokers", "0"], "at least 1", U),
    ("kafka-brokers-negative", ["kafka", "start", "--brokers", "-1"], "at least 1", U),
    ("kafka-brokers-text", ["kafka", "start", "--brokers", "three"], "not a whole number", U),
    ("kafka-port-70000", ["kafka", "start", "--port", "70000"], "not a port", U),
    ("kafka-port-negative", ["kafka", "start", "--port", "-5"], "not a port", U),
    ("kafka-action", ["kafka", "restart"], "invalid choice", U),
    ("kafka-port-in-use", ["kafka", "start", "--port", "{busy_port}"], "in use", R),
    ("kafka-ports-past-the-end", ["kafka", "start", "--brokers", "3", "--port", "65535"], "65535", U),
    ("kafka-stop-nothing", ["kafka", "stop"], "", 0),  # idempotent, as service managers' stop is
    ("kafka-access-dir-is-file", ["kafka-access", "credentials", "--dir", "{text.txt}"], "text.txt", U),
    ("kafka-access-grant-missing", ["kafka-access", "grant", "--dir", "{missing}"], "missing", U),
    ("topics-partitions-0", ["topics", "--partitions", "0"], "at least 1", U),
    ("topics-partitions-text", ["topics", "--partitions", "many"], "not a whole number", U),
    ("topics-no-broker", ["topics"], "no local broker", R),
    # worker
    ("worker-thresholds-missing", ["worker", "--thresholds", "{missing}"], "missing", U),
    ("worker-thresholds-bad-toml", ["worker", "--thresholds", "{bad.toml}"], "TOML", U),
    ("worker-thresholds-unknown", ["worker", "--thresholds", "{thresholds-unknown.toml}"], "no_such_threshold", U),
    ("worker-thresholds-twenty", ["worker", "--thresholds", "{thresholds-twenty.toml}"], "low_util_warn_pct", U),
    ("worker-thresholds-negative", ["worker", "--thresholds", "{thresholds-negative.toml}"], "idle_min_s", U),
    ("worker-thresholds-team-type", ["worker", "--thresholds", "{thresholds-team-type.toml}"], "research", U),
    ("worker-thresholds-directory", ["worker", "--thresholds", "{dir}"], "directory", U),
    ("worker-enforcement-missing", ["worker", "--enforcement", "{missing}"], "missing", U),
    ("worker-enforcement-detector", ["worker", "--enforcement", "{policy-unknown-detector.toml}"],
     "no_such_detector", U),
    ("worker-enforcement-bad-toml", ["worker", "--enforcement", "{bad.toml}"], "TOML", U),
    ("worker-window-0", ["worker", "--window-s", "0"], "greater than 0", U),
    ("worker-window-negative", ["worker", "--window-s", "-60"], "greater than 0", U),
    ("worker-window-text", ["worker", "--window-s", "a minute"], "not a number", U),
    ("worker-window-nan", ["worker", "--window-s", "nan"], "greater than 0", U),
    ("worker-lateness-negative", ["worker", "--lateness-s", "-1"], "0 or more", U),
    ("worker-low-util-200", ["worker", "--low-utilization-pct", "200"], "percentage", U),
    ("worker-budget-2", ["worker", "--profile-budget", "2"], "fraction", U),
    ("worker-metrics-port", ["worker", "--metrics-port", "70000"], "not a port", U),
    ("worker-no-broker", ["worker"], "no local broker", R),
    ("worker-data-dir-under-file", ["--data-dir", "{text.txt}/sub", "worker"], "text.txt", U),
    # sink
    ("sink-dsn-scheme", ["sink", "--clickhouse-dsn", "bogus://x"], "bogus", U),
    ("sink-metrics-port", ["sink", "--metrics-port", "99999"], "not a port", U),
    ("sink-metrics-port-in-use", ["sink", "--metrics-port", "{busy_port}"], "in use", R),
    ("sink-query-port", ["sink", "--query-port", "70000"], "not a port", U),
    ("sink-password-file", ["sink", "--clickhouse-dsn", "http://writer@127.0.0.1:1"], "no-such-password", U),
    ("sink-database-name", ["sink", "--database", "x; DROP TABLE y"], "database", U),
    ("sink-database-alias", ["sink", "--database", "s"], "choose another name", U),
    ("sink-no-broker", ["sink"], "no local broker", R),
    ("sink-stall-negative", ["sink", "--stall-exit-s", "-1"], "0 or more", U),
    ("notify-stall-text", ["notify", "--stall-exit-s", "half an hour"], "not a number", U),
    # notify
    ("notify-routing-missing", ["notify", "--routing", "{missing}"], "missing", U),
    ("notify-routing-bad-toml", ["notify", "--routing", "{bad.toml}"], "TOML", U),
    ("notify-routing-webhook-number", ["notify", "--routing", "{routing-webhook-number.toml}"], "webhook", U),
    ("notify-routing-teams-string", ["notify", "--routing", "{routing-teams-string.toml}"], "teams", U),
    ("notify-routing-unknown", ["notify", "--routing", "{routing-unknown.toml}"], "defaults", U),
    ("notify-routing-smtp-port", ["notify", "--routing", "{routing-smtp-port.toml}"], "port", U),
    ("notify-routing-password-file", ["notify", "--routing", "{routing-password-file.toml}"], "/no/such/secret", U),
    ("notify-routing-bad-url", ["notify", "--routing", "{routing-bad-url.toml}"], "not a url", U),
    ("notify-routing-pages", ["notify", "--routing", "{routing-pages.toml}"], "gpufleet serve", U),
    ("notify-routing-digest-negative", ["notify", "--routing", "{routing-digest.toml}"], "serving_digest_s", U),
    ("notify-reports-fortnight", ["notify", "--routing", "{routing-pages.toml}", "--reports", "fortnight"],
     "invalid choice", U),
    ("notify-routing-directory", ["notify", "--routing", "{dir}"], "directory", U),
    ("notify-rates-bad", ["notify", "--routing", "{routing-ok.toml}", "--rates", "{rates-price-number.toml}"],
     "price_per_gpu_hour", U),
    ("notify-metrics-port-in-use", ["notify", "--routing", "{routing-ok.toml}", "--metrics-port", "{busy_port}"],
     "in use", R),
    # agent
    ("agent-sim-unknown-host", ["agent", "--source", "sim", "--host", "nope"], "nope", U),
    ("agent-interval-0", ["agent", "--interval", "0"], "greater than 0", U),
    ("agent-interval-negative", ["agent", "--interval", "-1"], "greater than 0", U),
    ("agent-source", ["agent", "--source", "dcgm"], "invalid choice", U),
    ("agent-allocations", ["agent", "--allocations", "pbs"], "invalid choice", U),
    ("agent-spool-negative", ["agent", "--spool-max-mb", "-1"], "at least 1", U),
    ("agent-sim-hosts-0", ["agent", "--source", "sim", "--hosts", "0"], "at least 1", U),
    ("agent-sim-layout", ["agent", "--source", "sim", "--workflows", "100", "--hosts", "1", "--gpus-per-host", "2"],
     "at least as many GPUs", U),
    ("agent-metrics-port", ["agent", "--metrics-port", "99999"], "not a port", U),
    ("agent-send-every-negative", ["agent", "--send-every", "-5"], "0 or more", U),
    ("agent-nvml-missing", ["agent", "--source", "nvml"], "NVIDIA", R),
    # simulate
    ("simulate-layout", ["simulate", "--workflows", "100", "--hosts", "1", "--gpus-per-host", "2"],
     "at least as many GPUs", U),
    ("simulate-hosts-0", ["simulate", "--hosts", "0"], "at least 1", U),
    ("simulate-duration-negative", ["simulate", "--duration-s", "-10"], "greater than 0", U),
    ("simulate-interval-0", ["simulate", "--interval-s", "0"], "greater than 0", U),
    ("simulate-speed-negative", ["simulate", "--speed", "-1"], "0 or more", U),
    ("nvml-check-seconds", ["nvml-check", "--seconds", "-3"], "greater than 0", U),
    # slurm
    ("slurm-verb", ["slurm", "sbatch"], "invalid choice", U),
    ("slurm-comments-no-broker", ["slurm", "comments"], "no local broker", R),
    # profiles and traces
    ("profile-no-workflow", ["profile"], "workflow_id", U),
    ("profile-steps-0", ["profile", "wf", "--steps", "0"], "at least 1", U),
    ("profile-duration-text", ["profile", "wf", "--duration", "a while"], "duration", U),
    ("profile-timeout-negative", ["profile", "wf", "--timeout", "-1"], "greater than 0", U),
    ("profile-hostile-id", ["profile", "wf\n; rm -rf /"], "workflow", U),
    ("analyze-missing", ["analyze", "{missing}"], "missing", U),
    ("analyze-truncated", ["analyze", "{truncated.json.gz}"], "truncated.json.gz", U),
    ("analyze-not-gzip", ["analyze", "{not-gzip.json.gz}"], "not-gzip.json.gz", U),
    ("analyze-not-json", ["analyze", "{not-json.json}"], "not-json.json", U),
    ("analyze-empty", ["analyze", "{empty.json}"], "empty.json", U),
    ("analyze-list", ["analyze", "{list.json}"], "list.json", U),
    ("analyze-events-wrong", ["analyze", "{events-wrong.json}"], "traceEvents", U),
    ("analyze-latin1", ["analyze", "{latin1.json}"], "latin1.json", U),
    ("analyze-directory", ["analyze", "{dir}"], "directory", U),
    ("diff-one-side", ["diff", "{text.txt}"], "two", U),
    ("diff-missing", ["diff", "{missing}", "{missing}"], "missing", U),
    ("diff-vs-alone", ["diff", "vs"], "vs", U),
    ("diff-top-0", ["diff", "{missing}", "{missing}", "--top", "0"], "at least 1", U),
    ("ingest-trace-missing", ["ingest-trace", "{missing}", "--workflow", "wf"], "missing", U),
    ("ingest-trace-no-workflow", ["ingest-trace", "{text.txt}"], "--workflow", U),
    ("ingest-trace-hostile-id", ["ingest-trace", "{text.txt}", "--workflow", "wf\u0007bell"], "workflow", U),
    # queries (an empty embedded ClickHouse)
    ("sql-empty", ["sql", ""], "empty", U),
    ("sql-format", ["sql", "SELECT 1", "--format", "xml"], "invalid choice", U),
    ("sql-two-statements", ["sql", "SELECT 'a'; SELECT 'b'"], "one statement", U),
    ("sql-kill-query", ["sql", "KILL QUERY WHERE 1"], "KILL", U),
    ("sql-create", ["sql", "CREATE TABLE default.t (x Int8) ENGINE = Memory"], "CREATE is refused on the read path", U),
    ("sql-system", ["sql", "SYSTEM STOP MERGES"], "SYSTEM statements are refused", U),
    ("sql-typo", ["sql", "SELEC 1"], "SELEC is refused on the read path: it reads with SELECT", U),
    ("sql-syntax", ["sql", "SELECT (1"], "Syntax error", R),
    ("sql-file", ["sql", "SELECT * FROM file('/etc/passwd', 'LineAsString')"], "file() is refused on the read path", U),
    ("sql-file-function", ["sql", "SELECT file('/etc/passwd')"], "file() is refused on the read path", U),
    ("sql-url", ["sql", "SELECT * FROM url('http://127.0.0.1:1/', 'LineAsString')"], "url() is refused", U),
    ("sql-readonly", ["sql", "SELECT 1 SETTINGS readonly = 0"], "query path is read-only", R),
    ("sql-outfile", ["sql", "SELECT 1 INTO OUTFILE '{out}/written.txt'"], "INTO OUTFILE is refused", U),
    ("sql-dsn", ["sql", "SELECT 1", "--clickhouse-dsn", "bogus://x"], "bogus", U),
    ("workflows-since-negative", ["workflows", "--since-minutes", "-1"], "greater than 0", U),
    ("workflows-since-text", ["workflows", "--since-minutes", "a day"], "not a number", U),
    ("workflow-empty-id", ["workflow", ""], "workflow", U),
    ("workflow-hostile-id", ["workflow", "wf\x1b[31mred"], "workflow", U),
    ("workflow-rates-missing", ["workflow", "wf", "--rates", "{missing}"], "missing", U),
    ("job-not-a-number", ["job", "abc"], "Slurm job id", U),
    ("job-injection", ["job", "1;2"], "Slurm job id", U),
    ("job-service-not-http", ["job", "12", "--service", "file:///etc/passwd"], "http(s)://", U),
    ("jobs-since", ["jobs", "--since", "soon"], "--since", U),
    ("jobs-state", ["jobs", "--state", "lost"], "invalid choice", U),
    ("jobs-service-unreachable", ["jobs", "--url", "http://127.0.0.1:{busy_port}", "--munge-socket",
                                  "{missing}"], "MUNGE", R),
    ("serving-url-not-http", ["serving", "--url", "file:///etc/passwd"], "http(s)://", U),
    ("serving-url-own-margin", ["serving", "--url", "http://127.0.0.1:{busy_port}", "--margin", "0.5"],
     "leave out --peak-span-s and --margin", U),
    ("serve-no-proxy", ["serve"], "--trusted-proxy", U),
    ("serve-database-alias", ["serve", "--dev", "--database", "w"], "choose another name", U),
    ("goodput-database-name", ["goodput", "--database", "x; DROP TABLE y"], "database", U),
    ("goodput-database-system", ["goodput", "--database", "system"], "ClickHouse's own", U),
    ("serve-dev-everywhere", ["serve", "--dev", "--host", "0.0.0.0"], "loopback only", U),
    ("serve-proxy-not-an-address", ["serve", "--trusted-proxy", "the proxy"], "--trusted-proxy", U),
    ("serve-teams-not-toml", ["serve", "--dev", "--teams", "{text.txt}"], "text.txt", U),
    ("serve-port-70000", ["serve", "--dev", "--port", "70000"], "not a port", U),
    ("opportunities-limit-negative", ["opportunities", "--limit", "-1"], "at least 1", U),
    ("opportunities-limit-0", ["opportunities", "--limit", "0"], "at least 1", U),
    ("opportunities-by", ["opportunities", "--by", "colour"], "invalid choice", U),
    ("opportunities-since", ["opportunities", "--since", "7x"], "--since", U),
    ("opportunities-no-database", ["opportunities", "--by", "regression", "--since", "all"], "sink makes it", R),
    ("goodput-since-negative", ["goodput", "--since", "-3d"], "--since", U),
    ("serving-since", ["serving", "--since", "yesterday"], "--since", U),
    ("replay-no-source", ["replay"], "one of the arguments --alibaba --csv is required", U),
    ("replay-missing", ["replay", "--csv", "{missing}/fleet.csv"], "not found", U),
    ("replay-alibaba-file", ["replay", "--alibaba", "{rates-series.toml}"], "directory", U),
    ("replay-csv-header", ["replay", "--csv", "{replay-header.csv}"], "timestamp,container,metric,value", R),
    ("replay-csv-metric", ["replay", "--csv", "{replay-metric.csv}"], "is not one of", R),
    ("replay-csv-value", ["replay", "--csv", "{replay-value.csv}"], "must be numbers", R),
    ("replay-csv-nan-time", ["replay", "--csv", "{replay-nan-time.csv}"], "'nan' is not a time", R),
    ("replay-csv-ms-time", ["replay", "--csv", "{replay-ms-time.csv}"], "milliseconds?", R),
    ("replay-csv-twice", ["replay", "--csv", "{replay-twice.csv}"], "a second gpu_util_pct", R),
    ("replay-csv-container", ["replay", "--csv", "{replay-container.csv}"], "cannot name a replica", R),
    ("replay-service", ["replay", "--csv", "{replay-metric.csv}", "--service", "Llama 3 (70B)"],
     "team 'Llama 3 (70B)' has the character U+0028", U),
    ("replay-alibaba-empty", ["replay", "--alibaba", "{dir}"], "not found", R),
    ("replay-hours-0", ["replay", "--csv", "{replay-metric.csv}", "--hours", "0"], "greater than 0", U),
    ("serving-margin-negative", ["serving", "--margin", "-0.5"], "0 or more", U),
    ("serving-span-0", ["serving", "--peak-span-s", "0"], "greater than 0", U),
    ("serving-no-database", ["serving", "--since", "all"], "sink makes it", R),
    ("agent-serving-endpoint", ["agent", "--serving-endpoint", "http://127.0.0.1:8000/metrics"], "GPUS=URL", U),
    ("agent-serving-password", ["agent", "--serving-endpoint", "0=http://ana:s3cret@127.0.0.1:8000/metrics"],
     "--serving-netrc", U),
    ("agent-serving-netrc-missing", ["agent", "--serving-netrc", "{missing}/serving.netrc"], "No such file", U),
    ("agent-serving-netrc-open", ["agent", "--serving-netrc", "{empty.toml}"], "chmod 600", U),
    ("agent-serving-service", ["agent", "--serving-endpoint", "0=http://127.0.0.1:8000/metrics;service=" + "x" * 300],
     "is not a printable name of 1 to 256 characters", U),
    ("agent-serving-engine", ["agent", "--serving-endpoint", "0=http://h/metrics;engine=onnx"], "engine=", U),
    ("agent-serving-model", ["agent", "--serving-endpoint", "0=http://h/metrics;model=a\x1b[2Jb"], "model: ", U),
    ("goodput-rates-price-number", ["goodput", "--rates", "{rates-price-number.toml}"], "price_per_gpu_hour", U),
    ("goodput-rates-price-text", ["goodput", "--rates", "{rates-price-text.toml}"], "price_per_gpu_hour", U),
    ("goodput-rates-negative", ["goodput", "--rates", "{rates-negative.toml}"], "default_price_per_gpu_hour", U),
    ("goodput-rates-series", ["goodput", "--rates", "{rates-series.toml}"], "grid_series", U),
    ("goodput-rates-missing", ["goodput", "--rates", "{missing}"], "missing", U),
    ("goodput-by", ["goodput", "--by", "planet"], "invalid choice", U),
    ("goodput-limit-negative", ["goodput", "--limit", "-2"], "at least 1", U),
    ("report-missing-directory", ["report", "--html", "{missing}/r.html", "--since", "all"], "missing", U),
    ("report-html-directory", ["report", "--html", "{dir}", "--since", "all"], "directory", U),
    ("report-no-html", ["report"], "--html", U),
    ("report-since", ["report", "--html", "{out}/r.html", "--since", "forever"], "--since", U),
    ("clickhouse-users-database", ["clickhouse-users", "--database", "x`; DROP"], "database", U),
    # schemas, enforce, demo
    ("schemas-port-70000", ["schemas", "serve", "--port", "70000"], "not a port", U),
    ("schemas-port-negative", ["schemas", "serve", "--port", "-1"], "not a port", U),
    ("schemas-port-in-use", ["schemas", "serve", "--port", "{busy_port}"], "in use", R),
    ("schemas-verb", ["schemas", "publish"], "invalid choice", U),
    ("enforce-policy-missing", ["enforce", "--policy", "{missing}"], "missing", U),
    ("enforce-policy-detector", ["enforce", "--policy", "{policy-unknown-detector.toml}"], "no_such_detector", U),
    ("enforce-policy-brace", ["enforce", "--policy", "{policy-brace.toml}"], "command", U),
    ("enforce-policy-order", ["enforce", "--policy", "{policy-order.toml}"], "order", U),
    ("enforce-policy-act-no-command", ["enforce", "--policy", "{policy-act-no-command.toml}"], "no command", U),
    ("enforce-policy-placeholder", ["enforce", "--policy", "{policy-placeholder.toml}"], "pid", U),
    ("enforce-policy-field", ["enforce", "--policy", "{policy-field.toml}"], "no_such_field", U),
    ("enforce-policy-negative", ["enforce", "--policy", "{policy-negative.toml}"], "first_warning_min", U),
    ("enforce-policy-two-names", ["enforce", "--policy", "{policy-two-names.toml}"], "same name", U),
    ("enforce-policy-empty", ["enforce", "--policy", "{empty.toml}"], "no ladder", U),
    ("enforce-retries-negative", ["enforce", "--policy", "{policy-ok.toml}", "--retries", "-1"], "0 or more", U),
    ("enforce-timeout-0", ["enforce", "--policy", "{policy-ok.toml}", "--timeout-s", "0"], "greater than 0", U),
    ("enforce-metrics-port-in-use", ["enforce", "--policy", "{policy-ok.toml}", "--metrics-port", "{busy_port}"],
     "in use", R),
    ("demo-hosts-0", ["demo", "--hosts", "0"], "at least 1", U),
    ("demo-layout", ["demo", "--workflows", "100", "--hosts", "1", "--gpus-per-host", "2"], "at least as many GPUs", U),
    ("demo-minutes-negative", ["demo", "--sim-minutes", "-1"], "greater than 0", U),
    ("demo-speed-0", ["demo", "--speed", "0"], "greater than 0", U),
    ("demo-query-port", ["demo", "--query-port", "port"], "not a whole number", U),
    ("demo-kafka-port", ["demo", "--kafka-port", "-1"], "a port", U),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    for name, text in FILES.items():
        (tmp / name).write_text(text)
    for name, make in BINARY.items():
        (tmp / name).write_bytes(make())
    (tmp / "dir").mkdir()
    (tmp / "out").mkdir()
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    busy.listen()
    yield tmp, busy.getsockname()[1]
    busy.close()


def run(world, args: list[str]) -> subprocess.CompletedProcess:
    tmp, busy = world
    names = {**{n: str(tmp / n) for n in (*FILES, *BINARY, "dir", "out")}, "missing": str(tmp / "missing"),
             "busy_port": str(busy)}
    argv = []
    for a in args:
        for name, value in names.items():
            a = a.replace("{" + name + "}", value)
        argv.append(a)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env["GPUFLEET_CLICKHOUSE_PASSWORD_FILE"] = str(tmp / "no-such-password")
    env["PYTHONPATH"] = str(ROOT)  # this checkout's gpufleet, wherever the case runs
    data = tmp / "data" / str(abs(hash(tuple(args))))
    return subprocess.run([sys.executable, "-m", "gpufleet", "--data-dir", str(data), *argv], capture_output=True,
                          text=True, timeout=120, env=env, cwd=tmp, stdin=subprocess.DEVNULL, check=False)


@pytest.fixture(scope="module")
def outcomes(world):
    """Every case run once, two at a time."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(zip((c[0] for c in CASES), pool.map(lambda c: run(world, c[1]), CASES)))
    return done


def test_there_are_at_least_a_hundred_cases_across_every_command():
    from gpufleet.cli import build_parser

    commands = {c[1][c[1].index(next(a for a in c[1] if not a.startswith("-") and a not in ("{text.txt}/sub",)))]
                for c in CASES if c[1] and not c[1][0].startswith("-")}
    assert len(CASES) >= 100 and len({c[0] for c in CASES}) == len(CASES)
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) <= commands, f"commands without a hostile case: {set(sub.choices) - commands}"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_mistake_gets_one_clear_line_never_a_traceback(outcomes, case):
    name, _, words, status = case
    done = outcomes[name]
    out = done.stdout + done.stderr
    assert "Traceback (most recent call last)" not in out, out[-2000:]
    assert done.returncode == status, f"exit {done.returncode}: {out[-1000:]}"
    if status:
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        assert last.startswith("gpufleet") and words.lower() in last.lower(), out[-1000:]


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    """``gpufleet ... | head -1``: the rest of the output has nowhere to go; like cat and grep,
    the command stops with SIGPIPE's status and no message (it printed 'Broken pipe', status 1)."""
    import subprocess
    import sys

    from tests.support.traces import synthetic_job_trace

    trace = synthetic_job_trace(tmp_path / "t.json")
    # ten copies of a 15 kB analysis: more than a pipe holds, so the writer meets the closed end
    proc = subprocess.Popen([sys.executable, "-m", "gpufleet", "analyze", "--json", *[str(trace)] * 10],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.read(1) == b"{"
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err.decode()) == (141, "")
