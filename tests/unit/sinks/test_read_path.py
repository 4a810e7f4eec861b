"""The read path's rules (``sinks.read_path``): what ClickHouse refuses in a read-only session,
and what the read path refuses before ClickHouse sees it."""

import re

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from gpufleet.sql import run_query
from sinks.read_path import TABLE_FUNCTIONS_ALLOWED, check_query, connect_reader, refusal, refused_call


def test_read_only_sessions_refuse_writes(chdb_client, database):
    chdb_client.command(f"CREATE DATABASE {database}")
    chdb_client.command(f"CREATE TABLE {database}.t (x UInt8) ENGINE = MergeTree ORDER BY x")
    reader = connect_reader(f"chdb://{chdb_client.path}")
    with pytest.raises(DatabaseError, match="readonly"):
        run_query(reader, f"INSERT INTO {database}.t VALUES (1)")
    run_query(chdb_client, f"INSERT INTO {database}.t VALUES (1)")
    assert run_query(reader, f"SELECT count() AS n FROM {database}.t") == (["n"], [(1,)])


# What a read-only session must refuse: writes, DDL, settings, and every table function that
# reaches the host's files, other servers or the network.
REFUSED = [
    "INSERT INTO {db}.t VALUES (1)",
    "CREATE TABLE {db}.u (x UInt8) ENGINE = Memory",
    "DROP TABLE {db}.t",
    "SET max_threads = 1",
    "SELECT * FROM file('/etc/passwd', 'LineAsString')",
    "SELECT * FROM url('http://127.0.0.1:9/x', 'CSV', 'a String')",
    "SELECT * FROM remote('127.0.0.1:9', system.one)",
    "SELECT * FROM s3('http://127.0.0.1:9/bucket-name/x.csv', 'CSV', 'a String')",
    "SELECT * FROM mysql('127.0.0.1:9', 'd', 't', 'u', 'p')",
    "SELECT * FROM executable('cat /etc/passwd', 'LineAsString', 'a String')",
    "SELECT * FROM {db}.t SETTINGS readonly = 0",
]


@pytest.mark.parametrize("sql", REFUSED)
def test_read_only_sessions_refuse_writes_settings_and_table_functions_that_reach_out(chdb_client, database, sql):
    chdb_client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    chdb_client.command(f"CREATE TABLE IF NOT EXISTS {database}.t (x UInt8) ENGINE = MergeTree ORDER BY x")
    reader = connect_reader(f"chdb://{chdb_client.path}")
    with pytest.raises(DatabaseError) as raised:
        run_query(reader, sql.format(db=database))
    assert refusal(raised.value).startswith("refused: gpufleet's query path is read-only")
    assert run_query(reader, f"SELECT count() AS n FROM {database}.t") == (["n"], [(0,)])  # reads still work



