"""Crash points and the failpoint call workers make at them.

A worker marks a point with ``chaos.point("after_call")``. Outside a harness run no failpoints are
installed and the call returns at once. Inside one, the harness installs this process's faults
(from the schedule) right after the fork; a hit that matches a fault runs its action.

Two points are not the worker's but the PostgreSQL store's, inside each of its write transactions
(``DB_POINTS``): ``before_db_commit`` (the statements are done, COMMIT not sent) and ``in_db_commit``
(COMMIT sent, its answer not read). They are where a lost connection leaves a transaction
certainly rolled back, or committed without the worker knowing.
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
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from killpoint import vocab
from killpoint.chaos.journal import Journal
from killpoint.errors import InvalidConfig

if TYPE_CHECKING:
    from killpoint.chaos.schedule import Fault

# The protocol's points, in order, then the two that are not between protocol steps.
PROTOCOL_POINTS = ("before_claim", "after_claim", "before_call", "after_call",
                   "before_receipt", "after_receipt", "before_commit", "after_commit")
# Inside the PostgreSQL store's write transactions; no other store has them (a schedule that names
# them on another store is refused), so what enumerates points by default leaves them out.
DB_POINTS = ("before_db_commit", "in_db_commit")
POINTS = frozenset(PROTOCOL_POINTS + ("in_call", "heartbeat") + DB_POINTS)
ORDERED_POINTS = PROTOCOL_POINTS[:4] + ("in_call",) + PROTOCOL_POINTS[4:] + ("heartbeat",) + DB_POINTS
# The points every run reaches on any store: what matrix, explore, selftest and the pytest plugin
# enumerate unless asked for others.
DEFAULT_POINTS = tuple(p for p in ORDERED_POINTS if p not in DB_POINTS)


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
    pause_locks: list[threading.Lock] = field(default_factory=list)
    # What the harness needs to end this process's database sessions at a ``terminate`` (the store
    # describes them: their backend PIDs, and which of them has a COMMIT in flight); sent as is.
    backends: Callable[[], Mapping[str, Any]] | None = None
    # The run's clock (``sleep(seconds)``, ``hang()``), so that a ``sleep`` or a ``hang`` is a wait the
    # harness can see and move the run's time past; None: real time.
    clock: Any = None
    # (name, reached) of every killpoint.sometimes this process journaled: each once.
    sometimes_seen: set[tuple[str, bool]] = field(default_factory=set)
    # The points whose hits the harness is told of, and waits on (a resume moment of the schedule:
    # another worker's pause may end there, and this worker is then held at it while that one goes
    # on; see harness.pauses). Empty: no schedule names one, and nothing is told.
    watch: frozenset[str] = frozenset()
    # Resumed after a pause: the harness is told of every hit, to know when its late attempt is over.
    late: bool = False

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def _tell(self, **msg: object) -> None:
        if self.to_harness is not None:
            os.write(self.to_harness, (json.dumps(msg) + "\n").encode())

    def hit(self, name: str) -> str | None:
        """Count a hit of point ``name`` and run the action that applies; return that action (or
        None), for a caller whose own state the action changes (see :func:`point`)."""
        instance, step = self.where
        n = self.point_hits[(name, step)] = self.point_hits.get((name, step), 0) + 1
        action = None
        if name in self.watch or self.late:
            self._at(name, instance, step, wait=name in self.watch)
        # Every matching fault counts this hit before any of them acts: a fault that fires (a kill)
        # ends the loop, and the faults after it would miss the hit. A@charge.after_call:kill with
        # A@charge.after_call#2:kill fired the second at the third hit, not the second.
        matching = [(index, fault) for index, fault in self.faults if fault.matches(name, step)]
        counts: dict[int, int] = {}
        for index, _ in matching:
            counts[index] = self.hits[index] = self.hits.get(index, 0) + 1
            self._tell(hit=index)
        for index, fault in matching:
            count = counts[index]
            nth = count - (fault.hit - 1)
            term = fault.actions.term_for(nth) if nth >= 1 else None
            if term is None or term.action == "off":
                continue
            if term.probability is not None and self._rng.random() * 100 >= term.probability:
                continue
            action = str(term)
            self.journal.write(vocab.POINT, point=name, instance=instance, step=step, hit=n,
                               action=term.action, fault=index)
            self._tell(fired=index, action=term.action, point=name, instance=instance, step=step)
            self._run(term.action, term.arg, index, name, term.until)
            return term.action
        self.journal.write(vocab.POINT, point=name, instance=instance, step=step, hit=n, action=action)
        return None

    def _at(self, name: str, instance: str | None, step: str | None, *, wait: bool) -> None:
        """Tell the harness this worker is at point ``name``; with ``wait``, go on only when it
        answers (at once, unless a frozen worker's pause ends here: then once that one's late
        attempt is over)."""
        self._tell(at=name, instance=instance, step=step, wait=wait)
        if wait and self.to_harness is not None and self.from_harness is not None:
            os.read(self.from_harness, 1)

    def _run(self, action: str, arg: int | None, index: int, name: str, until: str | None = None) -> None:
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)  # never reached: SIGKILL cannot be caught
        elif action == "sleep":
            if self.clock is not None:
                self.clock.sleep((arg or 0) / 1000)
            else:
                time.sleep((arg or 0) / 1000)
        elif action == "hang":
            # The business thread blocks for good; the heartbeat thread goes on.
            if self.clock is not None:
                self.clock.hang()
            threading.Event().wait()
        elif action == "pause":
            # The harness stops the whole process (SIGSTOP) and later resumes it (SIGCONT and a byte
            # on the pipe) or kills it; without a harness there is nobody to resume us.
            instance, step = self.where
            for lock in self.pause_locks:
                lock.acquire()
            try:
                self._tell(paused=index, instance=instance, step=step, until=until)
                if self.from_harness is not None:
                    os.read(self.from_harness, 1)
                    self.late = True
            finally:
                for lock in reversed(self.pause_locks):
                    lock.release()
        elif action == "terminate":
            # The harness ends our database sessions while we wait here, then lets us go on. No
            # SIGSTOP and no pause locks: at a db point this thread holds row locks that the
            # heartbeat thread may be waiting on, and nothing needs to be frozen -- the harness
            # acts on the server, not on us.
            instance, step = self.where
            sessions = dict(self.backends()) if self.backends is not None else {}
            self._tell(terminate=index, point=name, instance=instance, step=step, **sessions)
            if self.from_harness is not None:
                os.read(self.from_harness, 1)


_installed: Failpoints | None = None


def installed() -> Failpoints | None:
    """This process's failpoints, if a harness installed them."""
    return _installed


