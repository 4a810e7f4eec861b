"""The read path's checks (``sinks.read_path.check_query``) read a query as ClickHouse's own lexer
does. Queries are made of the pieces that begin or end a string, a quoted name or a comment
(quotes, backslashes, ``--``, ``//``, ``#``, ``/*``, heredocs' ``$$``, Unicode quotes, line ends)
around what the read path refuses (a call of ``file``, a system table, ``INTO OUTFILE``): every
opening of up to three pieces, then longer ones Hypothesis draws. Whatever the checks let
through, ClickHouse's own reading of it (``formatQuerySingleLineOrNull``: the query as its parser
read it, strings quoted one way, comments gone) passes them too: nothing they refuse hides in what
they took for a string or a comment and ClickHouse reads as code. Before the checks refused
ClickHouse's other comments and strings, the first test failed at ``SELECT 1 //'`` then, on the
next line, ``, file('/etc/hostname')``."""

from __future__ import annotations

import itertools
import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sinks.read_path import check_query, connect_reader

SCALE = float(os.environ.get("GPUFLEET_FUZZ_SCALE", "1"))


@pytest.fixture(scope="module")
def reader(chdb_client):
    return connect_reader(f"chdb://{chdb_client.path}")


def read_by_clickhouse(reader, queries: list[str]) -> list[str | None]:
    """Each query as ClickHouse's parser read it (None: no query ClickHouse can parse), in one
    round trip."""
    rows = reader.query("SELECT formatQuerySingleLineOrNull(q) FROM (SELECT arrayJoin({qs:Array(String)}) AS q)",
                        parameters={"qs": queries}).result_rows
    return [r[0] for r in rows]


def checked_alike(reader, queries: list[str], seen: Counter) -> None:
    """The queries the checks let through: ClickHouse's reading of each passes them too."""
    for sql, formatted in zip(queries, read_by_clickhouse(reader, queries), strict=True):
        seen["passed" if formatted is not None else "not a query"] += 1
        if formatted is not None:
            try:
                check_query(formatted)
            except ValueError as exc:
                raise AssertionError(f"the checks passed {sql!r}, which ClickHouse reads as {formatted!r}: {exc}")


# Every way of beginning a string, a quoted name or a comment, up to three of them, before what the
# read path refuses, and the ways of ending one after it: each query the checks let through is one
# ClickHouse reads as they do.
OPENERS = ["'", '"', "`", "\\", "--", "//", "# ", "#!", "/*", "*/", "$$", "$x$", "\n", " ", "\u2018", "\u2019"]
REFUSED = ["file('/etc/hostname')", "(SELECT name FROM system.users)", "1 INTO OUTFILE 'o'"]
CLOSERS = ["", "--'", "'", "*/", "$$", "\n'", "`", '"']
# (Hypothesis's pieces: those, and what joins them into longer queries)
PIECES = [*OPENERS, ",", "(", ")", "1", "a", "''", "file('/etc/hostname')", "system.users", "INTO OUTFILE 'o'",
          "\u201c", "\u00a0"]


def test_short_queries_of_every_opening_are_read_as_clickhouse_reads_them(reader):
    seen: Counter = Counter()
    passed = []
    for k in range(4):
        for opening in itertools.product(OPENERS, repeat=k):
            for refused, closing in itertools.product(REFUSED, CLOSERS):
                sql = f"SELECT 1 {''.join(opening)}, {refused} {closing}"
                try:
                    passed.append(check_query(sql))
                except ValueError:
                    seen["refused"] += 1
    checked_alike(reader, passed, seen)
    print("queries:", dict(seen))
    assert seen["passed"] >= 50, seen


def test_what_the_checks_let_through_clickhouse_reads_alike(reader):
    seen: Counter = Counter()

    @settings(max_examples=int(1500 * SCALE), deadline=None, database=None,
              derandomize=os.environ.get("HYPOTHESIS_PROFILE") != "explore",
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=12))
    def read_alike(pieces: list[str]) -> None:
        sql = "SELECT 1 " + "".join(pieces)
        try:
            check_query(sql)
        except ValueError:
            seen["refused"] += 1
            return  # nothing of it reaches ClickHouse
        checked_alike(reader, [sql], seen)  # (a query ClickHouse cannot parse runs nothing either)

    read_alike()
    print("queries:", dict(seen))
    # (the property was put to the test: queries passed the checks and ClickHouse read them)
    assert seen["passed"] >= 50 and seen["refused"] >= 50, seen