# What the read path refuses before ClickHouse sees it: what readonly=1 lets through but shows
# another analyst's queries, the server's settings or paths, or stops others' work.
BEFORE_CLICKHOUSE = [
    ("KILL QUERY WHERE 1", "KILL is refused"),
    ("SELECT 'a'; SELECT 'b'", "one statement at a time"),
    ("SELECT * FROM system.settings", "system.settings is refused"),
    ('SELECT * FROM "system"."disks"', "system.disks is refused"),
    ("SHOW PROCESSLIST", "SHOW PROCESSLIST is refused"),
    ("show settings like '%path%'", "SHOW SETTINGS is refused"),
    ("SHOW GRANTS", "SHOW GRANTS is refused"),
    # what follows FULL or EXTENDED is what is shown; SHOW CREATE shows tables, never the access
    ("SHOW FULL PROCESSLIST", "SHOW PROCESSLIST is refused"),
    ("show extended full processlist", "SHOW PROCESSLIST is refused"),
    ("SHOW CREATE USER default", "SHOW CREATE USER is refused"),
    ("SHOW CREATE SETTINGS PROFILE default", "SHOW CREATE SETTINGS is refused"),
    ("SHOW CREATE ROW POLICY p ON gpufleet.alerts", "SHOW CREATE ROW is refused"),
    ("SHOW CREATE QUOTA default", "SHOW CREATE QUOTA is refused"),
    ("SHOW CREATE ROLE analyst", "SHOW CREATE ROLE is refused"),
    ("SHOW TABLES FROM system", "the system database"),
    ("SELECT name FROM merge('system', '^settings$')", "merge() is refused"),
    ("SELECT * FROM clusterAllReplicas('default', system.one)", "clusterAllReplicas() is refused"),
    ("   ", "an empty query"),
    # SYSTEM whole: readonly lets some through without a table (they stop the server's merges).
    ("SYSTEM STOP MERGES", "SYSTEM statements are refused"),
    ("SYSTEM STOP TTL MERGES", "SYSTEM statements are refused"),
    ("system start merges", "SYSTEM statements are refused"),
    ("/* a comment */ SYSTEM FLUSH LOGS", "SYSTEM statements are refused"),
    ("SYSTEM DROP DNS CACHE", "SYSTEM statements are refused"),
    # Only what reads: no statement of another kind reaches ClickHouse at all.
    ("OPTIMIZE TABLE gpufleet.alerts FINAL", "OPTIMIZE is refused"),
    ("SET max_execution_time = 0", "SET is refused"),
    ("USE system", "USE is refused"),
]


