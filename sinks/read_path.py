"""The read path's rules: what an analyst's query may be (``check_query``: one statement that
reads, no server internals), the limits every read-only session runs under (``query_limits``),
a read-only session (``connect_reader``) and what a refusal says (``refusal``). ``gpufleet sql``,
the web service and the sink's query server all read through them.
"""

from __future__ import annotations

import os
import re

from clickhouse_connect.driver.client import Client

from sinks.clickhouse_client import connect, error_code

# A read-only session: SELECT only. No INSERT, DDL or SET, and no table function that reaches
# files or the network (file, url, remote, s3, mysql, executable, ...): ClickHouse refuses
# them all under readonly=1 (readonly=2 allows SET and, with it, every table function).
READ_ONLY_SETTINGS = {"readonly": 1}
# Every query of the read path is bounded (environment variables of whoever opens the read-only
# session: the command, or the sink's query server): time, rows and bytes of the result, memory.
QUERY_LIMITS = (("max_execution_time", "GPUFLEET_QUERY_MAX_SECONDS", 60, "seconds"),
                ("max_result_rows", "GPUFLEET_QUERY_MAX_ROWS", 1_000_000, "rows"),
                ("max_result_bytes", "GPUFLEET_QUERY_MAX_RESULT_BYTES", 512 << 20, "bytes"),
                ("max_memory_usage", "GPUFLEET_QUERY_MAX_MEMORY_BYTES", 4 << 30, "bytes"))


def query_limits(env: dict | None = None) -> dict[str, int | str]:
    """The read path's limits as ClickHouse settings, from the environment or the defaults
    (60 s, 1 M rows, 512 MiB of result, 4 GiB of memory); ValueError for a value that is not a
    whole number above 0."""
    env = os.environ if env is None else env
    out: dict[str, int | str] = {"result_overflow_mode": "throw", "timeout_overflow_mode": "throw"}
    for setting, name, default, unit in QUERY_LIMITS:
        raw = env.get(name)
        try:
            value = default if raw in (None, "") else int(raw)
        except ValueError:
            value = -1
        if value <= 0:
            raise ValueError(f"{name}={raw!r}: expected a whole number of {unit} above 0 (default {default})")
        out[setting] = value
    return out


READONLY_CODE = 164


def read_settings() -> dict:
    """A read-only session's settings: the limits first (read-only mode then freezes them)."""
    return {**query_limits(), **READ_ONLY_SETTINGS}


def connect_reader(dsn: str) -> Client:
    """A read-only session (``read_settings``) for the whole session, because the embedded engine
    cannot leave read-only mode per query. On a server, connect the read path as the reader user
    (``sinks.clickhouse_access``), whose profile enforces the same."""
    return connect(dsn, settings=read_settings())


def refusal(exc: BaseException) -> str:
    """ClickHouse's error in a line, saying what the read-only query path allows when that was the reason."""
    first = str(exc).splitlines()[0] if str(exc) else repr(exc)
    if error_code(exc) == READONLY_CODE and not first.startswith("refused:"):
        return ("refused: gpufleet's query path is read-only: it runs SELECT, never writes, changes settings or "
                f"calls table functions that reach files or the network (file, url, remote, s3, ...). {first}")
    return first


# System tables an analyst may read: harmless ones. The others show the server's paths, disks,
# settings, users and running queries: refused on the read path (ClickHouse's own grants decide
# for a server's users too).
SYSTEM_ALLOWED = frozenset({"one", "numbers", "numbers_mt", "zeros", "functions", "data_type_families",
                            "table_functions", "time_zones"})
# What SHOW may list: gpufleet's tables and how they are made. The others (PROCESSLIST, SETTINGS,
# GRANTS, USERS, ...) show other analysts' queries or the server's settings and access.
# (The word after SHOW's FULL and EXTENDED; after SHOW CREATE, a table, view, dictionary or database,
# never the access: its USER, ROLE, ROW POLICY, QUOTA, SETTINGS PROFILE.)
SHOW_ALLOWED = ("TABLES", "DATABASES", "CREATE", "COLUMNS", "INDEX", "INDEXES", "INDICES", "KEYS", "DICTIONARIES")
SHOW_CREATE_REFUSED = ("USER", "USERS", "ROLE", "ROLES", "ROW", "POLICY", "POLICIES", "QUOTA", "QUOTAS", "SETTINGS",
                       "PROFILE", "PROFILES", "MASKING", "NAMED")
