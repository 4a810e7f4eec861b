"""A PyTorch profiler (Kineto) trace file as blocks of typed events: what ``read_trace`` reads.

Streams the JSON (``.json`` or ``.json.gz``, gzip through zlib-ng) in blocks instead of loading
the document. Kineto pretty-prints each event as a block of lines: such files are split on
those lines and each block parsed with msgspec into ``Event`` structs holding only the
fields the analysis reads; any other layout goes through ijson. JSON that is not a trace (not
an object with a ``traceEvents`` list) is a ``TraceError``; damage part-way (a file cut short,
invalid JSON) is a ``TraceDamaged`` raised where it is met, after the events before it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Annotated, Any, Self

import msgspec
from zlib_ng import zlib_ng


class TraceError(ValueError):
    """A trace file that cannot be read at all (missing, not JSON, no traceEvents)."""


def open_trace(path: str | Path) -> IO[bytes]:
    path = Path(path)
    if not path.exists():
        raise TraceError(f"no trace file at {path}")
    with path.open("rb") as probe:
        gz = probe.read(2) == b"\x1f\x8b"
    return _Gunzip(path) if gz else path.open("rb")


class _Gunzip:
    """A gzip file read through zlib-ng's decompressor (3-4x the standard zlib's speed), in
    ``read(n)`` steps, members one after another as ``gzip.open`` reads them. Not zlib-ng's
    ``gzip_ng.open``: importing it (argparse, shutil, bz2, lzma) takes longer than reading
    a small trace. Raises ``EOFError`` for a file cut short, ``TraceDamaged`` for corrupt data."""

    CHUNK = 1 << 16

    def __init__(self, path: Path) -> None:
        self._raw = path.open("rb")
        self._inflate = zlib_ng.decompressobj(wbits=31)  # 31: a gzip header and trailer
        self._pending = b""  # compressed input not yet given to the decompressor

    def read(self, n: int = -1) -> bytes:
        """At most ``n`` bytes (all that is left when ``n`` < 0); b"" at the end."""
        if n < 0:
            return b"".join(iter(lambda: self.read(self.CHUNK), b""))
        if n == 0:
            return b""
        while True:
            d = self._inflate
            if d.eof:  # one member done: another may follow (zero padding is skipped, as gzip does)
                rest = (d.unused_data + self._pending).lstrip(b"\0")
                self._pending = b""
                while not rest:
                    chunk = self._raw.read(self.CHUNK)
                    if not chunk:
                        return b""
                    rest = chunk.lstrip(b"\0")
                if rest[:2] != b"\x1f\x8b":
                    raise TraceDamaged("data after the end of the gzip stream")
                self._inflate = d = zlib_ng.decompressobj(wbits=31)
                self._pending = rest
            data = d.unconsumed_tail or self._pending or self._raw.read(self.CHUNK)
            self._pending = b""
            if not data:
                raise EOFError("Compressed file ended before the end-of-stream marker was reached")
            try:
                out = d.decompress(data, n)
            except zlib_ng.error as exc:
                raise TraceDamaged(f"corrupt gzip data: {exc}") from exc
            if out:
                return out

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def metadata(head: bytes, path: Path) -> dict[str, Any]:
    """Top-level entries before ``traceEvents`` (Kineto writes its metadata first), from the
    file's first bytes ``head``. Kineto's metadata is a few kB at the top: what precedes the
    traceEvents key, closed with a brace, is the metadata object. Anything else is streamed
    with ijson."""
    anchor = head.find(b'"traceEvents"')
    if anchor > 0:
        try:
            meta = any_decoder.decode(head[:anchor].rstrip(b" \t\r\n").rstrip(b",") + b"}")
        except msgspec.DecodeError:
            meta = None
        if type(meta) is dict:
            return meta
    return __metadata_streamed(path)


def __metadata_streamed(path: Path) -> dict[str, Any]:
    import ijson  # only for traces not in Kineto's layout: a few ms less start-up for the others

    meta: dict[str, Any] = {}
    with open_trace(path) as fh:
        builder: ijson.ObjectBuilder | None = None
        key = None
        try:
            for prefix, event, value in ijson.parse(fh, use_float=True):
                if prefix == "" and event == "map_key":
                    if value == "traceEvents":
                        break
                    key, builder = value, ijson.ObjectBuilder()
                elif builder is not None and key is not None:
                    builder.event(event, value)
                    if prefix == key and event in ("end_map", "end_array", "string", "number", "boolean", "null"):
                        meta[key] = builder.value
                        key, builder = None, None
        except (ijson.JSONError, UnicodeDecodeError, EOFError, OSError) as exc:
            said = (str(exc).strip().splitlines() or [type(exc).__name__])[0]  # ijson's own pointer art dropped
            raise TraceError(f"{path} is not a readable JSON trace: {said}") from exc
    return meta


def to_int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # not a number, or inf
        return default


class TraceDamaged(ValueError):
    """The trace stops making sense part-way (truncated or corrupt)."""


class Args(msgspec.Struct, gc=False):
    """The part of an event's ``args`` the analysis reads; the rest (shapes, call stacks) is
    skipped by the parser without building it."""

    stream: Any = -1  # the defaults of HTA's reading: -1 when absent
    correlation: Any = -1
    device: Any = -1
    bytes: Any = -1
    device_type: Any = msgspec.field(default=None, name="Device Type")  # [memory] events
    device_id: Any = msgspec.field(default=None, name="Device Id")
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    alloc_bytes: Any = msgspec.field(default=None, name="Bytes")
    flops: Any = None  # CPU operators, where the profiler ran with_flops=True
    input_type: Any = msgspec.field(default=None, name="Input type")  # with record_shapes=True
    bandwidth: Any = msgspec.field(default=None, name="memory bandwidth (GB/s)")  # copies and sets
    # with record_shapes=True: kept unparsed, read only for the operators that count FLOPs
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    # synchronisation on a CUDA event (cuda_sync "Event Sync", "Stream Wait Event"): the stream
    # and the cudaEventRecord call it waits on
    wait_on_stream: Any = None
    wait_on_record: Any = msgspec.field(default=None, name="wait_on_cuda_event_record_corr_id")


# A time in microseconds the analysis can place: a number below 2**53 (285 years) either way.
_Time = Annotated[int, msgspec.Meta(gt=-(2**53), lt=2**53)] | Annotated[float, msgspec.Meta(gt=-(2.0**53), lt=2.0**53)]


class Event(msgspec.Struct, gc=False):
    """One item of ``traceEvents``, the fields the analysis reads. The parser checks the types
    (in C, at no cost to speak of): an event whose time is a string or 1e300, or whose
    category is not a name, is read as an event without them, which the analysis skips."""

    name: Any = ""
    cat: str | None = None
    tid: Any = None
    ts: _Time | None = None
    dur: _Time | None = None
    args: Args | None = None




class Unusable(Event, gc=False):
    """An item of ``traceEvents`` the analysis cannot use: not an object, or an event whose
    time, duration or category has the wrong type. ``why`` says which."""

    why: str = ""


_JSON_KIND = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number",
              bool: "a boolean", type(None): "null"}


NO_ARGS = Args()
_block_decoder = msgspec.json.Decoder(list[Event])
any_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


def _typed(items: Iterable[Any]) -> Iterator[Event]:
    """Generic JSON items as Events (an ``Unusable`` for an item that is not an object or whose
    time or category has the wrong type). An ``args`` that is not an object counts as no args."""
    for item in items:
        if type(item) is not dict:
            shown = repr(item) if len(repr(item)) <= 40 else repr(item)[:37] + "..."
            yield Unusable(why=f"{shown} is {_JSON_KIND.get(type(item), 'not JSON')}, not an event object")
            continue
        args = item.get("args")
        if type(args) is dict and "Input Dims" in args:  # kept unparsed, as the Kineto reader keeps it
            item = {**item, "args": {**args, "Input Dims": msgspec.Raw(_encoder.encode(args["Input Dims"]))}}
        try:
            yield msgspec.convert(item, Event)
        except msgspec.ValidationError:
            try:
                yield msgspec.convert({k: v for k, v in item.items() if k != "args"}, Event)
            except msgspec.ValidationError as exc:  # a time or category of the wrong type
                name = item.get("name", "")
                shown = repr(name) if len(repr(name)) <= 60 else repr(name)[:57] + "..."
                yield Unusable(name=name, why=f"event {shown}: {_field_error(exc)}")


def _field_error(exc: msgspec.ValidationError) -> str:
    """msgspec's ``Expected `str | null`, got `int` - at `$.cat``` as ``cat: expected ...``."""
    said = str(exc)
    text, _, where = said.partition(" - at `$.")
    if not where:
        return said
    return f"{where.rstrip('`').split('.')[0].split('[')[0]} {text[0].lower()}{text[1:]}".replace("`", "")


