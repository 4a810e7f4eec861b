"""What the trace agent publishes for a trace with items it cannot use (each record encoded
with its topic's schema, as the Kafka publisher does)."""

from producers.publish_trace import publish_trace
from schemas.codec import Codec
from schemas.topics import DEAD_LETTERS, KERNEL_EVENTS
from tests.support.traces import kernel, runtime, write_trace


class RecordingPublisher:
    def __init__(self) -> None:
        self.codec, self.sent = Codec(), []

    def publish(self, spec, records, topic=None, schema=None) -> int:
        n = 0
        for record in records:
            self.sent.append((spec.name, *self.codec.decode(self.codec.encode(schema or spec.schema, record))))
            n += 1
        return n


def test_skipped_items_are_dead_lettered_with_the_reason_and_the_rest_published(tmp_path):
    events = [runtime("cudaLaunchKernel", 0, 2, corr=1), kernel("gemm", 3, 4, corr=1), "not an event"]
    path = write_trace(tmp_path / "t.json", events)
    publisher = RecordingPublisher()
    end = publish_trace(path, "wf", publisher)
    kinds = [name for _, name, _ in publisher.sent]
    assert kinds == ["KernelEvent", "KernelEvent", "DeadLetter", "TraceEnd"] and end["events"] == 2
    (letter,) = [r for topic, name, r in publisher.sent if topic == DEAD_LETTERS.name]
    assert letter["reason"] == ("trace items skipped: 1 item that is not an event was skipped; the first is "
                                "item 2 of traceEvents: 'not an event' is a string, not an event object")
    assert all(topic == KERNEL_EVENTS.name for topic, name, _ in publisher.sent if name != "DeadLetter")


def test_a_trace_with_nothing_usable_is_dead_lettered_and_ends_empty(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [1, 2]}')
    publisher = RecordingPublisher()
    end = publish_trace(path, "wf", publisher)
    assert [name for _, name, _ in publisher.sent] == ["DeadLetter", "TraceEnd"]
    assert end["events"] == 0 and end["partial"] and "no usable event: 2 items that are not an event" in end["error"]
