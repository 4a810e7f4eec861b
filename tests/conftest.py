"""Shared fixtures: one embedded ClickHouse per test session (chdb allows one data path per
process), with a fresh database per test; the Kafka broker lives in tests/integration."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from clickhouse_connect.driver.client import Client

from sinks.write_clickhouse import connect


@pytest.fixture(scope="session")
def chdb_client(tmp_path_factory: pytest.TempPathFactory) -> Client:
    return connect(f"chdb://{tmp_path_factory.mktemp('clickhouse')}")


@pytest.fixture
def database(chdb_client: Client) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    chdb_client.command(f"DROP DATABASE IF EXISTS {name}")