_EVENT_START, _EVENT_END = b"\n  {", b"\n  }"
_LAST_EVENT = re.compile(rb"\n  \}[ \t\r\n]*\]")
_CLOSE = re.compile(rb"[, \t\r\n]*\]")


def event_blocks(fh: IO[bytes], head: bytes, path: Path) -> Iterator[Iterable[Event]]:
    """The items of ``traceEvents``, a block at a time (a loop over blocks and then over a
    block's list costs less than resuming a generator per event). Kineto pretty-prints each
    event as a block from a line ``  {`` to a line ``  }``: such files are split on those
    lines and parsed with msgspec into ``Event``s, reading only the fields the analysis uses
    (about 2x faster than parsing whole events with orjson, 6x than a streaming parser); any
    other layout goes through ijson, as one block. ``head``: the bytes already read from ``fh``."""
    anchor = head.find(b'"traceEvents"')
    bracket = head.find(b"[", anchor) if anchor >= 0 else -1
    if bracket >= 0 and head[bracket + 1:].lstrip(b" \r\t").startswith(b"\n  {\n"):
        return _kineto_blocks(fh, head[bracket + 1:])
    return iter([_typed(_streamed_items(_HeadFirst(head, fh), path))])


def _streamed_items(fh: _HeadFirst, path: Path) -> Iterator[Any]:
    import ijson

    try:
        yield from ijson.items(_trace_shaped(ijson.parse(fh, use_float=True), path), "traceEvents.item")
    except (ijson.JSONError, UnicodeDecodeError) as exc:  # IncompleteJSONError too; text not UTF-8
        raise TraceDamaged(f"invalid JSON: {exc}") from exc