# The statements that read, the only kinds the read path passes on. The rest change or stop
# something even where readonly lets them through (SYSTEM STOP MERGES without a table, SET).
READ_STATEMENTS = ("SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS")
# What a query may not call, by name (a trailing ``*``: every name so begun), with the reason.
# ClickHouse's readonly=1 refuses most table functions that reach files or the network, but not
# all that reach past gpufleet's tables: the function ``file`` reads the host's files (only the
# table function of that name is refused), ``mergeTreeIndex('db', 't')`` and ``joinGet`` read
# tables named in strings, ``getServerSetting`` shows paths, ``eval`` runs SQL made from strings.
# A server's reader profile and grants are its operators' to keep; this list is ours, checked
# against every table function and every function of the categories that may reach out in the
# engine itself (tests/unit/sinks/test_read_path.py), so a new engine's additions are placed.
CALLS_REFUSED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("it reads the host's files or disks, or reaches other servers", (
        "file", "fileCluster", "filesystem*", "sqlite", "url", "urlCluster", "s3", "s3Cluster", "gcs", "oss", "cosn",
        "azureBlobStorage*", "hdfs*", "remote", "remoteSecure", "cluster", "clusterAllReplicas", "mysql",
        "postgresql", "mongodb", "redis", "odbc", "jdbc", "bigquery", "ytsaurus", "deltaLake*", "iceberg*", "hudi*",
        "paimon*", "aiClassify", "aiEmbed", "aiExtract", "aiFilter", "aiGenerate", "aiRedact", "aiSimilarity",
        "aiTranslate")),
    ("it runs programs on the host", ("executable",)),
    ("it reads tables or dictionaries named in strings, another database's or the server's", (
        "merge", "dictionary", "mergeTree*", "timeSeriesData", "timeSeriesMetricFamilies", "timeSeriesMetrics",
        "timeSeriesSamples", "timeSeriesSelector", "timeSeriesTags", "prometheusQuery*", "joinGet", "joinGetOrNull",
        "hasColumnInTable", "dict*", "region*")),
    ("it reads a table again and again, without end", ("loop",)),
    ("it reads the objects of the process that runs the query", ("python", "arrowstream")),
    ("it runs SQL made from strings, which the read path cannot check", ("eval",)),
    ("it shows the server's settings, macros, ports or certificate", (
        "getServerSetting", "getSetting", "getSettingOrDefault", "getMergeTreeSetting", "getMacro", "globalVariable",
        "getServerPort", "showCertificate")),
    ("it shows or writes the server's own workings (its binary, its log)", (
        "addressToLine", "addressToLineWithInlines", "addressToSymbol", "demangle", "logTrace")),
    ("it reads what an INSERT is given, never a table", ("input",)),
)
# Table functions that make rows up or read only what the query itself names (its own SELECT):
# every other table function of the engine is one of ``CALLS_REFUSED``.
TABLE_FUNCTIONS_ALLOWED = frozenset({
    "numbers", "numbers_mt", "zeros", "zeros_mt", "primes", "generateSeries", "generate_series", "generateRandom",
    "values", "SQLStandardValues", "null", "view", "viewIfPermitted", "viewExplain", "format", "fuzzJSON",
    "fuzzQuery"})


def _names(names: tuple[str, ...]) -> str:
    return "|".join(re.escape(n[:-1]) + r"\w*" if n.endswith("*") else re.escape(n) for n in names)


# (each reason, the names it refuses, and those names where a query calls them: before a parenthesis)
_CALLS_REFUSED = [(reason, re.compile(rf"(?:{_names(names)})", re.IGNORECASE),
                   re.compile(rf"\b(?:{_names(names)})(?=\s*\()", re.IGNORECASE)) for reason, names in CALLS_REFUSED]


def refused_call(name: str) -> str | None:
    """Why a call of ``name`` is refused on the read path; None where it is not."""
    return next((reason for reason, named, _ in _CALLS_REFUSED if named.fullmatch(name)), None)


_TOKENS = re.compile(r"""'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.)*"|`(?:[^`\\]|\\.)*`|--[^\n]*|/\*.*?\*/|[^'"`/-]+|.""",
                     re.DOTALL)


# What ClickHouse's lexer reads as the start of a string or a comment where ``_TOKENS`` reads
# code: a heredoc (``$$...$$``, ``$tag$...$tag$``; ``$`` is a name's letter too), a comment begun
# by ``# ``, ``#!`` or ``//``, a Unicode quote (or any other character past ASCII). A quote inside
# one would make this check read a string where ClickHouse reads code (``SELECT 1 # '`` then, on
# the next line, ``, file('/etc/shadow') --'``), so outside strings, quoted names and comments
# a query holds none of them. So too a ``/*`` inside a comment: ClickHouse's comments nest.
_UNREAD = re.compile(r"[$#]|//|[^\x00-\x7f]")


