from gpufleet.nvml_check import main
from tests.support.fake_nvml import FakeGpu, FakeNvml, FakeProcess


def test_check_prints_every_gpu_and_its_processes(capsys):
    nvml = FakeNvml([FakeGpu("GPU-a", processes=[FakeProcess(4242, sm_util=30)]), FakeGpu("GPU-b")])
    assert main(["--seconds", "0.3", "--interval", "0.1", "--no-load"], nvml=nvml) == 0
    out = capsys.readouterr().out
    assert "2 device(s)" in out and "uuid=GPU-a" in out and "process 4242" in out
    assert "GPU-b: utilisation mean 50.0%" in out
    assert "the NVML calls that cost most:" in out and "  nvmlDeviceGetUtilizationRates: " in out


def test_check_without_a_driver_says_so(capsys):
    assert main(["--no-load"], nvml=FakeNvml([], driver=False)) == 2
    assert "no NVIDIA driver found" in capsys.readouterr().out
