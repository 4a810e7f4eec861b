"""What a host agent is told and tells besides its GPUs and its spool, given whole when it is
built (``HostAgent(..., links=AgentLinks(...))``): each part has a default that does nothing,
so an agent without a profile coordinator, metrics or forwarder still samples."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from producers.agent.metrics import AgentMetrics


def _none(now: float) -> dict:
    return {}


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class AgentLinks:
    # Called with each tick's GPU samples and host sample (the profile coordinator's context,
    # the serving endpoints' observer).
    observers: tuple[Callable[[list[dict], dict], None], ...] = ()
    # pid -> TFLOPS of model work a job reports for that process (``profile_hook.report_throughput``)
    throughputs: Callable[[float], dict[int, float]] = _none
    # pid -> (allocator peak, reserved peak) bytes a job reports (``profile_hook.report_memory``)
    memory_peaks: Callable[[float], dict[int, tuple[int, int]]] = _none
    metrics: AgentMetrics | None = None  # told of each tick
    hurry: Callable[[], None] = _nothing  # spooled a job's end: send it now (the forwarder's)
