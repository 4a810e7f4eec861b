"""The checks prepared for a lent GPU machine (``benchmarks/gpu_machine.sh``): the wheels it carries
are all that the agent's GPU tests and the serving benchmark import beyond that machine's image,
and the benchmark's rounds are sized to the time such a machine is lent for."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_machine.sh"
# What the GPU machine's image holds that these imports need (its package list: PyTorch's Python
# with nvidia-ml-py, psutil, prometheus-client and pytest, and what pytest itself needs)
IMAGE = ("nvidia-ml-py", "psutil", "prometheus_client", "typing_extensions", "pytest", "pluggy", "iniconfig",
         "packaging", "Pygments")
IMPORTED = ("benchmarks.bench_agent_serving", "gpufleet.nvml_check", "tests.gpu.test_real_gpu")


def carried() -> list[str]:
    """The distributions the script carries as wheels (its ``WHEELS``)."""
    found = re.search(r"^WHEELS=\(([^)]*)\)", SCRIPT.read_text(), re.MULTILINE)
    assert found, "gpu_machine.sh names its wheels in WHEELS=(...)"
    return found.group(1).split()


def importing(modules: tuple[str, ...], distributions: list[str], site: Path) -> subprocess.CompletedProcess:
    """A Python importing ``modules`` with the repository and ``distributions`` alone (copied from
    this venv to ``site``): no site-packages, as on the GPU machine with the wheels installed."""
    for name in distributions:
        dist = importlib.metadata.distribution(name)
        for file in dist.files or ():
            source = Path(dist.locate_file(file))
            if source.is_file() and ".dist-info" not in str(file) and not str(file).startswith(".."):
                (site / file).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, site / file)
    code = f"import sys; sys.path[:0] = [{str(site)!r}, {str(ROOT)!r}]\n" + "".join(f"import {m}\n" for m in modules)
    return subprocess.run([sys.executable, "-I", "-S", "-c", code], check=False, capture_output=True, text=True,
                          timeout=120)


def test_the_carried_wheels_and_the_image_are_all_the_gpu_checks_import(tmp_path):
    done = importing(IMPORTED, [*carried(), *IMAGE], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]


def test_without_a_carried_wheel_the_import_fails(tmp_path):
    """The check above can fail: leave out pycurl (the serving reader's HTTP) and it does."""
    done = importing(IMPORTED, [n for n in (*carried(), *IMAGE) if n != "pycurl"], tmp_path)
    assert done.returncode != 0 and "No module named 'pycurl'" in done.stderr


@pytest.mark.parametrize(("share_s", "turn_s", "sized_as"), [
    (None, 0.04, (21, 60)),  # no budget: the rounds asked for
    (1000.0, 0.04, (21, 60)),  # room for more: never more than asked
    (50.0, 0.04, (19, 60)),  # 20 rounds fit: an odd number, for a median of its own
    (14.0, 0.04, (5, 60)),  # 5 fit
    (7.0, 0.04, (5, 30)),  # 2 fit: never fewer than 5 rounds, shorter ones, whole 30s of ticks
    (1.0, 0.04, (5, 30)),  # never shorter than 30
])
def test_the_benchmarks_rounds_fit_the_time_it_is_given(share_s, turn_s, sized_as, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from bench_agent_serving import sized

    assert sized(21, 60, turn_s, share_s) == sized_as
