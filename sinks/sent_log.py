"""What the notifier has sent: keys in a small append-only file, written (and synced) before the
offsets of what led to them are committed, so that a restarted notifier, a replay, or its
periodic reports send nothing twice."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path


class SentLog:
    """Keys of messages already sent, in an append-only file (the newest ``keep`` are kept)."""

    def __init__(self, path: Path, keep: int = 100_000) -> None:
        self.path, self.keep = Path(path), keep
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._keys: OrderedDict[str, None] = OrderedDict()
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                self._keys[line] = None
        self._file = self.path.open("a")
        self._lock = threading.Lock()  # the notifier's loop and its periodic reports add to it

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def starting(self, prefix: str) -> list[str]:
        with self._lock:
            return [k for k in self._keys if k.startswith(prefix)]

    def add(self, key: str) -> None:
        with self._lock:
            self._keys[key] = None
            self._file.write(key + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())
            if len(self._keys) > 2 * self.keep:
                self._compact()

    def _compact(self) -> None:
        while len(self._keys) > self.keep:
            self._keys.popitem(last=False)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(k + "\n" for k in self._keys))
        self._file.close()
        os.replace(tmp, self.path)
        self._file = self.path.open("a")

    def close(self) -> None:
        self._file.close()