@pytest.mark.parametrize("sql, says", BEFORE_CLICKHOUSE)
def test_the_read_path_refuses_what_readonly_lets_through(sql, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        check_query(sql)


@pytest.mark.parametrize("sql", [
    "SELECT count() FROM gpufleet.gpu_samples WHERE host = 'system.settings; KILL'",  # words in a string
    "SHOW TABLES FROM gpufleet", "SHOW CREATE TABLE gpufleet.gpu_samples", "DESCRIBE gpufleet.alerts",
    "SHOW FULL TABLES FROM gpufleet", "SHOW EXTENDED COLUMNS FROM gpufleet.alerts", "SHOW CREATE gpufleet.alerts",
    "SHOW CREATE VIEW gpufleet.v", "SHOW CREATE DATABASE gpufleet",
    "SELECT number FROM system.numbers LIMIT 3", "SELECT * FROM numbers(3) -- ; KILL QUERY",
    "SELECT merged FROM gpufleet.t", "WITH 1 AS x SELECT x", "(SELECT 1) UNION ALL (SELECT 2)",
    "EXPLAIN SELECT 1", "EXISTS TABLE gpufleet.alerts", "desc gpufleet.alerts", "SELECT system FROM gpufleet.t",
    "SELECT file, url, dict, loop FROM gpufleet.t",  # columns named as refused functions: no call
    "SELECT '$$ # // \u2018', \"\u00e9t\u00e9\", `a$b` FROM gpufleet.t",  # in strings and quoted names
    "SELECT 1 -- a comment may hold $ # // and \u00e9\n", "SELECT 1 /* $ # // \u00e9 */", "SELECT 4 / 2",
    "SELECT URLHierarchy(u), formatReadableSize(1), timeSeriesTagsToMap(t), my_file(1) FROM gpufleet.t",
])
def test_what_an_analyst_writes_passes(sql):
    assert check_query(sql) == sql


# What ClickHouse runs in a read-only session and yet reaches past gpufleet's tables: a scalar
# function that reads the host's files (``file``: the table function of that name is refused by
# readonly, the function is not), functions and table functions that read tables or
# dictionaries named in strings (another database's keys, a Join table's rows), the server's
# settings and paths, SQL made from strings, the objects of the process that runs the query, and
# a write to the server's log. Each is refused by name, however it is written.
REFUSED_BY_NAME = [
    ("SELECT file('/etc/shadow')", "file() is refused"),
    ("SELECT `file`('/etc/shadow')", "file() is refused"),
    ("SELECT FILE ('/etc/shadow')", "FILE() is refused"),
    ("SELECT file/* a comment */('/etc/shadow')", "file() is refused"),
    ("SELECT arrayMap(p -> file(p), ['/etc/shadow'])", "file() is refused"),
    ("SELECT * FROM filesystem('/etc')", "filesystem() is refused"),
    ("SELECT filesystemAvailable()", "filesystemAvailable() is refused"),
    ("SELECT * FROM sqlite('/var/lib/x.db', 't')", "sqlite() is refused"),
    ("SELECT * FROM mergeTreeIndex('other', 'secret', with_marks = true)", "mergeTreeIndex() is refused"),
    ("SELECT joinGet('other.j', 'v', 'a')", "joinGet() is refused"),
    ("SELECT dictGetString('users', 'password', 1)", "dictGetString() is refused"),
    ("SELECT hasColumnInTable('other', 'secret', 'k')", "hasColumnInTable() is refused"),
    ("SELECT getServerSetting('path')", "getServerSetting() is refused"),
    ("SELECT getSetting('max_memory_usage')", "getSetting() is refused"),
    ("SELECT * FROM eval('SELECT * FROM sys' || 'tem.settings')", "eval() is refused"),
    ("SELECT * FROM python(df)", "python() is refused"),
    ("SELECT aiGenerate('hello')", "aiGenerate() is refused"),
    ("SELECT logTrace('a line in the server log')", "logTrace() is refused"),
    ("SELECT * FROM loop(gpufleet.alerts)", "loop() is refused"),
    ("SELECT * FROM icebergS3('http://127.0.0.1:9/bucket-name/t/')", "icebergS3() is refused"),
    ("SELECT * FROM timeSeriesData('gpufleet', 't')", "timeSeriesData() is refused"),
    # the embedded engine writes a SELECT's result where INTO OUTFILE says, read-only or not
    ("SELECT 'x' INTO OUTFILE '/root/.ssh/authorized_keys' TRUNCATE FORMAT TSVRaw", "INTO OUTFILE is refused"),
    ("select 1 into\n  outfile 'x.csv'", "INTO OUTFILE is refused"),
]


# Where ClickHouse reads a string or a comment and a simpler lexer reads code, a quote inside it
# would hide the rest of the query from the checks: each such start is refused outside strings.
READ_AS_CLICKHOUSE_READS = [
    ("SELECT $$'$$ AS a, file('/etc/shadow') AS b --'", "'$' outside a string is refused"),  # a heredoc
    ("SELECT $x$'$x$, file('/etc/shadow') --'", "'$' outside a string is refused"),
    ("SELECT 1 AS a$b", "'$' outside a string is refused"),  # (a name's letter, as ClickHouse reads it)
    ("SELECT 1 # '\n, file('/etc/shadow') --'", "'#' outside a string is refused"),  # MySQL's comments
    ("SELECT 1 #! '\n, file('/etc/shadow') --'", "'#' outside a string is refused"),
    ("SELECT 1 // '\n, file('/etc/shadow') --'", "'//' outside a string is refused"),
    ("SELECT 1 /* /* */ ' */ , file('/etc/shadow') --'", "a comment inside a comment is refused"),
    ("SELECT \u2018a\u2019", "'\u2018' outside a string is refused"),  # Unicode quotes: a string
    ("SELECT 1,\u00a02", r"'\xa0' outside a string is refused"),  # (the message names it as Python writes it)
]


@pytest.mark.parametrize("sql, says", READ_AS_CLICKHOUSE_READS)
def test_what_clickhouse_reads_as_a_string_or_a_comment_is_never_read_as_code(sql, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        check_query(sql)


@pytest.mark.parametrize("sql, says", REFUSED_BY_NAME)
def test_functions_that_reach_past_gpufleets_tables_are_refused_by_name(sql, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        check_query(sql)


def test_the_read_path_stops_what_a_read_only_session_would_run(chdb_client, database, tmp_path):
    """The hazard itself: a read-only session reads a file (a call hidden from the old checks
    too), another database's keys, and writes a file; the read path (its check, then the
    session) does none of it."""
    secret = tmp_path / "secret.txt"
    secret.write_text("a line nobody may read\n")
    chdb_client.command(f"CREATE DATABASE {database}")
    chdb_client.command(f"CREATE TABLE {database}.secret (k String) ENGINE = MergeTree ORDER BY k")
    chdb_client.command(f"INSERT INTO {database}.secret VALUES ('a-primary-key')")
    reader = connect_reader(f"chdb://{chdb_client.path}")
    reaching = [f"SELECT file('{secret}')", f"SELECT * FROM mergeTreeIndex('{database}', 'secret')",
                f"SELECT $$'$$ AS a, file('{secret}') AS b --'"]
    for sql in reaching:
        ran = run_query(reader, sql)  # (ClickHouse alone: readonly lets each through)
        assert "a line nobody may read" in str(ran) or "a-primary-key" in str(ran), (sql, ran)

    def read_path(sql: str):
        return run_query(reader, check_query(sql))

    written = tmp_path / "written.txt"
    run_query(reader, f"SELECT 'a line' INTO OUTFILE '{written}'")  # (ClickHouse alone writes it)
    assert "a line" in written.read_text()
    written.unlink()
    reaching.append(f"SELECT 'a line' INTO OUTFILE '{written}'")
    for sql in reaching:
        with pytest.raises(ValueError, match="is refused on the read path"):
            read_path(sql)
    assert not written.exists()
    assert read_path("SELECT number FROM numbers(2)") == (["number"], [(0,), (1,)])


# The functions of these categories may reach past a query's own data (files, settings,
# dictionaries, the server's workings); every one the engine has is refused by name or listed
# here as reviewed and harmless: an engine that brings a new one fails this test until it is
# placed. The other categories compute on the values they are given.
CATEGORIES_REVIEWED = {"Other", "Introspection", "AI", "Dictionary", "Embedded Dictionary", "Machine Learning",
                       "Internal"}
CATEGORIES_OF_VALUES = {
    "Type Conversion", "IP Address", "UUID", "Encryption", "Geo", "Mathematical", "Bit", "URL", "Arrays",
    "String Search", "JSON", "Arithmetic", "Dates and Times", "Hash", "Time Window", "Geo Polygon",
    "String Splitting", "Time Series", "String Replacement", "String", "Random Number", "Encoding",
    "NumericIndexedVector", "Financial", "Tuple", "Map", "Null", "Comparison", "Rounding", "Distance", "QBit",
    "Bitmap", "Conditional", "Logical", "Aggregate Functions", ""}
REVIEWED_HARMLESS = {  # they compute on their arguments, or tell the session's own query, user or server version
    "FQDN", "MACNumToString", "MACStringToNum", "MACStringToOUI", "_CAST", "__actionName", "__applyFilter",
    "__bitBoolMaskAnd", "__bitBoolMaskOr", "__bitSwapLastTwo", "__bitWrapperFunc", "__getScalar",
    "__groupingForCube", "__groupingForGroupingSets", "__groupingForRollup", "__groupingOrdinary",
    "__patchPartitionID", "__scalarSubqueryResult", "__toYearCalendarOnly", "assignCentroid", "authenticatedUser",
    "bar", "blockNumber", "blockSerializedSize", "blockSize", "buildId", "byteSize", "caseWithExpression",
    "colorOKLABToSRGB", "colorOKLCHToSRGB", "colorSRGBToOKLAB", "colorSRGBToOKLCH", "connectionId", "countDigits",
    "currentDatabase", "currentHandler", "currentProfiles", "currentQueryID", "currentRequestURL", "currentRoles",
    "currentSchemas", "currentUser", "defaultProfiles", "defaultRoles", "defaultValueOfArgumentType",
    "defaultValueOfTypeName", "digits", "displayName", "dumpColumnStructure", "enabledProfiles", "enabledRoles",
    "errorCodeToName", "evalMLMethod", "finalizeAggregation", "flipCoordinates", "formatQuery",
    "formatQueryFromJSON", "formatQueryOrNull", "formatQuerySingleLine", "formatQuerySingleLineOrNull",
    "formatReadableDecimalSize", "formatReadableQuantity", "formatReadableSize", "formatReadableTimeDelta",
    "fuzzQuery", "generateRandomStructure", "generateSerialID", "getClientHTTPHeader",
    "getMaxTableNameLengthForDatabase", "getOSKernelVersion", "getSizeOfEnumType", "getSubcolumn",
    "getTypeSerializationStreams", "hasThreadFuzzer", "hierarchicalKMeans", "highlightQuery", "hostName",
    "identity", "ignore", "indexHint", "initialQueryID", "initialQueryStartTime", "initializeAggregation",
    "isConstant", "isDecimalOverflow", "isMergeTreePartCoveredBy", "lowCardinalityIndices", "lowCardinalityKeys",
    "materialize", "minSampleSizeContinuous", "minSampleSizeConversion", "naiveBayesClassifier",
    "naiveBayesClassifierWithAllProbs", "naiveBayesClassifierWithProb", "neighbor", "nested", "normalizeQuery",
    "normalizeQueryKeepNames", "normalizedQueryHash", "normalizedQueryHashKeepNames", "obfuscateQuery",
    "obfuscateQueryWithSeed", "parseISO8601Duration", "parseQueryToJSON", "parseReadableSize",
    "parseReadableSizeOrNull", "parseReadableSizeOrZero", "parseTimeDelta", "partitionId", "pgGetUserById",
    "pgTableIsVisible", "queryID", "revision", "rowNumberInAllBlocks", "rowNumberInBlock", "runningAccumulate",
    "runningConcurrency", "runningDifference", "runningDifferenceStartingWithFirstValue", "serverUUID",
    "shardCount", "shardNum", "sleep", "sleepEachRow", "stochasticLinearRegression",
    "stochasticLogisticRegression", "structureToCapnProtoSchema", "structureToProtobufSchema", "tcpPort",
    "throwIf", "tid", "toColumnTypeName", "toTypeName", "tokenizeQuery", "transactionID",
    "transactionLatestSnapshot", "transactionOldestSnapshot", "transform", "uptime", "validateNestedArraySizes",
    "variantElement", "variantType", "version", "visibleWidth", "zookeeperSessionUptime"}


def test_every_table_function_and_every_function_that_may_reach_out_is_placed(chdb_client):
    """The engine's own lists against the read path's review: each table function allowed or
    refused by name, each function of the categories that may reach past a query's data refused
    or reviewed harmless, and no category that was not reviewed."""
    table_functions = {r[0] for r in chdb_client.query("SELECT name FROM system.table_functions").result_rows}
    unplaced = sorted(n for n in table_functions if n not in TABLE_FUNCTIONS_ALLOWED and refused_call(n) is None)
    assert not unplaced, f"table functions new to the read path: refuse them in CALLS_REFUSED or allow them: {unplaced}"
    assert not [n for n in TABLE_FUNCTIONS_ALLOWED if refused_call(n)]
    functions = chdb_client.query("SELECT name, categories FROM system.functions").result_rows
    unreviewed = sorted({c for _, c in functions} - CATEGORIES_REVIEWED - CATEGORIES_OF_VALUES)
    assert not unreviewed, f"categories of functions new to the read path: review them: {unreviewed}"
    unplaced = sorted(n for n, c in functions
                      if c in CATEGORIES_REVIEWED and refused_call(n) is None and n not in REVIEWED_HARMLESS)
    assert not unplaced, f"functions new to the read path: refuse them in CALLS_REFUSED or review them: {unplaced}"
    # (a refused name is refused in any case, as ClickHouse's case-insensitive aliases are called)
    assert refused_call("AIGENERATE") and refused_call("File") and refused_call("fileClusterX") is None
