"""Crash points and the failpoint call workers make at them.

A worker marks a point with ``chaos.point("after_call")``. Outside a harness run no failpoints are
installed and the call returns at once. Inside one, the harness installs this process's faults
(from the schedule) right after the fork; a hit that matches a fault runs its action.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from chaos.journal import Journal

if TYPE_CHECKING:
    from chaos.schedule import Fault

# The protocol's points, in order, then the two that are not between protocol steps.
PROTOCOL_POINTS = ("before_claim", "after_claim", "before_call", "after_call",
                   "before_receipt", "after_receipt", "before_commit", "after_commit")
POINTS = frozenset(PROTOCOL_POINTS + ("in_call", "heartbeat"))
ORDERED_POINTS = PROTOCOL_POINTS[:4] + ("in_call",) + PROTOCOL_POINTS[4:] + ("heartbeat",)


@dataclass
class Failpoints:
    """The failpoints of one worker process (installed once, right after the fork)."""

    faults: list[tuple[int, "Fault"]]
    journal: Journal
    seed: int = 0
    to_harness: int | None = None  # pipe write end: messages for the harness
    from_harness: int | None = None  # pipe read end: the harness's "resume"
    hits: dict[int, int] = field(default_factory=dict)  # fault index -> hits so far (all incarnations)
    point_hits: dict[tuple[str, str | None], int] = field(default_factory=dict)
    where: tuple[str | None, str | None] = (None, None)  # (instance, step) being worked on
    # Locks a pause takes before the harness freezes the process, so that no other thread of the
    # worker (the heartbeat) is frozen inside a database transaction, holding a lock every other
    # worker needs. The freeze is meant to model a stale worker, not a wedged database.
    pause_locks: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def _tell(self, **msg: object) -> None:
        if self.to_harness is not None:
            os.write(self.to_harness, (json.dumps(msg) + "\n").encode())

    def hit(self, name: str) -> None:
        instance, step = self.where
        n = self.point_hits[(name, step)] = self.point_hits.get((name, step), 0) + 1
        action = None
        for index, fault in self.faults:
            if not fault.matches(name, step):
                continue
            count = self.hits[index] = self.hits.get(index, 0) + 1
            self._tell(hit=index)
            nth = count - (fault.hit - 1)
            term = fault.actions.term_for(nth) if nth >= 1 else None
            if term is None or term.action == "off":
                continue
            if term.probability is not None and self._rng.random() * 100 >= term.probability:
                continue
            action = str(term)
            self.journal.write("point", point=name, instance=instance, step=step, hit=n,
                               action=term.action, fault=index)
            self._tell(fired=index, action=term.action, point=name, instance=instance, step=step)
            self._run(term.action, term.arg, index)
            return
        self.journal.write("point", point=name, instance=instance, step=step, hit=n, action=action)

    def _run(self, action: str, arg: int | None, index: int) -> None:
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)  # never reached: SIGKILL cannot be caught
        elif action == "sleep":
            time.sleep((arg or 0) / 1000)
        elif action == "hang":
            # The business thread blocks for good; the heartbeat thread goes on.
            threading.Event().wait()
        elif action == "pause":
            # The harness stops the whole process (SIGSTOP) and later resumes it (SIGCONT and a byte
            # on the pipe) or kills it; without a harness there is nobody to resume us.
            instance, step = self.where
            for lock in self.pause_locks:
                lock.acquire()
            try:
                self._tell(paused=index, instance=instance, step=step)
                if self.from_harness is not None:
                    os.read(self.from_harness, 1)
            finally:
                for lock in reversed(self.pause_locks):
                    lock.release()


_installed: Failpoints | None = None


def installed() -> Failpoints | None:
    """This process's failpoints, if a harness installed them."""
    return _installed


def install(failpoints: Failpoints | None) -> None:
    """Install this process's failpoints (the harness does it once per worker process)."""
    global _installed
    _installed = failpoints


def point(name: str) -> None:
    """Mark crash point ``name``; what happens here comes from the schedule. Costs next to nothing
    when no failpoint is installed."""
    fp = _installed
    if fp is not None:
        fp.hit(name)


@contextlib.contextmanager
def at(instance: str | None, step: str | None) -> Iterator[None]:
    """Tell the failpoints which step the points that follow belong to."""
    fp = _installed
    if fp is None:
        yield
        return
    previous = fp.where
    fp.where = (instance, step)
    try:
        yield
    finally:
        fp.where = previous
