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


def short_kernel_name(name: str, width: int = 70) -> str:
    """A kernel's name without template and call arguments (``void gemm<float, 128>(float*)``
    reads ``gemm``), cut to ``width``: kernel names are often kilobytes of C++ templates."""
    if MEMORY_RE.match(name):  # "Memcpy HtoD (Pageable -> Device)": its parentheses are its meaning
        return name
    out, depth = [], 0
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
        elif not depth:
            out.append(ch)
    short = "".join(out).strip()
    short = short.removeprefix("void ").strip() or name
    return short if len(short) <= width else short[:width - 1] + "…"
