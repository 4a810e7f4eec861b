"""Where the sink resumes each partition, from Kafka's committed offsets and ClickHouse's rows."""

import pytest

from sinks.consume_to_clickhouse import OffsetsDisagree, resume_plan
from sinks.write_clickhouse import Position

T = "p.gpufleet.gpu-samples.v1"


def test_clickhouse_ahead_of_the_committed_offset_is_where_the_partition_resumes():
    seek, warnings = resume_plan([(T, 0), (T, 1), (T, 2)], {T: "id-1"},
                                 {Position(T, "id-1", 0): 50, Position(T, "id-1", 1): 20},
                                 {(T, 0): 40, (T, 1): 30, (T, 2): -1001}, {(T, 0): 60, (T, 1): 30})
    assert seek == {(T, 0): 50} and warnings == []  # partition 1: Kafka is ahead; 2: nothing stored


def test_rows_of_an_earlier_topic_of_the_same_name_are_not_this_ones():
    """The topic was deleted and created again: its old rows go up to 5000, the new one has 30
    messages. Resuming at 5000 would skip all of them without a word."""
    seek, warnings = resume_plan([(T, 0)], {T: "id-new"}, {Position(T, "id-old", 0): 5000},
                                 {(T, 0): -1001}, {})
    assert seek == {}
    (warning,) = warnings
    assert "id-old" in warning and "id-new" in warning and "created" in warning


def test_rows_beyond_the_end_of_the_partition_stop_the_sink():
    with pytest.raises(OffsetsDisagree, match=r"ends at offset 30 in Kafka, but ClickHouse holds its rows up to "
                                              r"offset 99"):
        resume_plan([(T, 0)], {T: "id-1"}, {Position(T, "id-1", 0): 100}, {(T, 0): 20}, {(T, 0): 30})