_JSON_TYPE = {"start_map": "an object", "start_array": "an array", "string": "a string", "number": "a number",
              "boolean": "a boolean", "null": "null"}


def _trace_shaped(events: Iterator[tuple[str, str, Any]], path: Path) -> Iterator[tuple[str, str, Any]]:
    """ijson's parse events of a document that has the shape of a trace: an object whose
    ``traceEvents`` is a list. Other JSON raises TraceError: read as a trace, it would be an
    empty one, and its analysis would report nothing wrong with a file that holds no trace."""
    for prefix, event, value in events:
        yield prefix, event, value
        if prefix == "" and event != "map_key" and event != "end_map":
            if event != "start_map":
                raise TraceError(f"{path} is not a trace: the top level is {_JSON_TYPE[event]}, where a "
                                 "PyTorch profiler trace is an object with a traceEvents list")
        elif prefix == "traceEvents" and event != "end_array":
            if event != "start_array":
                raise TraceError(f"{path} is not a trace: traceEvents is {_JSON_TYPE[event]}, "
                                 "where a PyTorch profiler trace has a list of events")
            yield from events  # the rest, unchecked
            return
    raise TraceError(f"{path} is not a trace: it has no traceEvents list")


def _kineto_blocks(fh: IO[bytes], head: bytes, block: int = 1 << 16) -> Iterator[Iterable[Event]]:
    """Events of a Kineto layout, a block of the file at a time: the complete events of each
    block are parsed in one call, as a JSON array framed in place (no copy of the block: the
    blank before the first event's brace becomes ``[`` and the byte after the last one's,
    a separator, ``]`` for the parse). ``traceEvents`` ends where an event's ``  }`` is
    followed by ``]`` (after it, top-level objects close with ``  }`` lines too); a block
    holding that end does not parse as an array, so the end is searched for only in a block
    that fails to parse (a full scan of every block would cost a tenth of the whole read)."""
    buf = bytearray(head)
    eof = False
    while True:
        if _CLOSE.match(buf):
            return
        first = buf.find(_EVENT_START)
        last = buf.rfind(_EVENT_END)
        if first >= 0 and last > first:
            events = _framed(buf, first + 2, last + 4)
            if events is None:
                m = _LAST_EVENT.search(buf)
                if m is not None and m.start() < first:  # an event's end, but no event began
                    raise TraceDamaged("an event of traceEvents is cut short")
                if m is not None:
                    last = m.start()
                events = _events_of(bytes(buf[first + 1:last + 4]))
            yield events
            del buf[:last + 4]
            continue
        if _LAST_EVENT.search(buf):  # the end of traceEvents after a part of an event
            raise TraceDamaged("an event of traceEvents is cut short")
        if eof:
            raise TraceDamaged("the file ends inside traceEvents")
        chunk = fh.read(block)
        eof = not chunk
        buf += chunk


