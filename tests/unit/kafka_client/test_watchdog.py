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
from kafka_client.watchdog import Progress, Watchdog

LOOP = """
import ctypes, sys, threading, time
from kafka_client.consume_loop import ConsumeLoop
from kafka_client.metrics import ComponentMetrics
from kafka_client.watchdog import Progress, Watchdog

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


# -- a consumer whose loop goes round but whose partitions no longer move (the Faust worker) --


def test_a_partition_with_messages_waiting_that_does_not_move_is_stuck_after_the_stall_time():
    progress = Progress(stall_s=60)
    a, b = ("t", 0), ("t", 1)
    assert progress.check(0, {a: (5, 100), b: (0, 40)}) is None
    assert progress.check(59, {a: (9, 100), b: (0, 40)}) is None
    stuck = progress.check(60, {a: (9, 100), b: (0, 40)})
    assert stuck == "partitions stuck: t[0] (9 messages waiting at offset 100 for 60 s)"


def test_a_partition_that_moves_or_has_nothing_waiting_is_never_stuck():
    progress = Progress(stall_s=60)
    a, b = ("t", 0), ("t", 1)
    for minute in range(10):  # a moves on each minute; b is idle: caught up, nothing waiting
        assert progress.check(minute * 60, {a: (50, 100 + minute), b: (0, 40)}) is None
    # A partition caught up now and then is judged from the last time it was.
    assert progress.check(600, {a: (0, 200)}) is None
    assert progress.check(659, {a: (3, 200)}) is None
    assert progress.check(660, {a: (3, 200)}) is not None


def test_a_partition_given_again_is_judged_from_its_new_assignment():
    progress = Progress(stall_s=60)
    a = ("t", 0)
    assert progress.check(0, {a: (5, 100)}) is None
    assert progress.check(30, {}) is None  # a went to another consumer
    assert progress.check(70, {a: (5, 100)}) is None  # and came back: its clock starts again
    assert progress.check(129, {a: (5, 100)}) is None
    assert progress.check(130, {a: (5, 100)}) is not None


def test_a_rebalance_or_a_recovery_that_lasts_the_stall_time_is_stuck():
    progress = Progress(stall_s=60)
    a = ("t", 0)
    assert progress.check(0, {a: (5, 100)}) is None
    assert progress.check(50, None) is None  # a rebalance: a's clock is forgotten with its assignment
    assert progress.check(109, None) is None
    assert progress.check(110, None) == "a rebalance or the recovery of the state has lasted 60 s"
    progress = Progress(stall_s=60)
    assert progress.check(0, None) is None
    assert progress.check(30, {a: (5, 100)}) is None  # it ended: a is judged from here
    assert progress.check(60, None) is None  # another began: timed from its own start
    assert progress.check(119, None) is None
    assert progress.check(120, None) is not None


def test_progress_refuses_a_stall_time_that_is_not_a_positive_number():
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="positive number of seconds"):
            Progress(bad)
