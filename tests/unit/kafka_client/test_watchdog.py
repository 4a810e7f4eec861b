"""A component whose consume loop stops going round ends, with its stacks, for its supervisor to
start it again (``kafka_client.watchdog``), even where the call it is stuck in holds the GIL, as
librdkafka's stuck rebalance does; and one whose loop goes round is left alone. Each loop runs in
a process of its own (the watchdog's timer ends the whole process), against a broker that is not
there: its batches come back empty, and its step is called for each."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time

import pytest

from gpufleet.cli import build_parser
from gpufleet.commands.common import watch
from kafka_client.watchdog import Watchdog

LOOP = """
import ctypes, sys, threading, time
from kafka_client.consume_loop import ConsumeLoop
from kafka_client.metrics import ComponentMetrics
from kafka_client.watchdog import Watchdog

stall_s, stuck_at, stop_after_s = float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
loop = ConsumeLoop(sys.argv[1], "g", ["t"], ComponentMetrics("watchdog-test"), "test",
                   consumer_overrides={"log_level": 0})
loop.watchdog = Watchdog(stall_s)
stop, rounds, began = threading.Event(), [0], time.monotonic()

def stuck_in_a_call_that_holds_the_gil(seconds):
    ctypes.PyDLL(None).sleep(seconds)  # (PyDLL: the GIL held through the call, as in confluent-kafka's callback)

def step(batch):
    rounds[0] += 1
    print("round", rounds[0], flush=True)
    if rounds[0] == stuck_at:
        stuck_in_a_call_that_holds_the_gil(20)
    if time.monotonic() - began > stop_after_s:
        stop.set()

loop.run(stop, step, batch_wait_s=0.05)
print("stopped as asked", flush=True)
"""


@pytest.fixture
def nowhere() -> str:
    """A loopback address no broker listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def run_loop(nowhere: str, stall_s: float, stuck_at: int, stop_after_s: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(LOOP), nowhere, str(stall_s), str(stuck_at),
                           str(stop_after_s)], check=False, capture_output=True, text=True, timeout=120)


def test_a_loop_stuck_in_a_call_that_holds_the_gil_ends_its_process_with_the_stacks(nowhere):
    began = time.monotonic()
    done = run_loop(nowhere, stall_s=1.0, stuck_at=3, stop_after_s=2.0)  # (unwatched: stopped after its 20 s)
    took = time.monotonic() - began
    assert done.returncode == 1, done.stderr[-2000:]
    assert "round 3" in done.stdout and "stopped as asked" not in done.stdout
    assert "Timeout (0:00:01.100000)!" in done.stderr  # (faulthandler's words: 1.1 x stall_s)
    assert "stuck_in_a_call_that_holds_the_gil" in done.stderr and "step" in done.stderr
    assert took < 15  # (ended by the watchdog, long before the stuck call's own 20 s were over)


def test_a_loop_that_goes_round_is_left_alone_past_its_stall_time(nowhere):
    done = run_loop(nowhere, stall_s=0.5, stuck_at=0, stop_after_s=3.0)  # (6 times the stall time)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "stopped as asked" in done.stdout and "Timeout" not in done.stderr
    rounds = [line for line in done.stdout.splitlines() if line.startswith("round")]
    assert len(rounds) > 10


def test_a_watchdog_refuses_a_stall_time_that_is_not_a_positive_number():
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="positive number of seconds"):
            Watchdog(bad)


@pytest.mark.parametrize("command", [["sink"], ["notify", "--routing", "r.toml"], ["enforce", "--policy", "p.toml"],
                                     ["slurm", "comments"]])
def test_every_consume_loop_command_keeps_a_watchdog_unless_told_0(command, monkeypatch):
    class Loop:
        watchdog = None

    monkeypatch.delenv("GPUFLEET_STALL_EXIT_S", raising=False)
    args = build_parser().parse_args(command)
    assert args.stall_exit_s == 1800.0
    watch(args, loop := Loop())
    assert loop.watchdog is not None and loop.watchdog.stall_s == 1800.0
    monkeypatch.setenv("GPUFLEET_STALL_EXIT_S", "0")
    watch(build_parser().parse_args(command), loop := Loop())
    assert loop.watchdog is None
