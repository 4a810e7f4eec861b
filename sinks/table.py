"""What every gpufleet table in ClickHouse is: the topic it stores, the columns filled from
each record, its DDL; and the Kafka position every row keeps (topic, Kafka's id of it,
partition, offset), with the projection of the highest offset per partition that the sink
resumes from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from schemas.topics import TopicSpec


@dataclass(frozen=True)
class Table:
    name: str
    topic: TopicSpec
    columns: tuple[str, ...]  # filled from the record's fields of the same name, in this order
    ddl: str  # {db} and {name} are filled in
    prepare: Callable[[dict], dict] | None = None  # record -> row, where a field needs reshaping
    # Columns added after the table was first created: (name, type), applied idempotently.
    added_columns: tuple[tuple[str, str], ...] = ()
    # Records of the topic kept in another table (that table, and which records): inserted
    # before this table's rows, since the sink resumes from this table's rows only, so a batch
    # whose set-aside rows landed and whose others did not is read again (the set-aside rows
    # then collapse as this table's do).
    aside: tuple[Table, Callable[[dict], bool]] | None = None


KAFKA_COLUMNS = ("kafka_partition", "kafka_offset", "kafka_topic", "kafka_topic_id")
# Added to every table after its first release; rows written before have '' in both.
KAFKA_TOPIC_COLUMNS = (("kafka_topic", "LowCardinality(String) DEFAULT ''"),
                       ("kafka_topic_id", "LowCardinality(String) DEFAULT ''"))
OFFSETS_PROJECTION = "kafka_offsets"

# Inserts carry a deduplication token (sinks/write_clickhouse.py); a table without
# replication only remembers the last this many of them.
DEDUPLICATION_WINDOW = 10_000


# The highest offset per topic and partition, in each part beside its rows (cheap to read).
OFFSETS_PROJECTION_CLAUSE = (f"ADD PROJECTION IF NOT EXISTS {OFFSETS_PROJECTION} (SELECT kafka_topic, "
                             "kafka_topic_id, kafka_partition, max(kafka_offset) "
                             "GROUP BY kafka_topic, kafka_topic_id, kafka_partition)")


def offsets_projection(table: str) -> str:
    """The statement that gives ``table`` (``database.table``) its offsets projection."""
    return f"ALTER TABLE {table} {OFFSETS_PROJECTION_CLAUSE}"
