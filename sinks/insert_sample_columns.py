"""GPU samples into ClickHouse without decoding them in Python: the agents' ``GpuSampleColumns``
messages are handed to ClickHouse as they came, and ClickHouse decodes, checks and stores them.

Decoding a message's Avro in Python and serialising its columns again for the ClickHouse client
cost the sink most of its time (``benchmarks/bench_sink_kafka.py``). Here a batch's messages
become one Avro object container: each message's bytes after the 5-byte wire header, framed by
its Kafka partition and offset in front and its offset again behind. Avro records have no
framing of their own, so this is only concatenation, and ClickHouse reads the container with
its own Avro parser into a temporary table, one row per message. Then, in SQL:

1. every check the Python path makes (``schemas.validate_sample.BOUNDS``, the ids, the block's
   shape, UTF-8 text) plus the range of each column's ClickHouse type, and that each message
   ended where its trailing offset says (no bytes left over, none missing);
2. only if every message passes: one ``INSERT ... SELECT`` of their samples into
   ``gpu_samples`` with the batch's deduplication token (as the Python path inserts one block).

A batch with any message that fails, or that ClickHouse cannot parse, is left to the Python
path whole (``ClickHouseSink``): it decodes, says why for each bad sample in a dead letter and
stores the rest, as before. So the SQL checks may be stricter than the Python ones, never laxer
(a test compares the two on random blocks), and a batch's samples always land in one insert:
the sink's resume after the highest stored offset stays exact.

A nullable column (``["null", array]`` in the schema) is declared to ClickHouse as
``["null", record {v: array}]``: the same bytes, but ClickHouse then tells a null column
(``Nullable(Tuple)``) from an empty one, which the contract refuses where the block has samples.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from schemas.codec import WIRE_HEADER_BYTES, Codec, strip_timestamp_logical_types
from schemas.sample_columns import NAME, NO_SAMPLES, NULLABLE, SHARED
from schemas.validate_ids import ID_PATTERN, MAX_ID_LENGTH
from schemas.validate_sample import ACROSS, BOUNDS, MAX_AHEAD_OF_KAFKA_MS
from sinks.clickhouse_client import is_transient
from sinks.ddl_samples import GPU_SAMPLES_TABLE
from sinks.table import KAFKA_COLUMNS

log = logging.getLogger(__name__)

_ID_PATTERN = f"^(?:{ID_PATTERN})$"  # the contract's id rule (schemas.validate_ids), whole string
_UNSIGNED = {"UInt8": 255, "UInt16": 65_535, "UInt32": 4_294_967_295, "UInt64": None}
_SYNC = b"gpufleet-columns"  # the container's 16-byte block marker
# The INSERT ... SELECT squashes its rows into one block (as the Python path's insert of a batch
# is one), so that a batch lands whole or not at all under its deduplication token. ClickHouse
# squashes up to ~1 M rows or 256 MB by default (a 206,790-sample batch: one part, measured);
# these lift the limits for the largest batches.
ONE_BLOCK = {"min_insert_block_size_rows": 1 << 40, "min_insert_block_size_bytes": 1 << 50}


@dataclass(frozen=True)
class Message:
    """A ``GpuSampleColumns`` message and where it came from."""

    partition: int
    offset: int
    value: bytes
    topic: str
    topic_id: str
    received_ms: int = 0  # when Kafka received it (its record's timestamp); 0: unknown


def _long(n: int) -> bytes:
    """Avro's zig-zag varint."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _bytes(b: bytes) -> bytes:
    return _long(len(b)) + b


def envelope_schema(codec: Codec) -> dict:
    """The Avro schema ClickHouse reads the container with: the newest ``GpuSampleColumns``
    between the Kafka position and the trailing offset, each nullable column wrapped."""
    fields = []
    for f in codec.schema_json(NAME)["fields"]:
        t = strip_timestamp_logical_types(f["type"])
        if f["name"] in NULLABLE:  # ["null", {"type": "array", ...}]
            (array,) = [b for b in t if b != "null"]
            t = ["null", {"type": "record", "name": f"present_{f['name']}", "fields": [{"name": "v", "type": array}]}]
        fields.append({"name": f["name"], "type": t})
    return {"type": "record", "name": "GpuSampleColumnsAt", "fields": [
        {"name": "kafka_partition", "type": "int"}, {"name": "kafka_offset", "type": "long"},
        {"name": "kafka_received_ms", "type": "long"}, *fields, {"name": "trailer", "type": "long"}]}


