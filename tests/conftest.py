"""Shared fixtures: one embedded ClickHouse per test session (chdb allows one data path per
process), with a fresh database per test; the Kafka broker lives in tests/integration."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client

from sinks.clickhouse_client import connect


@pytest.fixture(scope="session")
def chdb_client(tmp_path_factory: pytest.TempPathFactory) -> Client:
    return connect(f"chdb://{tmp_path_factory.mktemp('clickhouse')}")


@pytest.fixture
def database(chdb_client: Client) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    chdb_client.command(f"DROP DATABASE IF EXISTS {name}")


ARTEFACTS = Path(os.environ.get("GPUFLEET_TEST_ARTEFACTS", Path(__file__).resolve().parents[1] / "test-artefacts"))


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium for a module's tests, driven by Playwright: Debian's chromium
    (Playwright's own browser downloads are not used); skipped, saying why, where either is
    missing. Not for the session: Playwright's sync API runs an event loop on the main thread for
    as long as it lives, and every later test's ``asyncio.run`` would find it running."""
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (make setup installs the dev extras)")
    if chromium is None:
        pytest.skip("chromium is not installed (make test installs Debian's)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        yield browser
        browser.close()


@pytest.fixture
def artefacts(request) -> Path:
    """A folder kept after the run for what a test shows (screenshots): test-artefacts/<test>."""
    folder = ARTEFACTS / request.node.name
    folder.mkdir(parents=True, exist_ok=True)
    return folder
