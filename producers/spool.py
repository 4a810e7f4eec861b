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
from dataclasses import dataclass
from pathlib import Path

_HEADER = struct.Struct(">HHI")  # topic length, key length (0xFFFF: null), value length
_NULL_KEY = 0xFFFF


@dataclass(frozen=True, order=True)
class Position:
    segment: int
    offset: int


@dataclass(frozen=True)
class SpooledRecord:
    position: Position  # where the next record starts
    topic: str
    key: bytes | None
    value: bytes


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
        self._cursor = self._read_cursor() or Position(segments[0] if segments else 1, 0)
        self._unsent = sum(self._unsent_in(seg) for seg in self._segments())

    # -- writing ---------------------------------------------------------------------------------
    def append(self, topic: str, key: bytes | None, value: bytes) -> None:
        t = topic.encode()
        frame = _HEADER.pack(len(t), _NULL_KEY if key is None else len(key), len(value)) + t + (key or b"") + value
        with self._lock:
            if self._tail_file.tell() + len(frame) > self.segment_bytes and self._tail_file.tell() > 0:
                self._roll()
            self._tail_file.write(frame)
            self._tail_file.flush()
            self._unsent += 1
            self.appended += 1
            self._enforce_limit()

    def _roll(self) -> None:
        self._tail_file.close()
        self._tail += 1
        self._tail_file = open(self._path(self._tail), "ab")  # noqa: SIM115

    def _enforce_limit(self) -> None:
        while self._size() > self.max_bytes:
            oldest = self._segments()[0]
            if oldest == self._tail:
                return
            unsent = self._unsent_in(oldest)
            self.dropped += unsent
            self._unsent -= unsent
            self._path(oldest).unlink()
            if self._cursor.segment <= oldest:
                self._cursor = Position(oldest + 1, 0)
                self._write_cursor()

    # -- reading ---------------------------------------------------------------------------------
    def read(self, start: Position, limit: int = 1000) -> list[SpooledRecord]:
        """Up to ``limit`` records from ``start`` (a position from :meth:`cursor` or a record)."""
        out: list[SpooledRecord] = []
        with self._lock:
            self._tail_file.flush()
            segments = [s for s in self._segments() if s >= start.segment]
        for seg in segments:
            offset = start.offset if seg == start.segment else 0
            try:
                with open(self._path(seg), "rb") as f:
                    f.seek(offset)
                    for record in self._frames(f, seg):
                        out.append(record)
                        if len(out) >= limit:
                            return out
            except FileNotFoundError:
                continue  # dropped meanwhile
        return out

    def _frames(self, f, seg: int) -> Iterator[SpooledRecord]:
        while True:
            head = f.read(_HEADER.size)
            if len(head) < _HEADER.size:
                return
            tl, kl, vl = _HEADER.unpack(head)
            body = f.read(tl + (0 if kl == _NULL_KEY else kl) + vl)
            if len(body) < tl + (0 if kl == _NULL_KEY else kl) + vl:
                return  # a frame still being written
            topic = body[:tl].decode()
            key = None if kl == _NULL_KEY else body[tl:tl + kl]
            value = body[tl + (0 if kl == _NULL_KEY else kl):]
            yield SpooledRecord(Position(seg, f.tell()), topic, key, value)

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
                    self._path(seg).unlink(missing_ok=True)

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

    def _size(self) -> int:
        return sum(self._path(s).stat().st_size for s in self._segments())

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