def container(schema: dict, messages: Sequence[Message]) -> bytes:
    """One Avro object container of ``messages`` (their bytes after the wire header), one block,
    no compression."""
    meta = {b"avro.schema": json.dumps(schema).encode(), b"avro.codec": b"null"}
    header = b"Obj\x01" + _long(len(meta)) + b"".join(_bytes(k) + _bytes(v) for k, v in meta.items()) + b"\0" + _SYNC
    skip = WIRE_HEADER_BYTES
    body = b"".join(b"".join((_long(m.partition), _long(m.offset), _long(m.received_ms), memoryview(m.value)[skip:],
                              _long(m.offset))) for m in messages)
    return header + _long(len(messages)) + _long(len(body)) + body + _SYNC


def _column_checks(column: str, array: str, clickhouse_type: str) -> list[str]:
    """Conditions on every value ``x`` of ``array`` (the column's values in a message)."""
    checks = []
    for b in BOUNDS:
        if b.field == column:
            checks.append(f"x > {b.low}" if b.low_open else f"x >= {b.low}")
            if b.high != float("inf"):
                checks.append(f"x <= {b.high}")
    base = re.match(r"(?:(?:LowCardinality|Nullable|Array)\()*(\w+)", clickhouse_type).group(1)
    if base in _UNSIGNED:
        checks.append("x >= 0")
        if _UNSIGNED[base] is not None:
            checks.append(f"x <= {_UNSIGNED[base]}")
    if base == "String":
        checks.append("isValidUTF8(x)")
    if not checks:
        return []
    if clickhouse_type.startswith("Array("):  # a list per sample (XIDs): a message has a list of lists
        return [f"arrayAll(y -> arrayAll(x -> {' AND '.join(checks)}, y), {array})"]
    return [f"arrayAll(x -> {' AND '.join(checks)}, {array})"]


