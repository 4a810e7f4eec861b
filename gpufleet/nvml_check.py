"""``gpufleet nvml-check``: the real NVML path on a machine with NVIDIA GPUs.

Prints one tick for every GPU and its processes, then samples for ``--seconds`` while a small
PyTorch matrix-multiply load (if PyTorch is there) runs on every GPU as workflow
``nvml-check``, and says whether the sampler saw the load and attributed it. Needs only
nvidia-ml-py (and torch for the load): ``python -m gpufleet.nvml_check`` runs it without
gpufleet's other dependencies.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import asdict

from producers.agent.gpus.attribute_process import ProcessAttributor
from producers.agent.gpus.sample_nvml import NvmlSampler, NvmlUnavailable

LOAD = r"""
import sys, time, torch
n = torch.cuda.device_count()
xs = [torch.randn(4096, 4096, device=f"cuda:{i}", dtype=torch.bfloat16) for i in range(n)]
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for x in xs:
        for _ in range(20):
            x @ x
    for i in range(n):
        torch.cuda.synchronize(i)
    time.sleep(0.05)  # leave the GPUs partly idle: utilisation should read between 0 and 100
"""


def _fmt(reading) -> str:
    d = asdict(reading)
    procs = d.pop("processes")
    fields = ", ".join(f"{k}={v}" for k, v in d.items() if v not in (None, []))
    lines = [f"  {fields}"]
    lines += [f"    process {p['pid']}: memory {p['used_memory_bytes']}, SM {p['sm_util_pct']}%" for p in procs]
    return "\n".join(lines)


class TimedNvml:
    """The pynvml module with a stopwatch on every ``nvml*`` function: which calls a tick pays for."""

    def __init__(self, module) -> None:
        self._module = module
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str):
        value = getattr(self._module, name)
        if not (name.startswith("nvml") and callable(value)):
            return value

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
                self.calls[name] = self.calls.get(name, 0) + 1
        return timed

    def slowest(self, ticks: int, top: int = 6) -> list[str]:
        ranked = sorted(self.seconds.items(), key=lambda kv: -kv[1])[:top]
        return [f"  {name}: {1000 * total / max(ticks, 1):.2f} ms per tick ({self.calls[name]} calls)"
                for name, total in ranked]


def main(argv: list[str] | None = None, nvml=None) -> int:
    """Run the check; ``nvml`` replaces the pynvml module (tests)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--no-load", action="store_true")
    args = parser.parse_args(argv)
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            nvml = None  # the sampler says what is missing
    timed = TimedNvml(nvml) if nvml is not None else None
    sampler = NvmlSampler(timed)
    try:
        devices = sampler.open()
    except NvmlUnavailable as exc:
        print(exc)
        return 2
    print(f"{len(devices)} device(s):")
    for reading in sampler.tick():
        print(_fmt(reading))
    load = None
    if not args.no_load:
        env = {**os.environ, "GPUFLEET_WORKFLOW_ID": "nvml-check", "GPUFLEET_OWNER": "nvml-check"}
        load = subprocess.Popen([sys.executable, "-c", LOAD, str(args.seconds)], env=env)
        print(f"load running as pid {load.pid} (workflow nvml-check)")
    attributor = ProcessAttributor()
    seen: dict[str, dict] = {
        r.uuid: {"util": [], "sm_active": [], "power": [], "workflows": set()} for r in sampler.tick()
    }
    t_end = time.monotonic() + args.seconds
    ticks = 0
    tick_s: list[float] = []
    timed.seconds.clear()
    timed.calls.clear()
    cpu0 = time.process_time()
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        readings = sampler.tick()
        tick_s.append(time.monotonic() - t0)
        for r in readings:
            s = seen[r.uuid]
            s["util"].append(r.utilization_pct or 0.0)
            if r.sm_active_pct is not None:
                s["sm_active"].append(r.sm_active_pct)
            if r.power_watts is not None:
                s["power"].append(r.power_watts)
            s["workflows"].update(attributor.attribute(p.pid).workflow_id for p in r.processes)
        ticks += 1
        time.sleep(max(0.0, args.interval - (time.monotonic() - t0)))
    if load is not None:
        load.wait(30)
    sampler.close()
    cpu = time.process_time() - cpu0
    print(f"\nsampled {ticks} ticks in {args.seconds:g}s; one NVML tick took {1000 * sum(tick_s) / len(tick_s):.1f} ms "
          f"on average, {1000 * max(tick_s):.1f} ms at most; this process used {100 * cpu / args.seconds:.2f}% "
          "of one core (sampling and attribution); the NVML calls that cost most:")
    print("\n".join(timed.slowest(ticks)))
    ok = True
    for uuid, s in seen.items():
        mean = sum(s["util"]) / max(1, len(s["util"]))
        gpm = f", SM active mean {sum(s['sm_active']) / len(s['sm_active']):.1f}%" if s["sm_active"] else ", no GPM"
        power = f", power mean {sum(s['power']) / len(s['power']):.0f} W" if s["power"] else ""
        print(f"{uuid}: utilisation mean {mean:.1f}% max {max(s['util'], default=0):.0f}%{gpm}{power}; "
              f"workflows seen: {sorted(s['workflows']) or 'none'}")
        if load is not None:
            saw_load = max(s["util"], default=0) > 0 and "nvml-check" in s["workflows"]
            ok = ok and saw_load
            print(f"  {'PASS' if saw_load else 'FAIL'}: the load was {'' if saw_load else 'not '}seen and attributed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
