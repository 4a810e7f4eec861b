"""Where the sink resumes each partition, from Kafka's committed offsets and ClickHouse's rows."""

from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException

from sinks.resume_offsets import OffsetsDisagree, TopicIdUnknown, resume_plan, topic_ids
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


class Described:
    def __init__(self, topic_id: str) -> None:
        self.topic_id = topic_id


class Cluster:
    """The admin client's describe_topics at its boundary: each topic's answers in turn (an
    error, or the topic's id), the last one kept."""

    def __init__(self, answers: dict[str, list]) -> None:
        self.answers, self.asked = answers, []

    def describe_topics(self, topics, request_timeout):
        names = sorted(topics.topic_names)
        self.asked.append(names)
        out = {}
        for name in names:
            answer = self.answers[name].pop(0) if len(self.answers[name]) > 1 else self.answers[name][0]
            future = Future()
            if isinstance(answer, str):
                future.set_result(Described(answer))
            elif answer is None:
                pass  # (no answer yet)
            else:
                future.set_exception(KafkaException(KafkaError(answer)))
            out[name] = future
        return out


def test_a_topic_id_the_cluster_cannot_say_for_now_is_asked_again_until_it_does():
    cluster = Cluster({"a": [KafkaError._TIMED_OUT, KafkaError.LEADER_NOT_AVAILABLE, "id-a"], "b": ["id-b"]})
    assert topic_ids(cluster, ["a", "b"], pause_s=0) == {"a": "id-a", "b": "id-b"}
    assert cluster.asked == [["a", "b"], ["a"], ["a"]]


def test_a_sink_that_gets_no_topic_id_in_time_stores_nothing_rather_than_rows_without_it():
    """Found by the soak: every topic's id timed out at a sink's first assignment (its cluster's
    controller not yet elected), and the sink stored rows under no id until its next."""
    cluster = Cluster({"a": [KafkaError._TIMED_OUT], "b": ["id-b"]})
    with pytest.raises(TopicIdUnknown, match=r"did not say the id of a in 0 s .*no row is stored without"):
        topic_ids(cluster, ["a", "b"], retry_s=0, pause_s=0)


def test_a_topic_id_not_answered_in_time_is_asked_again_not_a_crash():
    """Found by the soak: the answer was waited for as long as the request's own timeout, the
    wait ran out first (concurrent.futures' TimeoutError) and stopped the sink at its start."""
    cluster = Cluster({"a": [None, "id-a"], "b": ["id-b"]})
    assert topic_ids(cluster, ["a", "b"], timeout=0.01, pause_s=0, grace_s=0.01) == {"a": "id-a", "b": "id-b"}
    assert cluster.asked == [["a", "b"], ["a"]]
    with pytest.raises(TopicIdUnknown, match=r"did not say the id of a in 0 s \(no answer in 0.02 s\)"):
        topic_ids(Cluster({"a": [None]}), ["a"], timeout=0.01, retry_s=0, pause_s=0, grace_s=0.01)


def test_a_topic_the_cluster_refuses_to_describe_is_stored_without_an_id_and_not_asked_again():
    cluster = Cluster({"a": [KafkaError.TOPIC_AUTHORIZATION_FAILED], "b": ["id-b"]})
    assert topic_ids(cluster, ["a", "b"], pause_s=0) == {"b": "id-b"}
    assert cluster.asked == [["a", "b"]]


def test_rows_stored_without_a_topic_id_are_told_as_such_and_not_resumed_after():
    seek, warnings = resume_plan([(T, 0)], {T: "id-1"}, {Position(T, "", 0): 50}, {(T, 0): 40}, {(T, 0): 60})
    assert seek == {}
    (warning,) = warnings
    assert "stored without its id" in warning and "id-1" in warning and "created again" not in warning
