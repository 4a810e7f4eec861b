"""Collectives across the ranks of a job: who arrives last and makes the others wait.

Each rank's analysis keeps, per communication kernel name (an NCCL collective), the duration
of every launch in the order the GPU ran them. A collective ends on all its ranks at about
the same moment (when the last one has arrived and the data has moved), so a rank's kernel
lasts longer by the time it waited for the last to arrive: in the k-th launch of a
collective across the ranks, the shortest kernel is the rank that came last (the straggler
of that collective), and every other rank waited its kernel's duration minus the shortest.
This needs no clock shared between hosts, and step times, which the collectives equalise,
are not used.

A rank is named the job's straggler when it came last in at least half the collectives (and
in 1.5 times its fair share: 3 in 4 with two ranks), and the GPU time the other ranks spent
waiting for it is what is at stake.
"""

from __future__ import annotations

from collections import defaultdict

from streams.traces.analysis import Finished, Options
from streams.traces.batch import EventBatch
from streams.traces.kernel_breakdown import COMMUNICATION_BIT

# Launches kept per collective name and rank: the state stays bounded on very long traces.
MAX_LAUNCHES = 20_000


class Collectives:
    """One rank's collectives: name -> durations in GPU order."""

    def __init__(self) -> None:
        self.durations: dict[str, list[float]] = {}

    @classmethod
    def create(cls, options: Options) -> Collectives:
        return cls()

    def add(self, batch: EventBatch) -> None:
        """The batch's collectives (GPU-side events of kernel type COMMUNICATION), in start-time order."""
        if COMMUNICATION_BIT not in batch.bits:
            return
        durations = self.durations
        for name, ts, end, bit in zip(batch.g_name, batch.g_ts, batch.g_end, batch.bits):
            if bit == COMMUNICATION_BIT:
                launches = durations.setdefault(name, [])
                if len(launches) < MAX_LAUNCHES:  # (the later launches of a very long trace are not compared)
                    launches.append(float(end - ts))

    def result(self, finished: Finished) -> dict:
        return {"collectives": [{"name": name, "durations_us": list(d)} for name, d in sorted(self.durations.items())]}

    def to_state(self) -> dict:
        return {"collectives": {"durations": self.durations}}

    @classmethod
    def from_state(cls, state: dict, options: Options) -> Collectives:
        c = cls()
        c.durations = {name: list(d) for name, d in state.get("collectives", {"durations": {}})["durations"].items()}
        return c


def stragglers(ranks: dict[int, list[dict]]) -> dict:
    """Who came last to the collectives of ``ranks`` (rank -> its analysis' ``collectives``):
    per rank the collectives matched, how often it came last, the time it waited and the time
    the others waited for it; and the straggler, if one rank stands out."""
    per_rank = {r: {"rank": r, "collectives": 0, "last": 0, "waited_us": 0.0, "caused_us": 0.0} for r in ranks}
    by_name: dict[str, dict[int, list[float]]] = defaultdict(dict)
    for rank, collectives in ranks.items():
        for c in collectives:
            by_name[c["name"]][rank] = c["durations_us"]
    matched = 0
    for durations in by_name.values():
        if len(durations) < 2:
            continue  # a collective seen on one rank only: nothing to compare
        n = min(len(d) for d in durations.values())
        for i in range(n):
            launch = {r: d[i] for r, d in durations.items()}
            last = min(launch, key=lambda r: (launch[r], r))
            shortest = launch[last]
            matched += 1
            per_rank[last]["last"] += 1
            for r, dur in launch.items():
                per_rank[r]["collectives"] += 1
                per_rank[r]["waited_us"] += dur - shortest
                per_rank[last]["caused_us"] += dur - shortest
    rows = sorted(per_rank.values(), key=lambda x: x["rank"])
    straggler = None
    if matched and len(ranks) >= 2:
        top = max(rows, key=lambda x: (x["caused_us"], -x["rank"]))
        share = top["last"] / matched
        if top["caused_us"] > 0 and share >= max(0.5, 1.5 / len(ranks)):
            straggler = {"rank": top["rank"], "last_share": share, "caused_us": top["caused_us"]}
    return {"collectives": matched, "ranks": rows, "straggler": straggler}
