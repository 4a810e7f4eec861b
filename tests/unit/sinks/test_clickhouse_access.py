"""The server's reader and writer users: what the statements grant, checked by ClickHouse's parser."""

import re

import pytest

from sinks.clickhouse_access import access_statements, password_sha256
from tests.support.sql import sql_literal


@pytest.fixture(scope="module")
def statements():
    return access_statements("gpufleet", password_sha256("reader secret"), password_sha256("writer secret"))


def test_every_statement_parses(chdb_client, statements):
    for statement in statements:
        chdb_client.query(f"SELECT formatQuery({sql_literal(statement)})")


def test_the_reader_selects_from_gpufleet_only_under_a_pinned_read_only_profile(statements):
    grants = [s for s in statements if s.startswith("GRANT") and "gpufleet_reader" in s]
    assert grants == ["GRANT SELECT ON gpufleet.* TO gpufleet_reader"]
    profile = next(s for s in statements if s.startswith("CREATE SETTINGS PROFILE"))
    assert "readonly = 1 CONST" in profile and "allow_ddl = 0 CONST" in profile
    # the read path's limits as maxima: a reader may ask for less time or fewer rows, never more
    assert "max_execution_time = 60 MAX 60" in profile and "max_result_rows = 1000000 MAX 1000000" in profile
    assert (
        "max_memory_usage = 4294967296 MAX 4294967296" in profile and "result_overflow_mode = 'throw' CONST" in profile
    )
    assert "SETTINGS PROFILE 'gpufleet_reader_profile'" in next(
        s for s in statements if "USER OR REPLACE gpufleet_reader" in s
    )
    # No source privilege, so no table function reaches a file or the network.
    assert not any(re.search(r"\b(FILE|URL|REMOTE|S3|TEMPORARY)\b|ON \*\.\*", s) for s in statements)


def test_no_password_appears_only_its_hash(statements):
    assert not any("secret" in s for s in statements)
    assert any(password_sha256("reader secret") in s for s in statements)


@pytest.mark.parametrize("database", ["gpufleet; DROP USER default", "a.b", "x y", ""])
def test_names_are_plain_identifiers(database):
    with pytest.raises(ValueError, match="not a plain ClickHouse identifier"):
        access_statements(database, "0" * 64, "0" * 64)