def install(failpoints: Failpoints | None) -> None:
    """Install this process's failpoints (the harness does it once per worker process)."""
    global _installed
    _installed = failpoints


def point(name: str) -> str | None:
    """Mark crash point ``name``; what happens here comes from the schedule. Costs next to nothing
    when no failpoint is installed.

    Returns the action that ran here (``None`` if none). Only a caller whose own state the action
    changes needs it: the PostgreSQL store learns at ``in_db_commit`` that its connection was cut
    with the COMMIT's answer still in flight.
    """
    fp = _installed
    if fp is not None:
        return fp.hit(name)
    return None


def sometimes(name: str, condition: bool = True) -> None:
    """Declare that what ``name`` says must happen at least once across a matrix (Antithesis's
    "sometimes" assertion), and say whether it happened here: ``condition`` true (the default)
    reaches it. Recorded in the worker's journal, once per name and outcome in a process; outside a
    harness run it costs nothing. An expectation no run of a matrix reached is a failed, named
    expectation (the matrix is unknown, never valid)."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidConfig(f"killpoint.sometimes({name!r}): name the expectation with a non-empty string")
    fp = _installed
    if fp is None:
        return
    reached = bool(condition)
    if (name, reached) in fp.sometimes_seen:
        return
    fp.sometimes_seen.add((name, reached))
    instance, step = fp.where
    fp.journal.write(vocab.SOMETIMES, name=name, reached=reached, instance=instance, step=step)


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
