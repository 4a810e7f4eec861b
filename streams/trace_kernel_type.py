"""Kernel type of a GPU event by its name, exactly as Holistic Trace Analysis 0.5.0 decides it."""

from __future__ import annotations

import re
from enum import Enum
from functools import lru_cache

COMMUNICATION_RE = re.compile(r"^nccl.*Kernel")
MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
# HTA's "not computation" pattern, precedence included: ^nccl.*Kernel | .*Memcpy | ^Memset | .*Sync
NOT_COMPUTATION_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


class KernelType(Enum):
    COMMUNICATION = "COMMUNICATION"
    MEMORY = "MEMORY"
    COMPUTATION = "COMPUTATION"
    OTHER = "OTHER"


@lru_cache(maxsize=65536)  # kernel names repeat; some are kilobytes of C++ templates
def kernel_type(name: str) -> KernelType:
    """First match wins: communication, memory, computation, other."""
    if COMMUNICATION_RE.match(name):
        return KernelType.COMMUNICATION
    if MEMORY_RE.match(name):
        return KernelType.MEMORY
    if not NOT_COMPUTATION_RE.match(name):
        return KernelType.COMPUTATION
    return KernelType.OTHER
