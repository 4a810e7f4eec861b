"""Builds ``DeadLetter`` records: what failed, why, and where the original message lives."""

from __future__ import annotations

import time


def dead_letter(
    stage: str, reason: str, topic: str, partition: int, offset: int,
    key: bytes | None, value: bytes | None, failed_at: int | None = None,
) -> dict:
    return {
        "stage": stage,
        "reason": reason,
        "source_topic": topic,
        "source_partition": partition,
        "source_offset": offset,
        "key": key,
        "value": value,
        "failed_at": int(time.time() * 1000) if failed_at is None else failed_at,
    }