def _framed(buf: bytearray, start: int, end: int) -> list[Event] | None:
    """The events of ``buf[start:end]`` (from a blank before an event's ``{`` to just after
    the ``}`` of a later one), or None if that is not a list of events."""
    after = buf[end] if end < len(buf) else None
    buf[start] = 0x5B  # [
    if after is None:
        buf.append(0x5D)  # ]
    else:
        buf[end] = 0x5D
    try:
        # (a copy, 64 KiB: the events' unparsed Input Dims refer to what they were parsed from)
        return _block_decoder.decode(bytes(memoryview(buf)[start:end + 1]))
    except msgspec.DecodeError:
        return None
    finally:
        buf[start] = 0x20
        if after is None:
            del buf[end]
        else:
            buf[end] = after


def _events_of(body: bytes) -> Iterator[Event]:
    """Events of a block that did not parse as a list of events: generically if its items
    are not all event objects, else one by one up to the damage."""
    try:
        return _typed(any_decoder.decode(b"[" + body + b"]"))
    except msgspec.DecodeError:
        return _one_by_one(body)


def _one_by_one(body: bytes) -> Iterator[Event]:
    """The events of ``body`` up to the first that does not parse; text between events other
    than commas and blanks (a part of an event whose start is lost) is damage too."""
    pos = 0
    while pos < len(body):
        i = body.find(b"{", pos)
        if i < 0 or body[pos:i].strip(b", \t\r\n"):
            if i < 0 and not body[pos:].strip(b", \t\r\n"):
                return
            raise TraceDamaged("text between events that is not an event")
        j = body.find(_EVENT_END, i)
        end = len(body) if j < 0 else j + 4
        try:
            yield from _typed([any_decoder.decode(body[i:end])])
        except msgspec.DecodeError as exc:
            raise TraceDamaged(f"invalid event: {exc}") from exc
        pos = end


class _HeadFirst:
    """A file object that first returns bytes already read from it."""

    def __init__(self, head: bytes, fh: IO[bytes]) -> None:
        self.head, self.fh = head, fh

    def read(self, n: int = -1) -> bytes:
        if n == 0:  # ijson probes the file with read(0)
            return b""
        if self.head:
            out, self.head = self.head, b""
            return out
        return self.fh.read(n)
