"""A bounded on-disk spool of encoded Kafka records: the agent writes every record here first,
and a forwarder sends them on in order, so nothing is lost while the broker is unreachable.

Append-only segment files of length-prefixed records and a cursor file that says how far the
broker has acknowledged. When the spool would exceed ``max_bytes``, whole segments are
dropped from the oldest end, sent or not; what was dropped unsent is counted.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

_HEADER = struct.Struct(">HHI")  # topic length, key length (0xFFFF: null), value length
_NULL_KEY = 0xFFFF


class Position(NamedTuple):
    segment: int
    offset: int


class SpooledRecord(NamedTuple):
    position: Position  # where the next record starts
    topic: str
    key: bytes | None
    value: bytes


def _parse(data: bytes, seg: int, base: int, limit: int) -> list[SpooledRecord]:
    """Whole frames of ``data`` (which starts at byte ``base`` of segment ``seg``)."""
    out: list[SpooledRecord] = []
    topics: dict[bytes, str] = {}
    pos, end, unpack, size = 0, len(data), _HEADER.unpack_from, _HEADER.size
    while len(out) < limit and pos + size <= end:
        tl, kl, vl = unpack(data, pos)
        klen = 0 if kl == _NULL_KEY else kl
        stop = pos + size + tl + klen + vl
        if stop > end:
            break  # a frame still being written
        p = pos + size
        raw = data[p:p + tl]
        topic = topics.get(raw)
        if topic is None:
            topic = topics[raw] = raw.decode()
        key = None if kl == _NULL_KEY else data[p + tl:p + tl + klen]
        out.append(SpooledRecord(Position(seg, base + stop), topic, key, data[p + tl + klen:stop]))
        pos = stop
    return out


class Spool:
    def __init__(self, directory: Path, max_bytes: int = 256 << 20, segment_bytes: int = 4 << 20) -> None:
        if max_bytes < 2 * segment_bytes:
            raise ValueError("max_bytes must hold at least two segments")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self.dropped = 0
        self.appended = 0
        segments = self._segments()
        self._tail = segments[-1] if segments else 1
        self._tail_file = open(self._path(self._tail), "ab")  # noqa: SIM115 - held open for appends
        self._tail_size = self._tail_file.tell()
        self._topics: dict[str, bytes] = {}
        self._cursor = self._read_cursor() or Position(segments[0] if segments else 1, 0)
        self._unsent = sum(self._unsent_in(seg) for seg in self._segments())
        self._bytes = sum(self._path(s).stat().st_size for s in self._segments())

    # -- writing ---------------------------------------------------------------------------------
    def append(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Add a record (buffered: :meth:`flush` makes it durable; readers flush first)."""
        t = self._topics.get(topic)
        if t is None:
            t = self._topics[topic] = topic.encode()
        frame = b"".join((_HEADER.pack(len(t), _NULL_KEY if key is None else len(key), len(value)),
                          t, key or b"", value))
        with self._lock:
            if self._tail_size + len(frame) > self.segment_bytes and self._tail_size > 0:
                self._roll()
            self._tail_file.write(frame)
            self._tail_size += len(frame)
            self._bytes += len(frame)
            self._unsent += 1
            self.appended += 1
            if self._bytes > self.max_bytes:
                self._enforce_limit()

    def flush(self) -> None:
        with self._lock:
            self._tail_file.flush()

    def _roll(self) -> None:
        self._tail_file.close()
        self._tail += 1
        self._tail_file = open(self._path(self._tail), "ab")  # noqa: SIM115
        self._tail_size = 0

    def _enforce_limit(self) -> None:
        self._tail_file.flush()
        while self._bytes > self.max_bytes:
            oldest = self._segments()[0]
            if oldest == self._tail:
                return
            unsent = self._unsent_in(oldest)
            self.dropped += unsent
            self._unsent -= unsent
            self._bytes -= self._path(oldest).stat().st_size
            self._path(oldest).unlink()
            if self._cursor.segment <= oldest:
                self._cursor = Position(oldest + 1, 0)
                self._write_cursor()

    # -- reading ---------------------------------------------------------------------------------
    def read(self, start: Position, limit: int = 1000, max_bytes: int = 8 << 20) -> list[SpooledRecord]:
        """Up to ``limit`` records (about ``max_bytes``) from ``start``, a position from
        :meth:`cursor` or a record's."""
        out: list[SpooledRecord] = []
        for seg, offset, data in self._segment_data(start, max_bytes):
            out.extend(_parse(data, seg, offset, limit - len(out)))
            if len(out) >= limit or len(data) == max_bytes:
                break  # more in this segment: the caller reads on from the last record
        return out

    def _segment_data(self, start: Position, max_bytes: int) -> Iterator[tuple[int, int, bytes]]:
        """(segment, offset, up to ``max_bytes`` from there) for each segment from ``start`` on."""
        with self._lock:
            self._tail_file.flush()
            segments = [s for s in self._segments() if s >= start.segment]
        for seg in segments:
            offset = start.offset if seg == start.segment else 0
            try:
                with open(self._path(seg), "rb") as f:
                    f.seek(offset)
                    yield seg, offset, f.read(max_bytes)
            except FileNotFoundError:
                continue  # dropped meanwhile

    def send(self, start: Position, limit: int, produce, max_bytes: int = 8 << 20) -> tuple[Position | None, int]:
        """Call ``produce(topic, value=..., key=...)`` for up to ``limit`` records from ``start``,
        without building record objects (the forwarder's hot path); returns the position after
        the last one and how many."""
        n, last = 0, None
        size, unpack = _HEADER.size, _HEADER.unpack_from
        topics: dict[bytes, str] = {}
        for seg, offset, data in self._segment_data(start, max_bytes):
            pos, end = 0, len(data)
            while n < limit and pos + size <= end:
                tl, kl, vl = unpack(data, pos)
                klen = 0 if kl == _NULL_KEY else kl
                stop = pos + size + tl + klen + vl
                if stop > end:
                    break
                p = pos + size
                raw = data[p:p + tl]
                topic = topics.get(raw) or topics.setdefault(raw, raw.decode())
                produce(
                    topic,
                    value=data[p + tl + klen : stop],
                    key=None if kl == _NULL_KEY else data[p + tl : p + tl + klen],
                )
                n += 1
                pos = stop
            if pos:
                last = Position(seg, offset + pos)
            if n >= limit or end == max_bytes:
                break
        return last, n

    def _frames(self, f, seg: int) -> Iterator[SpooledRecord]:
        offset = f.tell()
        yield from _parse(f.read(), seg, offset, 1 << 62)

    # -- acknowledgement ---------------------------------------------------------------------
    def cursor(self) -> Position:
        with self._lock:
            return self._cursor

    def acknowledge(self, position: Position, records: int) -> None:
        """The ``records`` records before ``position`` reached the broker: never send them again."""
        with self._lock:
            if position <= self._cursor:
                return
            self._cursor = position
            self._unsent = max(0, self._unsent - records)
            self._write_cursor()
            for seg in self._segments():
                if seg < position.segment and seg != self._tail:
                    path = self._path(seg)
                    self._bytes -= path.stat().st_size
                    path.unlink()

    def pending(self) -> int:
        """Records not yet acknowledged."""
        with self._lock:
            return self._unsent

    def close(self) -> None:
        with self._lock:
            self._tail_file.close()

    # -- files -------------------------------------------------------------------------------------
    def _path(self, seg: int) -> Path:
        return self.dir / f"{seg:012d}.seg"

    def _segments(self) -> list[int]:
        return sorted(int(p.stem) for p in self.dir.glob("*.seg"))

    def _unsent_in(self, seg: int) -> int:
        if seg < self._cursor.segment:
            return 0
        count = 0
        with open(self._path(seg), "rb") as f:
            f.seek(self._cursor.offset if seg == self._cursor.segment else 0)
            for _ in self._frames(f, seg):
                count += 1
        return count

    def _read_cursor(self) -> Position | None:
        try:
            raw = json.loads((self.dir / "cursor.json").read_text())
            return Position(raw["segment"], raw["offset"])
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            return None

    def _write_cursor(self) -> None:
        tmp = self.dir / "cursor.json.tmp"
        tmp.write_text(json.dumps({"segment": self._cursor.segment, "offset": self._cursor.offset}))
        os.replace(tmp, self.dir / "cursor.json")