def _code(sql: str) -> str:
    """``sql`` without its string literals and comments (each a space); quoted identifiers kept
    without their quotes, so ``system``.`query_log` is seen as system.query_log. ValueError
    where ClickHouse would read a string or a comment where this reads none (``_UNREAD``)."""
    out, bare = [], []  # (bare: the code alone, quoted names a space too)
    for token in _TOKENS.findall(sql):
        if token.startswith(("'", "--", "/*")):
            if token.startswith("/*") and "/*" in token[2:]:
                raise ValueError("a comment inside a comment is refused on the read path (ClickHouse's comments "
                                 "nest, this check's do not): write one /* comment */ at a time")
            out.append(" ")
            bare.append(" ")
        elif token.startswith(('"', "`")):
            out.append(token[1:-1])
            bare.append(" ")
        else:
            out.append(token)
            bare.append(token)
    if unread := _UNREAD.search("".join(bare)):
        raise ValueError(f"{unread.group(0)!r} outside a string is refused on the read path: ClickHouse may read it "
                         "as the start of a string or a comment where this check would not (write strings in "
                         "'single quotes', comments after --, names with it in `backquotes`)")
    return "".join(out)


def check_query(sql: str) -> str:
    """The one statement a read-path query may be, or ValueError saying why not: empty; more
    than one statement; a statement that does not read (``READ_STATEMENTS``: KILL, SYSTEM, SET,
    OPTIMIZE, ...); ``INTO OUTFILE`` (the embedded engine writes the file, read-only or not); a
    system table outside ``SYSTEM_ALLOWED``; a call of ``CALLS_REFUSED``."""
    code = _code(sql)
    if not code.strip():
        raise ValueError("an empty query: give one statement, such as SELECT count() FROM gpufleet.gpu_samples")
    statements = [part for part in code.split(";") if part.strip()]
    if len(statements) > 1:
        raise ValueError(f"{len(statements)} statements: give one statement at a time")
    if re.match(r"\s*KILL\b", code, re.IGNORECASE):
        raise ValueError("KILL is refused on the read path: it would stop other analysts' queries or the sink's "
                         "inserts; a query that runs too long stops at its time limit (GPUFLEET_QUERY_MAX_SECONDS)")
    kind = (re.match(r"[\s(]*(\w*)", code).group(1) or code.strip()[:1]).upper()
    if kind == "SYSTEM":
        raise ValueError("SYSTEM statements are refused on the read path: they stop, start, flush or reload the "
                         "server's own work (merges, logs, caches, replicas), which is its operators' to do")
    if kind not in READ_STATEMENTS:
        raise ValueError(f"{kind} is refused on the read path: it reads with {', '.join(READ_STATEMENTS)}")
    show = re.match(r"\s*SHOW\s+(?:(?:FULL|EXTENDED)\s+)*(\w+)(?:\s+(\w+))?", code, re.IGNORECASE)
    shown, then = (show.group(1).upper(), (show.group(2) or "").upper()) if show else ("", "")
    if show and (shown not in SHOW_ALLOWED or (shown == "CREATE" and then in SHOW_CREATE_REFUSED)):
        what = f"CREATE {then}" if shown == "CREATE" else shown
        raise ValueError(f"SHOW {what} is refused on the read path (it shows other analysts' queries or the server's "
                         f"settings and access); allowed: SHOW {', '.join(SHOW_ALLOWED[:4])}, ...")
    if re.search(r"\bINTO\s+OUTFILE\b", code, re.IGNORECASE):
        raise ValueError("INTO OUTFILE is refused on the read path: it writes a file on the host that runs the query; "
                         "the result comes back to you (gpufleet sql --format csv > FILE)")
    if re.search(r"\b(?:FROM|IN)\s+system\b(?!\s*\.)", code, re.IGNORECASE):
        raise ValueError("listing the system database is refused on the read path: SHOW TABLES FROM gpufleet lists "
                         "gpufleet's tables")
    for reason, _, calls in _CALLS_REFUSED:
        if called := calls.search(code):
            raise ValueError(f"{called.group(0)}() is refused on the read path: {reason}; query gpufleet's tables "
                             "by name")
    for table in re.findall(r"\bsystem\s*\.\s*(\w+)", code, re.IGNORECASE):
        if table.lower() not in SYSTEM_ALLOWED:
            raise ValueError(f"system.{table} is refused on the read path (it shows the server's paths, settings, "
                             f"users or queries); allowed: {', '.join(f'system.{t}' for t in sorted(SYSTEM_ALLOWED))}")
    return sql
