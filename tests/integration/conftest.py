"""One real Kafka broker (from docker/kafka's jars) for the whole integration session."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from gpufleet.local import kafka as local_kafka
from kafka_client.admin import ensure_topics


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_kafka.ClusterInfo]:
    data_dir = tmp_path_factory.mktemp("kafka")
    info = local_kafka.start(data_dir)
    yield info
    local_kafka.stop(data_dir)


@pytest.fixture
def prefix(kafka: local_kafka.ClusterInfo) -> str:
    """A fresh namespace of topics for one test."""
    value = f"t{uuid.uuid4().hex[:10]}."
    ensure_topics(kafka.bootstrap, prefix=value)
    return value
