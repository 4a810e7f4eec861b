# Two commands do all set-up on a fresh machine (Python 3.11+, Java 17+, Maven):
#   make demo   - the whole pipeline on a simulated fleet, with live progress and a summary
#   make test   - unit and integration tests (starts its own Kafka broker)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
JARS   := docker/kafka/libs/.fetched

.PHONY: setup demo test test-unit lint bench bench-fleet bench-hta chromium slurm torch-env proto clean

setup: $(BIN)/.installed $(JARS)

$(BIN)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "gpufleet needs Python >= 3.11, found " + sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

$(JARS): docker/kafka/pom.xml
	@command -v mvn >/dev/null || { echo "Maven (mvn) is needed to fetch the Kafka jars"; exit 1; }
	rm -rf docker/kafka/libs
	mvn -q -B -f docker/kafka/pom.xml package
	@touch $@

demo: setup
	$(BIN)/gpufleet demo

test: setup lint chromium slurm torch-env
	$(BIN)/pytest

# PyTorch for the training process of the profiling tests only (never a gpufleet dependency:
# it is the optional 'profiling' extra); where it cannot be installed those tests are skipped.
torch-env:
	@[ -x .venv-torch/bin/python ] || { $(PYTHON) -m venv .venv-torch && .venv-torch/bin/pip install -q 'torch>=2.2'; } \
		|| { rm -rf .venv-torch; echo "note: PyTorch could not be installed; the profiling tests will be skipped"; }

# Headless Chromium renders the fleet report in a test; installed from Debian's packages
# where this machine allows it, else that one test is skipped (and says why).
chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; } \
		|| echo "note: chromium not installed; the report rendering test will be skipped"

# A one-node Slurm with its accounting (slurmctld, slurmd, slurmdbd on MariaDB, munge) for the
# scheduler tests; installed from Debian's packages where this machine allows it (root and apt;
# no service is started by the install), else those tests are skipped (and say why).
SLURM_PACKAGES := slurm-wlm slurmdbd munge mariadb-server
slurm:
	@{ command -v slurmctld && command -v slurmdbd && command -v munged && command -v mariadbd; } >/dev/null \
		|| { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && export DEBIAN_FRONTEND=noninteractive \
			&& { apt-get install -y -q $(SLURM_PACKAGES) || { apt-get update -q && apt-get install -y -q $(SLURM_PACKAGES); }; } \
			>/dev/null 2>&1; } \
		|| echo "note: Slurm could not be installed; the Slurm tests will be skipped"

test-unit: setup
	$(BIN)/pytest tests/unit

lint: setup
	$(BIN)/ruff check producers streams schemas kafka_client sinks gpufleet tests benchmarks

# Each benchmark's output is kept in benchmarks/results/ (benchmarks/run.py) and docs/benchmarks.md
# made from those files, so that no figure in the docs is older than its benchmark.
RUN_BENCH := $(BIN)/python benchmarks/run.py
bench: setup bench-hta
	$(RUN_BENCH) trace_analysis -- $(BIN)/python benchmarks/bench_trace_analysis.py --scale 10 --made
	$(RUN_BENCH) trace_stage -- $(BIN)/python benchmarks/bench_trace_stage.py
	$(RUN_BENCH) window_utilization -- $(BIN)/python benchmarks/bench_window_utilization.py
	$(RUN_BENCH) agent -- $(BIN)/python benchmarks/bench_agent.py
	$(RUN_BENCH) agent_serving -- $(BIN)/python benchmarks/bench_agent.py --serving-only
	$(RUN_BENCH) serving_stage -- $(BIN)/python benchmarks/bench_serving_stage.py
	$(RUN_BENCH) replay -- $(BIN)/python benchmarks/bench_replay.py
	$(RUN_BENCH) sink -- $(BIN)/python benchmarks/bench_sink.py
	$(RUN_BENCH) query_server -- $(BIN)/python benchmarks/bench_query_server.py
	$(RUN_BENCH) job_page -- $(BIN)/python benchmarks/bench_job_page.py
	$(RUN_BENCH) owners_load -- $(BIN)/python benchmarks/bench_owners_load.py
	$(RUN_BENCH) services -- $(BIN)/python benchmarks/bench_services.py
	$(RUN_BENCH) stream -- $(BIN)/python benchmarks/bench_stream.py
	$(BIN)/python benchmarks/write_docs.py

# The fleet's benchmarks: several workers and sinks on a 3-broker cluster, and a half-hour soak of
# random kills (about 45 minutes in all).
bench-fleet: setup
	$(RUN_BENCH) fleet -- $(BIN)/python benchmarks/bench_fleet.py
	$(RUN_BENCH) sink_kafka -- $(BIN)/python benchmarks/bench_sink_kafka.py
	$(RUN_BENCH) soak -- $(BIN)/python benchmarks/soak.py --minutes 32 --fault-every-s 60 --seed 30
	$(BIN)/python benchmarks/write_docs.py

# Holistic Trace Analysis in an environment of its own, only to compare against in benchmarks,
# with the pandas and NumPy of its time: under pandas 3 and NumPy 2 its critical path and call
# graph fail (DataFrame.drop with axis and columns; np.unique on object arrays) or lose edges.
bench-hta: benchmarks/.venv-hta/bin/python
benchmarks/.venv-hta/bin/python:
	$(PYTHON) -m venv benchmarks/.venv-hta
	benchmarks/.venv-hta/bin/pip install -q holistictraceanalysis==0.5.0 "pandas<2.3" "numpy<2"

# The kubelet's pod resources API (gRPC) as Python modules, made from the .proto beside them.
proto: setup
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. producers/podresources_v1/api.proto

clean:
	rm -rf $(VENV) .venv-torch docker/kafka/libs data .pytest_cache
