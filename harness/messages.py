"""The message protocol between a worker and the harness that supervises it.

A worker writes one JSON object per line on its events pipe (the writer is
:class:`killpoint.chaos.points.Failpoints`); the harness answers on the control pipe with one byte,
:data:`RESUME`, when a worker that waits (``pause``, ``terminate``) may go on. The messages:

- ``{"hit": i}`` -- the worker passed the point of scheduled fault ``i`` (counted across
  incarnations, so a restarted worker knows its fault's ``hit`` count);
- ``{"fired": i, "action": A, "point": P, "instance": I, "step": S}`` -- fault ``i`` fired action A;
- ``{"paused": i, "instance": I, "step": S, "until": M}`` -- the worker waits for :data:`RESUME`
  and may be stopped (SIGSTOP) meanwhile; ``M`` is the resume moment its schedule named (None: when
  its step moved on);
- ``{"at": P, "instance": I, "step": S, "wait": W}`` -- the worker is at point P, a resume moment of
  the schedule (or any point, once it came back from a pause); with ``W`` it waits for
  :data:`RESUME` before it goes on;
- ``{"terminate": i, "point": P, "instance": I, "step": S, "backend_pids": [...], ...}`` -- the
  worker waits while the harness ends its database sessions;
- ``{"raised": SIGNATURE, "error": "Type: message"}`` -- the target raised an exception nobody
  injected (written by :func:`killpoint.harness.hooks.worker_body`); the worker then exits 1.

This module decodes the stream and keeps the tally of faults; what the harness does on each message
is :class:`killpoint.harness.supervise.Supervisor`'s business (it implements :class:`Handler`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Protocol

from killpoint import vocab

RESUME = b"r"  # the byte that lets a waiting worker go on

__all__ = ["RESUME", "FaultTally", "Handler", "Inbox", "dispatch"]


@dataclass
class Inbox:
    """The read end of one worker's events pipe, with the partial line not yet complete."""

    fd: int
    buf: bytes = b""

    def read(self) -> list[dict[str, Any]]:
        """The complete messages readable now (none at end of stream or on a closed pipe)."""
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            return []
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        return [json.loads(line) for line in lines if line]


@dataclass
class FaultTally:
    """What the messages of every worker of a run tell about its scheduled faults, by index."""

    hits: dict[int, int] = field(default_factory=dict)  # passes of the fault's point, all incarnations
    fired: dict[int, int] = field(default_factory=dict)  # times an action fired
    spent: set[int] = field(default_factory=set)  # faults whose action ended their worker for good

    def hit(self, index: int) -> None:
        self.hits[index] = self.hits.get(index, 0) + 1

    def fire(self, index: int, action: str) -> None:
        self.fired[index] = self.fired.get(index, 0) + 1
        if action in ("kill", "hang"):
            self.spent.add(index)  # its worker is gone for good: a restart does not inherit it


class Handler(Protocol):
    """What the harness does on each message of a worker (``w`` is the harness's handle on it)."""

    def on_hit(self, w: Any, index: int) -> None: ...

    def on_fired(self, w: Any, index: int, action: str) -> None: ...

    def on_paused(self, w: Any, index: int, instance: str | None, step: str | None,
                  until: str | None) -> None: ...

    def on_at(self, w: Any, point: str, instance: str | None, step: str | None, wait: bool) -> None: ...

    def on_terminate(self, w: Any, msg: dict[str, Any]) -> None: ...

    def on_raised(self, w: Any, signature: str, error: str) -> None: ...


def dispatch(handler: Handler, w: Any, msg: dict[str, Any]) -> None:
    """Call the handler's method for one message."""
    if "hit" in msg:
        handler.on_hit(w, msg["hit"])
    elif "fired" in msg:
        handler.on_fired(w, msg["fired"], msg["action"])
    elif "paused" in msg:
        handler.on_paused(w, msg["paused"], msg.get("instance"), msg.get("step"), msg.get("until"))
    elif "at" in msg:
        handler.on_at(w, msg["at"], msg.get("instance"), msg.get("step"), bool(msg.get("wait")))
    elif "terminate" in msg:
        handler.on_terminate(w, msg)
    elif vocab.RAISED in msg:
        handler.on_raised(w, msg[vocab.RAISED], msg.get("error") or "an exception")