class SampleColumnsInsert:
    """Inserts batches of ``GpuSampleColumns`` messages into ``gpu_samples`` through ClickHouse's
    own Avro parser, in a temporary table of the client's session; ``insert`` returns None
    (nothing stored) where the batch must take the Python path."""

    def __init__(self, client: Client, database: str, codec: Codec, retries: int = 5, backoff_s: float = 0.2) -> None:
        self.client, self.database, self.codec = client, database, codec
        self.retries, self.backoff_s = retries, backoff_s
        self.header = codec.wire_header(NAME)
        self.no_samples = {codec.wire_header(name) for name in NO_SAMPLES}
        self.schema = envelope_schema(codec)
        self.staging = f"gpufleet_sample_columns_{secrets.token_hex(4)}"
        self._created = False
        self._sql: tuple[str, str] | None = None

    def accepts(self, value: bytes | None) -> bool:
        """Whether a message is the newest ``GpuSampleColumns`` version (others: the Python path)."""
        return value is not None and value[:WIRE_HEADER_BYTES] == self.header

    def carries_no_samples(self, value: bytes | None) -> bool:
        """Whether a message says it holds no sample (a ``PartitionClock``, a job's end;
        decoded in Python)."""
        return value is not None and value[:WIRE_HEADER_BYTES] in self.no_samples

    def _prepare(self) -> tuple[str, str]:
        if self._sql is None:
            types = self.client.query("SELECT name, type FROM system.columns WHERE database = {db:String} "
                                      "AND table = 'gpu_samples'", parameters={"db": self.database}).result_rows
            self._sql = statements(self.schema, self.staging, self.database, dict(types))
        return self._sql

    def _ensure_staging(self) -> None:
        if not self._created:
            columns = ", ".join(f"{f['name']} {clickhouse_type(f['type'])}" for f in self.schema["fields"])
            self.client.command(f"CREATE TEMPORARY TABLE IF NOT EXISTS {self.staging} ({columns}) ENGINE = Memory")
            self._created = True

    def insert(self, messages: Sequence[Message], token: str) -> int | None:
        """Store the samples of ``messages`` (all of ``accepts``) in one insert; the number of
        samples, or None where nothing was stored and the batch must take the Python path.
        A transient failure (a connection lost, the server busy) is retried ``retries`` times
        with the same token, as the writer retries its inserts, then raised."""
        for attempt in range(self.retries + 1):
            try:
                return self._insert_once(messages, token)
            except DatabaseError as exc:
                if attempt == self.retries or not is_transient(exc):
                    raise
                delay = self.backoff_s * 2**attempt
                log.warning("ClickHouse's insert of samples failed (%s), retry %d in %.1fs", exc, attempt + 1, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    def _insert_once(self, messages: Sequence[Message], token: str) -> int | None:
        check, insert = self._prepare()
        self._ensure_staging()
        (topic, topic_id), = {(m.topic, m.topic_id) for m in messages}
        try:
            self.client.raw_insert(self.staging, insert_block=container(self.schema, messages), fmt="Avro")
            (count, samples, bad, first_bad), = self.client.query(check).result_rows
            if count != len(messages) or bad:
                log.info("the Python path takes a batch of %d messages: %s", len(messages),
                         f"{bad} fail a check, the first at {first_bad}" if bad else f"{count} parsed")
                return None
            self.client.command(insert, parameters={"topic": topic, "topic_id": topic_id},
                                settings={"insert_deduplication_token": token, **ONE_BLOCK})
            return int(samples)
        except DatabaseError as exc:
            if is_transient(exc):
                raise
            log.info("the Python path takes a batch of %d messages: ClickHouse could not read it (%s)",
                     len(messages), str(exc).splitlines()[0][:300])
            return None
        finally:
            try:
                self.client.command(f"TRUNCATE TABLE {self.staging}")
            except DatabaseError:
                # The session may be gone (a server restarted), its table with it: made again
                # next time; rows left in one that is not gone fail the next batch's count.
                self._created = False


def _id_ok(expr: str) -> str:
    return f"length({expr}) <= {MAX_ID_LENGTH} AND match({expr}, {_quote(_ID_PATTERN)})"


def statements(schema: dict, staging: str, database: str, types: dict[str, str]) -> tuple[str, str]:
    """The check of a batch in ``staging`` (messages, samples, messages that fail and the first of
    them with why) and the insert of its samples into ``gpu_samples`` (``types``: its columns')."""
    n = "length(event_time)"
    reasons = [("trailer != kafka_offset", "the message does not end where its offset says"),
               (f"NOT ({_id_ok('workflow_id')})", "workflow_id"), (f"NOT ({_id_ok('host')})", "host"),
               *((f"NOT (isNull({f}) OR ({_id_ok(f'assumeNotNull({f})')}))", f) for f in ("owner", "team"))]
    values: dict[str, str] = {}
    for f in (f["name"] for f in schema["fields"]):
        if f in ("kafka_partition", "kafka_offset", "kafka_received_ms", "trailer") or f in SHARED:
            continue
        present, values[f] = (
            ("1", f) if f not in NULLABLE else (f"NOT isNull({f})", f"tupleElement(assumeNotNull({f}), 'v')")
        )
        reasons.append((f"{present} AND length({values[f]}) != {n}", f"the shape of {f}"))
        reasons += [
            (f"{present} AND NOT {check}", f"the values of {f}")
            for check in _column_checks(f, values[f], types.get(f, ""))
        ]
    for rule in ACROSS:  # validate_sample's rules across two columns
        within = (f"isNull({rule.field}) OR isNull({rule.limit}) OR arrayAll((v, l) -> v <= l, "
                  f"{values[rule.field]}, {values[rule.limit]})")
        reasons.append((f"NOT ({within})", f"{rule.field} > {rule.limit}"))
    # blocks_of's judgement of event time against the time Kafka received the message
    ahead = f"kafka_received_ms > 0 AND arrayExists(t -> t > kafka_received_ms + {MAX_AHEAD_OF_KAFKA_MS}, event_time)"
    reasons.append((ahead, "samples ahead of the time Kafka received them"))
    reason = "multiIf(" + ", ".join(f"{cond}, {_quote(why)}" for cond, why in reasons) + ", '')"
    check = (f"SELECT count(), sum({n}), countIf(reason != ''), anyIf((kafka_partition, kafka_offset, reason), "
             f"reason != '') FROM (SELECT *, {reason} AS reason FROM {staging})")
    out = []
    for c in GPU_SAMPLES_TABLE.columns:
        if c in SHARED:
            out.append(c)
        elif c == "event_time":
            out.append("fromUnixTimestamp64Milli(event_time[i], 'UTC')")
        elif c in NULLABLE:
            out.append(f"if(isNull({c}), NULL, {values[c]}[i])")
        else:
            out.append(f"{values[c]}[i]")
    names = ", ".join((*GPU_SAMPLES_TABLE.columns, *KAFKA_COLUMNS))
    insert = (f"INSERT INTO {database}.gpu_samples ({names}) SELECT {', '.join(out)}, kafka_partition, kafka_offset, "
              f"{{topic:String}}, {{topic_id:String}} FROM {staging} ARRAY JOIN arrayEnumerate(event_time) AS i")
    return check, insert


_AVRO_TYPES = {"int": "Int32", "long": "Int64", "float": "Float32", "double": "Float64",
               "boolean": "Bool", "string": "String"}


def clickhouse_type(avro) -> str:
    """The ClickHouse type ClickHouse reads an Avro type of the envelope into."""
    if isinstance(avro, str):
        return _AVRO_TYPES[avro]
    if isinstance(avro, list):
        (inner,) = [t for t in avro if t != "null"]
        return f"Nullable({clickhouse_type(inner)})"
    if avro["type"] == "array":
        return f"Array({clickhouse_type(avro['items'])})"
    if avro["type"] == "record":
        return "Tuple(" + ", ".join(f"{f['name']} {clickhouse_type(f['type'])}" for f in avro["fields"]) + ")"
    return clickhouse_type(avro["type"])


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
