"""What the worker's fixes to faust (this package) were reviewed and proven on, and
the check that what is installed is still that.

The fixes replace and lean on private parts of faust-streaming, mode and aiokafka that change
without notice. They were reviewed, and proven by the tests, the fleet fault test and the chaos
soak (benchmarks/soak.py), on these releases (pinned in pyproject.toml) and on this source of
each part: a release or a part that differs stops the worker before it starts, with one line
that says what changed (docs/upgrading-faust.md says how to look at it again).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Mapping
from importlib import metadata

PROVEN_ON = {"faust-streaming": "0.15.3", "mode-streaming": "0.7.1", "aiokafka": "0.14.0"}

# Where each part lives, what the fixes do with it, and the first 16 hex digits of the sha256
# of its source (``inspect.getsource``) as reviewed.
REVIEWED = {
    "faust.transport.consumer:Consumer._new_offset": ("wrapped by fixes 1 and 2", "1d2c7ea89a7ad4f1"),
    "mode:Service.wait_first": ("run in place where the delivery need not wait (speed)", "feade6a31f8a6789"),
    "faust.transport.consumer:Consumer._drain_messages": ("its race of a delivery against a flow stop",
                                                          "44a2500309e83c63"),
    "faust.transport.consumer:Consumer.perform_seek": ("replaced by fixes 3 and 7", "0e8c130ff4b0afd8"),
    "faust.transport.consumer:Consumer._add_gap": ("wrapped by fix 4", "4df2573ded7c1c2c"),
    "faust.transport.consumer:Consumer.force_commit": ("replaced by fixes 5 and 6", "cc094614d22c70fb"),
    "faust.transport.consumer:Consumer._commit_tps": ("copied into fix 5's commit", "a20e230b05ae8b15"),
    "faust.transport.consumer:Consumer._filter_committable_offsets": ("called by fix 5", "dc5e9baf5d994485"),
    "faust.transport.consumer:Consumer._filter_tps_with_pending_acks": ("called by fix 5", "f6f9239774234e7e"),
    "faust.transport.consumer:Consumer._commit_offsets": ("called by fix 5", "1a69799041188441"),
    "faust.transport.consumer:Consumer.seek": ("called by fix 2 and the in-order stream", "b86a9fe05f956b30"),
    "faust.transport.consumer:ThreadDelegateConsumer.seek_to_committed": ("called by fix 3", "f1d483b861b0328b"),
    "faust.transport.consumer:ThreadDelegateConsumer.earliest_offsets": ("called by fix 7", "2833b09d2888825b"),
    "faust.transport.consumer:ThreadDelegateConsumer._seek": ("called by fix 7", "4f95c631420410a5"),
    "faust.tables.recovery:Recovery": ("resumes the flow after each seek (fix 3), goes on from active_offsets (8)",
                                       "a652ef029484ee3a"),
    "faust.stores.memory:Store.apply_changelog_batch": ("applies the records over what is in memory (fix 8)",
                                                        "71863e3cd727aac2"),
    "faust.transport.consumer:Consumer._wait_next_records": ("replaced by fix 9", "6218e1969a636b3f"),
    "aiokafka.consumer.fetcher:Fetcher.fetched_records": ("takes the partitions wanted as fix 9 gives them",
                                                          "be4348896b9b66af"),
    "faust.transport.consumer:Consumer.ack": ("its bookkeeping emptied by fix 10", "5fcf41cf45153475"),
    "faust.transport.consumer:Consumer.on_partitions_revoked": ("drops acks before the batches finish (10)",
                                                                "d04b7ae72c6fc206"),
    "faust.app.base:App._on_partitions_revoked": ("signals the stages once the batches finished (8, 10)",
                                                  "d5c895bbe57dc73a"),
}
UPGRADING = "docs/upgrading-faust.md"


class NotAsReviewed(RuntimeError):
    """Faust or a part of it is not what the fixes were reviewed and proven on."""


def installed(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def source_digest(where: str, upstream: Mapping[str, object]) -> str:
    """The digest of the source at ``where``; for a method the fixes patch on faust's consumer
    (a name of ``upstream``), of faust's own (``upstream``'s), as it was before the patch."""
    module, _, path = where.partition(":")
    owner, _, name = path.rpartition(".")
    if owner == "Consumer" and name in upstream:
        obj = upstream[name]
    else:
        obj = importlib.import_module(module)
        for part in path.split("."):
            obj = getattr(obj, part)
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]


def differences(upstream: Mapping[str, object]) -> list[str]:
    """What differs from what the fixes were proven on, in words (empty: all as reviewed);
    ``upstream``: each method the fixes patch on faust's consumer -> faust's (or mode's) own."""
    from faust.transport.consumer import Consumer
    from faust.transport.drivers.aiokafka import Consumer as Driver
    from mode import Service

    problems = [f"{dist} {installed(dist) or 'missing'} is installed; the fixes were proven on {version}"
                for dist, version in PROVEN_ON.items() if installed(dist) != version]
    for where, (role, digest) in REVIEWED.items():
        try:
            now = source_digest(where, upstream)
        except (ImportError, AttributeError, OSError, TypeError) as exc:
            problems.append(f"{where} ({role}) cannot be read: {exc}")
            continue
        if now != digest:
            problems.append(f"{where} ({role}) changed since it was reviewed (source sha256 {now}, reviewed {digest})")
    for name in upstream:  # the consumer the worker runs must inherit each patched method from where it is patched
        owner = next(c for c in Driver.__mro__ if name in c.__dict__)
        if owner is not Consumer and not (name == "wait_first" and owner is Service):
            problems.append(f"{owner.__module__}.{owner.__name__} defines {name} itself: the fix would not apply")
    return problems
