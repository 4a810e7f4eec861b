#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, prepared to run in one short call on a machine that has one
# and nothing else of ours: Python 3.12 with nvidia-ml-py, psutil, prometheus-client, pytest and
# PyTorch, no package index. What gpufleet's agent needs beyond that travels as wheels.
#
#   benchmarks/gpu_machine.sh wheels   here: .whl/ holds those wheels (the versions of .venv;
#                                      GPU_MACHINE_PY=3.11 for another Python), for the machine
#   benchmarks/gpu_machine.sh run      there (repository root, .whl/ beside it): writes to $OUT
#       nvml-check.log      a real NVML tick, the costliest calls, a small PyTorch load attributed
#       gpu-tests.log       tests/gpu: the agent's tick on real NVML readings, the profiling hook
#       agent_serving_gpu.txt  bench_agent_serving --nvml: the serving reading against a tick of the
#                           machine's own GPUs (as benchmarks/run.py keeps a result: copied to
#                           benchmarks/results/, write_docs.py shows it)
#
# Each step has its own time limit, so that what ran comes back; the whole takes about 7 minutes
# (GPU_MACHINE_BENCH_S, 240 by default, is the benchmark's share).
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=(cachetools fastavro msgspec pycurl)  # what the agent, its records and its serving reader import

case "${1:-}" in
wheels)
    set -e
    py=${GPU_MACHINE_PY:-3.12}
    rm -rf .whl && mkdir .whl
    for dist in "${WHEELS[@]}"; do
        version=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$dist'))")
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$dist==$version"
    done
    ls .whl
    ;;
run)
    out=${OUT:-/tmp/gpufleet-gpu-machine}
    mkdir -p "$out"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || { echo "the wheels did not install: run 'benchmarks/gpu_machine.sh wheels' here first"; exit 2; }
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    nvidia-smi -L | tee "$out/gpus.txt"
    echo "== nvml-check"
    timeout 120 python3 -m gpufleet.nvml_check --seconds 20 2>&1 | tee "$out/nvml-check.log"
    echo "== tests/gpu"
    timeout 180 python3 -m pytest --noconftest -p no:cacheprovider -q tests/gpu 2>&1 | tee "$out/gpu-tests.log"
    echo "== bench_agent_serving --nvml"
    bench_s=${GPU_MACHINE_BENCH_S:-240}
    GPUFLEET_BENCH_RESULTS="$out" timeout $((bench_s * 2)) python3 benchmarks/run.py agent_serving_gpu -- \
        python3 benchmarks/bench_agent_serving.py --nvml --budget-s "$bench_s"
    ;;
*)
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
