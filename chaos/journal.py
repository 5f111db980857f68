"""A worker's journal: crash-safe, append-only JSON lines, one ``write`` per entry.

Every entry is written with a single ``os.write`` on an ``O_APPEND`` descriptor, so a SIGKILL loses
nothing that was already journaled and can tear at most the last line (which readers tolerate).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from typing import Any

# One encoder for every entry (``json.dumps`` with ``default`` makes a new one each call).
_encode = json.JSONEncoder(default=str).encode


class Journal:
    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._ops = itertools.count(1)

    def write(self, kind: str, type: str = "event", **data: Any) -> None:
        entry = {"t": time.monotonic_ns(), "kind": kind, "type": type, **data}
        os.write(self._fd, (_encode(entry) + "\n").encode())

    def invoke(self, kind: str, **data: Any) -> int:
        """Journal the start of an operation; finish it with :meth:`complete` and the returned id."""
        op = next(self._ops)
        self.write(kind, "invoke", op=op, **data)
        return op

    def complete(self, op: int, kind: str, type: str, **data: Any) -> None:
        """``type`` is ``ok`` (took effect), ``fail`` (certainly did not) or ``info`` (unknown)."""
        self.write(kind, type, op=op, **data)

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass


class NullJournal(Journal):
    """A journal that records nothing, for code run outside a harness."""

    def __init__(self) -> None:
        self.path = os.devnull
        self._ops = itertools.count(1)

    def write(self, kind: str, type: str = "event", **data: Any) -> None:
        return None

    def close(self) -> None:
        return None
