"""What the trace agent publishes for a trace with items it cannot use (each record encoded
with its topic's schema, as the Kafka publisher does)."""

from producers.traces.publish import publish_trace
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
    assert kinds == ["KernelEventColumns", "DeadLetter", "TraceEnd"] and end["events"] == 2
    columns = publisher.sent[0][2]
    assert [columns["strings"][i] for i in columns["name"]] == ["cudaLaunchKernel", "gemm"]
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


def test_a_traces_events_travel_as_columns_that_give_them_back_in_order(tmp_path):
    """The columns of every message, in seq order, are the trace's events as read; each message
    holds at most EVENTS_PER_MESSAGE events."""
    from producers.traces.publish import EVENTS_PER_MESSAGE
    from producers.traces.read import read_trace
    from streams.traces.batch import EventBatch, columns_error
    from tests.support.overlapping_copies import overlapping_copies_trace

    path = overlapping_copies_trace(tmp_path / "t.json")  # copies (bytes, bandwidth, file order) among kernels
    publisher = RecordingPublisher()
    end = publish_trace(path, "wf", publisher)
    messages = [r for _, name, r in publisher.sent if name == "KernelEventColumns"]
    expected = list(read_trace(path).events)
    assert len(messages) == -(-len(expected) // EVENTS_PER_MESSAGE) > 1 and end["events"] == len(expected)
    assert [m["first_seq"] for m in messages] == list(range(0, len(expected), EVENTS_PER_MESSAGE))
    assert all(columns_error(m) is None for m in messages)
    got = [e for m in messages for e in EventBatch.of_columns(m).rows()]
    fields = ("kind", "cat", "name", "ts", "dur", "end", "stream", "device", "correlation", "tid", "bytes",
              "bandwidth_gbps", "trace_order")
    assert [[e.get(f) for f in fields] for e in got] == [[e.get(f) for f in fields] for e in expected]


def test_a_message_of_long_distinct_names_holds_fewer_events(tmp_path, monkeypatch):
    """Kernel names of kilobytes each, all different: the messages stay within the string budget
    and together carry every event, seq following seq."""
    from producers.traces import publish

    monkeypatch.setattr(publish, "STRING_BYTES_PER_MESSAGE", 10_000)
    events = [kernel(f"k{i}_" + "x" * 3000, 10 * i, 5) for i in range(10)]
    publisher = RecordingPublisher()
    publish_trace(write_trace(tmp_path / "t.json", events), "wf", publisher)
    messages = [r for _, name, r in publisher.sent if name == "KernelEventColumns"]
    assert [len(m["ts"]) for m in messages] == [3, 3, 3, 1]
    assert all(sum(len(s) for s in m["strings"]) <= 10_000 for m in messages)
    assert [m["first_seq"] for m in messages] == [0, 3, 6, 9]
