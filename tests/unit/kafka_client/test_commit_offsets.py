"""Commits after the work is done go through a rebalance or a coordinator that moved."""

import pytest
from confluent_kafka import KafkaError, KafkaException

from kafka_client.commit_offsets import Committer


class Message:
    def __init__(self, topic, partition, offset):
        self._t, self._p, self._o = topic, partition, offset

    def topic(self):
        return self._t

    def partition(self):
        return self._p

    def offset(self):
        return self._o


class Consumer:
    """The confluent-kafka boundary: commits fail with the errors given, then succeed."""

    def __init__(self, *errors):
        self.errors = list(errors)
        self.committed = []

    def commit(self, offsets, asynchronous):
        assert asynchronous is False
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        self.committed.append(sorted((tp.topic, tp.partition, tp.offset) for tp in offsets))


def test_the_offsets_after_the_batch_are_committed_after_a_coordinator_moved():
    consumer = Consumer(KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
    assert Committer(consumer, backoff_s=0).commit([Message("a", 0, 5), Message("a", 0, 7), Message("a", 1, 2)])
    assert consumer.committed == [[("a", 0, 8), ("a", 1, 3)]]


def test_offsets_not_committed_go_with_the_next_batch():
    consumer = Consumer(*[KafkaError.NOT_COORDINATOR] * 3)
    committer = Committer(consumer, attempts=3, backoff_s=0)
    assert committer.commit([Message("a", 0, 5)]) is False
    assert committer.commit([Message("a", 1, 9)]) is True
    assert consumer.committed == [[("a", 0, 6), ("a", 1, 10)]]


def test_partitions_that_moved_are_not_an_error():
    consumer = Consumer(KafkaError.ILLEGAL_GENERATION)
    committer = Committer(consumer, backoff_s=0)
    assert committer.commit([Message("a", 0, 5)]) is False
    assert committer.commit([Message("a", 0, 6)]) is True
    assert consumer.committed == [[("a", 0, 7)]]  # what moved is not committed again


def test_other_errors_are_raised():
    with pytest.raises(KafkaException):
        Committer(Consumer(KafkaError.TOPIC_AUTHORIZATION_FAILED), backoff_s=0).commit([Message("a", 0, 1)])


def test_what_a_moved_leader_refuses_is_asked_again_and_other_errors_are_not():
    from confluent_kafka import KafkaError, KafkaException

    from sinks.resume_offsets import retried

    answers = [KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError._TRANSPORT, 42]

    def call():
        answer = answers.pop(0)
        if isinstance(answer, int) and answer != 42:
            raise KafkaException(KafkaError(answer))
        return answer

    assert retried(call, "the end of a partition") == 42 and answers == []

    def refused():
        raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))

    with pytest.raises(KafkaException):
        retried(refused, "the end of a partition")
