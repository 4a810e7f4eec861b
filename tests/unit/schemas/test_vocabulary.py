"""The words of every report, defined once (schemas/vocabulary.py): the docs' table is the
module's, each term's SQL runs on the tables it names, and wasted is what the buckets say."""

from pathlib import Path

import pytest

from schemas.goodput_buckets import BUCKETS
from schemas.vocabulary import (
    JOBS,
    SERVING_TERMS,
    TERMS,
    WASTE_BUCKETS,
    WASTED,
    markdown_table,
    wasted_seconds,
)
from sinks.write_clickhouse import ClickHouseWriter
from tests.support.fleet_data import build, store

ROOT = Path(__file__).parents[3]


def test_the_docs_table_is_the_modules():
    assert markdown_table() in (ROOT / "docs" / "vocabulary.md").read_text()
    assert markdown_table(SERVING_TERMS) in (ROOT / "docs" / "vocabulary.md").read_text()


def test_wasted_is_every_bucket_but_productive_and_unobserved():
    # Time no sample stands for is neither used nor wasted: nothing is known of it.
    assert set(WASTE_BUCKETS) == set(BUCKETS) - {"productive", "unobserved"}
    window = {f"{b}_gpu_seconds": float(i + 1) for i, b in enumerate(BUCKETS)}
    assert wasted_seconds(window) == sum(range(1, len(BUCKETS) - 1))  # productive, unobserved: the last two
    assert wasted_seconds({"gpu_seconds": 60.0}) == 0.0  # a window written before goodput: unclassified


@pytest.fixture(scope="module")
def stored(chdb_client):
    data = build()
    store(ClickHouseWriter(chdb_client, "vocabulary"), data)
    yield chdb_client, data
    chdb_client.command("DROP DATABASE IF EXISTS vocabulary")


def test_each_terms_sql_runs_on_the_windows_and_wasted_sums_the_buckets(stored):
    client, data = stored
    for term in TERMS:
        if term.sql:
            client.query(f"SELECT {term.sql} FROM vocabulary.workflow_windows FINAL WHERE {JOBS}")
    for term in SERVING_TERMS:
        if term.sql:
            client.query(f"SELECT {term.sql} FROM vocabulary.serving_windows FINAL")
    (wasted,), = client.query(f"SELECT {WASTED.sql} FROM vocabulary.workflow_windows FINAL WHERE {JOBS}").result_rows
    assert wasted == pytest.approx(sum(wasted_seconds(w) for w in data.windows))
    (same,), = client.query(f"SELECT {WASTED.sql} FROM vocabulary.goodput_hourly WHERE {JOBS}").result_rows
    assert same == pytest.approx(wasted)
