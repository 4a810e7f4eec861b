"""The forwarder's sends every few seconds, with each host's and workflow's sample blocks
merged into one message, in order, and everything else passed on as it was."""

from producers.agent.spool.disk import Spool
from producers.agent.spool.forward import Forwarder, SampleCoalescer
from schemas.codec import Codec
from schemas.sample_columns import columns_of
from schemas.topics import GPU_SAMPLES
from tests.support.samples import sample

CODEC = Codec()
TOPIC = "x." + GPU_SAMPLES.name


def batch_of(tick: int, host: str = "h1", workflow: str = "wf-a", gpus: int = 2) -> bytes:
    samples = [
        sample(workflow_id=workflow, host=host, gpu_uuid=f"{host}-GPU-{g}", event_time=1_767_225_600_000 + tick * 1000)
        for g in range(gpus)
    ]
    (block,) = columns_of(samples)
    return CODEC.encode("GpuSampleColumns", block)


class Produced:
    def __init__(self):
        self.messages = []

    def __call__(self, topic, value, key):
        self.messages.append((topic, key, value))


def test_each_hosts_batches_of_a_workflow_become_one_message_in_order():
    c, out = SampleCoalescer(CODEC), Produced()
    for tick in range(5):
        c.add(TOPIC, batch_of(tick, "h1"), b"wf-a")
        c.add(TOPIC, batch_of(tick, "h2"), b"wf-a")
        c.add("x.gpufleet.host-samples.v1", b"host sample %d" % tick, b"h1")  # other topics: as they are
    assert c.flush(out) == 2 + 5
    # The merged batches go where their first parts were: before the host samples of tick 0.
    assert [t for t, _, _ in out.messages] == [TOPIC, TOPIC] + ["x.gpufleet.host-samples.v1"] * 5
    batches = [(k, CODEC.decode(v)[1]) for t, k, v in out.messages if t == TOPIC]
    assert [(k, b["host"], len(b["event_time"])) for k, b in batches] == [(b"wf-a", "h1", 10), (b"wf-a", "h2", 10)]
    h1 = batches[0][1]
    assert h1["event_time"][::2] == [1_767_225_600_000 + t * 1000 for t in range(5)]
    assert h1["gpu_uuid"] == ["h1-GPU-0", "h1-GPU-1"] * 5
    assert [v for t, k, v in out.messages if t != TOPIC] == [b"host sample %d" % t for t in range(5)]
    assert c.flush(out) == 0  # nothing left behind


def test_a_record_of_the_same_key_in_between_keeps_its_place():
    c, out = SampleCoalescer(CODEC), Produced()
    c.add(TOPIC, batch_of(0), b"wf-a")
    single = CODEC.encode("GpuSample", {**sample(workflow_id="wf-a", event_time=1_767_225_601_000)})
    c.add(TOPIC, single, b"wf-a")  # an old agent's one-sample message
    c.add(TOPIC, batch_of(2), b"wf-a")
    c.add(TOPIC, b"\x00garbage", b"wf-a")  # undecodable: passed on for the worker to dead-letter
    c.flush(out)
    times = []
    for _, _, value in out.messages[:3]:
        name, record = CODEC.decode(value)
        times += record["event_time"] if name == "GpuSampleColumns" else [record["event_time"]]
    assert times == sorted(times) and len(out.messages) == 4 and out.messages[3][2] == b"\x00garbage"


def test_a_backlog_is_split_into_messages_the_broker_takes():
    c, out = SampleCoalescer(CODEC, max_samples=6), Produced()
    for tick in range(10):
        c.add(TOPIC, batch_of(tick, gpus=2), b"wf-a")
    assert c.flush(out) == 4  # 20 samples, at most 6 a message
    assert [len(CODEC.decode(v)[1]["event_time"]) for _, _, v in out.messages] == [6, 6, 6, 2]


class FakeProducer:
    def __init__(self):
        self.produced = Produced()

    def produce(self, topic, value=None, key=None):
        self.produced(topic, value, key)

    def poll(self, timeout=None):
        return 0

    def __len__(self):
        return 0  # every message confirmed at once


def test_the_forwarder_sends_every_few_seconds_and_drains_at_once(tmp_path):
    spool = Spool(tmp_path)
    t = [100.0]
    f = Forwarder(spool, "127.0.0.1:1", send_every_s=5.0, clock=lambda: t[0])
    f.producer = FakeProducer()
    spool.append(TOPIC, b"wf-a", batch_of(0))
    assert f.step() == 1  # the first goes at once
    for tick in range(1, 5):
        t[0] += 1.0
        spool.append(TOPIC, b"wf-a", batch_of(tick))
        assert f.step() == 0  # acknowledges the first, then waits for its time
    t[0] += 1.0
    assert f.step() == 4 and len(f.producer.produced.messages) == 2  # four ticks in one message
    assert f.sent == 5 and f.messages == 2
    spool.append(TOPIC, b"wf-a", batch_of(5))
    assert f.drain(5) and len(f.producer.produced.messages) == 3 and spool.pending() == 0


def test_a_record_the_client_refuses_at_once_is_skipped_and_the_rest_goes_on(tmp_path):
    """librdkafka refuses some records in produce() itself (a topic the broker says does not
    exist): logged, counted and skipped like a record the broker refuses for good, instead of
    ending the forwarder's thread with everything after it left in the spool."""
    from confluent_kafka import KafkaError, KafkaException

    class Refusing(FakeProducer):
        def produce(self, topic, value=None, key=None):
            if topic == "missing-topic":
                raise KafkaException(KafkaError(KafkaError._UNKNOWN_TOPIC, "Unable to produce message"))
            super().produce(topic, value, key)

    spool = Spool(tmp_path)
    f = Forwarder(spool, "127.0.0.1:1", send_every_s=5.0)
    f.producer = Refusing()
    spool.append(TOPIC, b"wf-a", batch_of(0))
    spool.append("missing-topic", b"h1", b"host sample")
    spool.append("x.gpufleet.host-samples.v1", b"h1", b"host sample")
    assert f.drain(5) and spool.pending() == 0
    assert [t for t, _, _ in f.producer.produced.messages] == [TOPIC, "x.gpufleet.host-samples.v1"]
    assert f.failed == 1
