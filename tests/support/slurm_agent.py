"""The host agent of the Slurm test's node as a process of its own (so that a test can kill it
with SIGKILL and start it again): gpufleet's agent, reading the Slurm directory the shipped
prolog and epilog write, its spool and checkpoint in ``--spool``, with the node's fake GPUs
(``tests.support.slurm_gpus``) at the pynvml boundary. Run as
``python -m tests.support.slurm_agent --registry R --allocations D --spool S --bootstrap B
--prefix P --host H --cluster C --gpus N``."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from producers.agent.allocations.slurm import SlurmAllocations
from producers.agent.gpus.attribute_process import ProcessAttributor
from producers.agent.host_agent import AgentSettings, HostAgent
from producers.agent.links import AgentLinks
from producers.agent.run import run_agent
from producers.agent.spool.disk import Spool
from producers.agent.spool.forward import Forwarder
from schemas.codec import Codec
from tests.support.slurm_gpus import JobGpus, Sampler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    for name in ("--registry", "--allocations", "--spool"):
        p.add_argument(name, type=Path, required=True)
    for name in ("--bootstrap", "--prefix", "--host", "--cluster"):
        p.add_argument(name, required=True)
    p.add_argument("--gpus", type=int, required=True)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sampler = Sampler(JobGpus(args.registry, args.gpus))
    sampler.open()
    spool = Spool(args.spool)
    forwarder = Forwarder(spool, args.bootstrap, send_every_s=1.0)
    agent = HostAgent(AgentSettings(args.host, interval_s=1.0, cluster=args.cluster, topic_prefix=args.prefix),
                      spool, Codec(), nvml=sampler, attributor=ProcessAttributor(),
                      allocations=SlurmAllocations(args.allocations), links=AgentLinks(hurry=forwarder.hurry))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    run_agent(agent, forwarder, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
