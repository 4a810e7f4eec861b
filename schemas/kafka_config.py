"""Client settings every gpufleet component shares, so that all of them speak to Kafka alike."""

from __future__ import annotations

import logging

# librdkafka's own log lines go through Python logging, under this logger.
LIBRDKAFKA_LOG = logging.getLogger("librdkafka")


def producer_config(bootstrap: str, **overrides: object) -> dict:
    """Idempotent (no duplicates or reordering on retry), batched and compressed; keys are
    partitioned with murmur2 like the Java client and aiokafka, so a workflow's records land
    on the same partition whichever client wrote them."""
    config: dict = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 20,
        "compression.type": "lz4",
        "partitioner": "murmur2_random",
        "logger": LIBRDKAFKA_LOG,
    }
    config.update(overrides)
    return config


def consumer_config(bootstrap: str, group_id: str, **overrides: object) -> dict:
    """Manual commits (after the work is done) and reading from the start of new groups."""
    config: dict = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
        "logger": LIBRDKAFKA_LOG,
    }
    config.update(overrides)
    return config
