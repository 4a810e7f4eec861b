"""A worker that no longer moves ends, with what is stuck and its stacks, for its supervisor to
start it again (``streams.topology.stalls``): its partitions then go to the rest of its group.
Faust's loop is asyncio's, so a stage that waits for good inside a coroutine leaves the loop, its
timers and its heartbeats running, and the group would leave the partition with it forever.

Each worker is the worker's own app (``streams.app.create_app``, every stage, the real broker) in
a process of its own, with one more agent: the fault, a stage that never finishes its first
message, either waiting inside a coroutine (the loop runs on) or blocking the loop itself."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from confluent_kafka import Producer

from kafka_client.admin import create_topics

WORKER = """
import asyncio, sys, threading
import faust
from kafka_client.admin import create_topics
from streams.app import changelog_topics, create_app
from streams.settings import StreamSettings

bootstrap, prefix, data_dir, how = sys.argv[1:5]
settings = StreamSettings(bootstrap=bootstrap, app_id=prefix + "worker", topic_prefix=prefix, data_dir=data_dir,
                          stall_exit_s=15.0)
create_topics(bootstrap, changelog_topics(settings))
app = create_app(settings)

@app.agent(app.topic(prefix + "stuck"))
async def stuck_stage(stream):
    async for value in stream:
        print(f"took {value!r}", flush=True)
        if how == "coroutine":
            await asyncio.Event().wait()  # waits for good: the loop, its timers and heartbeats run on
        else:
            threading.Event().wait()  # blocks for good, and the loop with it

worker = faust.Worker(app, loglevel="info", quiet=True)
worker.spinner = None
worker.execute_from_commandline()
"""


@pytest.mark.parametrize("how", ["coroutine", "loop"])
def test_a_worker_whose_stage_is_stuck_ends_with_what_is_stuck(kafka, prefix, tmp_path, how):
    stuck = prefix + "stuck"
    create_topics(kafka.bootstrap, [(stuck, 1, False)])
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    producer.produce(stuck, b"the first message")
    assert producer.flush(30) == 0
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(WORKER), kafka.bootstrap, prefix,
                                 str(tmp_path / "worker"), how], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            proc.wait(180)  # (started, then stuck, then ended: well within)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text(errors="replace")
    assert proc.returncode == 1, text[-4000:]
    assert "took b'the first message'" in text, text[-4000:]
    if how == "coroutine":  # the loop ran on: the timer saw the partition, and named it with every task's stack
        assert (f"the worker no longer moves: partitions stuck: {stuck}[0] (1 messages waiting at offset 0 for "
                "15 s); it ends") in text  # (the stages' own partitions, idle, are not named)
    else:  # the loop stopped: the interpreter's own timer ended it, 1.1 x the stall time after it last ran
        assert "Timeout (0:00:16.500000)!" in text and "the worker no longer moves" not in text
    assert "in stuck_stage" in text, text[-4000:]
