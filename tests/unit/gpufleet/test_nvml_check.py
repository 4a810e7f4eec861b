import re

from gpufleet.nvml_check import TimedNvml, main
from tests.support.fake_nvml import FakeGpu, FakeNvml, FakeProcess

# A line of the report of the NVML calls that cost most: the call, its time per tick, its calls.
SLOWEST = re.compile(r"  (nvml\w+): (\d+\.\d\d) ms per tick \((\d+) calls\)")


def test_check_prints_every_gpu_and_its_processes(capsys):
    nvml = FakeNvml([FakeGpu("GPU-a", processes=[FakeProcess(4242, sm_util=30)]), FakeGpu("GPU-b")])
    assert main(["--seconds", "0.3", "--interval", "0.1", "--no-load"], nvml=nvml) == 0
    out = capsys.readouterr().out
    assert "2 device(s)" in out and "uuid=GPU-a" in out and "process 4242" in out
    assert "GPU-b: utilisation mean 50.0%" in out
    # Which calls rank first is the stopwatch's to say: on the fake's microsecond calls, a moment
    # of the machine's inside one call reorders them (a test that named one among the first six
    # failed under a loaded make test), so the report is held to its form and its order.
    report = out.split("the NVML calls that cost most:\n", 1)[1].split("\nGPU-a:", 1)[0].splitlines()
    rows = [SLOWEST.fullmatch(line) for line in report]
    assert 1 <= len(rows) <= 6 and all(rows), report
    assert all(callable(getattr(nvml, row[1], None)) and int(row[3]) > 0 for row in rows)
    per_tick = [float(row[2]) for row in rows]
    assert per_tick == sorted(per_tick, reverse=True)


def test_the_calls_are_ranked_by_their_time_per_tick():
    timed = TimedNvml(FakeNvml([FakeGpu("GPU-a")]))
    timed.nvmlDeviceGetCount()
    timed.nvmlDeviceGetCount()
    assert timed.calls == {"nvmlDeviceGetCount": 2} and timed.seconds["nvmlDeviceGetCount"] >= 0
    timed.seconds = {"nvmlA": 0.002, "nvmlB": 0.010, "nvmlC": 0.004}
    timed.calls = {"nvmlA": 4, "nvmlB": 2, "nvmlC": 8}
    assert timed.slowest(ticks=2, top=2) == ["  nvmlB: 5.00 ms per tick (2 calls)",
                                             "  nvmlC: 2.00 ms per tick (8 calls)"]


def test_check_without_a_driver_says_so(capsys):
    assert main(["--no-load"], nvml=FakeNvml([], driver=False)) == 2
    assert "no NVIDIA driver found" in capsys.readouterr().out
