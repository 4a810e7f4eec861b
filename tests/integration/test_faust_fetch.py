"""What the worker's fetch fix (``streams.faust_fixes``, fix 9) does with the Kafka client faust
runs on, on the real broker: faust hands the client its live set of the partitions it reads, a
rebalance empties it while the client waits for records, and to the client an empty set is every
partition: the records of paused changelog partitions were taken and dropped, and a recovery
waited for them for good."""

from __future__ import annotations

import asyncio
import time
import uuid

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from confluent_kafka import Producer

from kafka_client.admin import create_topics
from kafka_client.config import producer_config
from streams import faust_fixes


async def taken(bootstrap: str, topic: str, wanted) -> tuple[dict, list[int]]:
    """What the client hands over when asked for ``wanted`` once it holds records of both
    partitions of ``topic``, and where it then stands in each."""
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", group_id=None)
    await consumer.start()
    try:
        consumer.assign(tps)
        deadline = time.monotonic() + 30
        while not all(tp in consumer._fetcher._records for tp in tps):  # fetched, not yet taken
            # the client wakes its fetch waiters each time it stores records it fetched
            await asyncio.wait_for(consumer._fetcher._create_fetch_waiter(), max(0.0, deadline - time.monotonic()))
        records = await consumer._fetcher.fetched_records(wanted, timeout=0)
        return records, [await consumer.position(tp) for tp in tps]
    finally:
        await consumer.stop()


def test_the_client_takes_no_record_of_a_paused_partition_once_faust_reads_none(kafka):
    topic = f"t{uuid.uuid4().hex[:10]}.worker-window-history-changelog"
    create_topics(kafka.bootstrap, [(topic, 2, False)])
    producer = Producer(producer_config(kafka.bootstrap))
    for partition in (0, 1):
        for n in range(3):
            producer.produce(topic, partition=partition, key=b"wf", value=f"{n}".encode())
    assert producer.flush(30) == 0

    reading_none: set = set()  # faust's live set, as a rebalance leaves it: every partition paused
    records, positions = asyncio.run(taken(kafka.bootstrap, topic, reading_none))
    assert sum(map(len, records.values())) == 6 and positions == [3, 3]  # faust as it is: taken, past their end

    records, positions = asyncio.run(taken(kafka.bootstrap, topic, faust_fixes._Wanted(reading_none)))
    assert records == {} and positions == [0, 0]  # with the fix: nothing taken, read from the start when resumed
