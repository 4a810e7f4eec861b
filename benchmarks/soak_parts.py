"""The soak's moving parts: the components it starts and kills (gpufleet processes, sinks that
die between an insert and its commit) and the webhook the notifier delivers to."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sinks.consume_to_clickhouse import ClickHouseSink
from sinks.write_clickhouse import ClickHouseWriter

PREFIX = "soak."  # every topic and group of the soak

# Components that ended without being killed (what a supervisor would have started again): each
# one a violation, named with its exit status or exception. The soak starts them again as a
# supervisor would, when it next comes to them.
ENDED_BY_ITSELF: list[str] = []


class Webhook(BaseHTTPRequestHandler):
    received: ClassVar[list[dict]] = []
    lock = threading.Lock()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "gpufleet_alert" in body:
            with Webhook.lock:
                Webhook.received.append(body["gpufleet_alert"])
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


class Process:
    """A gpufleet command as its own process, killed and started again by the schedule."""

    def __init__(self, name: str, argv: list[str], log_dir: Path) -> None:
        self.name, self.argv, self.log = name, argv, log_dir / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.reported: int | None = None  # the process found ended by itself

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "gpufleet", *self.argv], stdout=self.log.open("ab"),
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def kill(self) -> None:
        self.ended()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def ended(self) -> bool:
        """Whether the process ended without being killed (recorded once in ``ENDED_BY_ITSELF``)."""
        if self.proc is None or self.proc.poll() is None or self.proc.pid == self.reported:
            return False
        self.reported = self.proc.pid
        ENDED_BY_ITSELF.append(f"{self.name} (exit status {self.proc.returncode}; its log: {self.log})")
        return True

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class DyingSink(ClickHouseSink):
    """A sink thread that, once ``die`` is set, stops dead after its next insert, before the commit."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.die, self.dead, self.release = threading.Event(), threading.Event(), threading.Event()

    def _commit(self, messages) -> None:
        if self.die.is_set():
            self.dead.set()
            self.release.wait()  # never polls again: the group drops it
            raise SystemExit("died between an insert and its commit")
        super()._commit(messages)


class Sinks:
    def __init__(self, bootstrap: str, client, database: str) -> None:
        self.bootstrap, self.client, self.database = bootstrap, client, database
        self.running: list[tuple[DyingSink, threading.Event, threading.Thread]] = []
        self.dead: list[tuple[DyingSink, threading.Event, threading.Thread]] = []
        self.started = 0

    def start(self) -> None:
        sink = DyingSink(self.bootstrap, ClickHouseWriter(self.client, self.database), group_id=f"{PREFIX}sink",
                         topic_prefix=PREFIX, batch_wait_s=0.3,
                         consumer_overrides={"max.poll.interval.ms": 10_000, "session.timeout.ms": 10_000})
        stop = threading.Event()
        self.started += 1
        thread = threading.Thread(target=self._run, args=(sink, stop, f"the sink started #{self.started}"), daemon=True)
        thread.start()
        self.running.append((sink, stop, thread))

    @staticmethod
    def _run(sink, stop, name: str) -> None:
        try:
            sink.run(stop)
        except SystemExit:
            pass  # (killed by the schedule)
        except BaseException as exc:
            ENDED_BY_ITSELF.append(f"{name} ({type(exc).__name__}: {exc})")
            raise
        else:
            if not stop.is_set():
                ENDED_BY_ITSELF.append(f"{name} (returned unasked)")

    def kill(self, i: int) -> None:
        sink, stop, thread = self.running.pop(i)
        sink.die.set()
        deadline = time.monotonic() + 120  # (a sink given no partition never reaches a commit to die at)
        while not sink.dead.wait(1) and thread.is_alive() and time.monotonic() < deadline:
            pass  # (a thread that ended by itself never dies at its commit: it is started again all the same)
        self.dead.append((sink, stop, thread))

    def stop(self) -> None:
        for sink, stop, thread in self.running + self.dead:
            sink.release.set()
            stop.set()
        for _, _, thread in self.running + self.dead:
            thread.join(60)
