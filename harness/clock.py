"""The run clock: database time plus a per-run offset that the harness owns (DESIGN section 11).

Every time of a run -- the store's leases and progress stamps, the workers' waits, the history --
is real time plus one offset. The store adds it in the same statement that reads the database's
clock (a one-row ``clock`` table, so the protocol is unchanged); workers read it from a page of
shared memory. Time flows in real time as ever; with a *virtual* clock the harness also moves the
offset forward when nothing can happen before a deadline: every live, unfrozen worker thread is
waiting on the clock (or hung on purpose by a fault). That is Trio's autojump and FoundationDB's
simulated time, for processes: a 30 s lease expires without anybody waiting 30 s.

For that the harness must know what each worker thread waits for. The shared page has one block per
worker process: a wake counter and a few thread slots, each a state and a deadline::

    FREE       no thread uses the slot
    BUSY       the thread is doing something: time stands still for it
    WAIT       it waits on the clock until ``deadline`` (database time, epoch seconds; inf: forever)
    WAIT_MOVE  the same, but a step moving (a store write another worker reports) also ends the wait
    HUNG       blocked for good by a ``hang`` fault: it never holds time

A thread publishes its slot before it blocks and marks itself busy as soon as it wakes; whoever
wakes a thread (the harness, or another thread of the worker through :class:`ClockEvent`) marks it
busy first, and a thread of the worker that wakes another also bumps the worker's wake counter, so
the harness, reading the counter before and after the slots, never mistakes a moment where the
threads took turns for one where all of them waited. Threads that never wait through the clock
are not tracked (a target that does not use ``ctx.clock`` runs in real time, as before). A worker
stopped by SIGSTOP holds nothing: that is how it goes stale.

Each slot has a wake pipe (the harness holds the write end); a thread that starts to wait writes a
byte on the run's notice pipe so the harness looks at once, and ``moved()`` writes another kind of
byte there so the harness wakes the threads that wait for a move.
"""

from __future__ import annotations

import bisect
import math
import mmap
import os
import select
import struct
import threading
import time
import weakref
from typing import Callable

FREE, BUSY, WAIT, WAIT_MOVE, HUNG = 0, 1, 2, 3, 4
SLOTS = 4  # per worker process: the business thread, the heartbeat, two for the target's own
_HEADER = 8  # offset in nanoseconds
_SLOT = 16  # state (int64), deadline (float64)
_BLOCK = 8 + SLOTS * _SLOT  # wake counter, then the slots
_SLOTS_FORMAT = struct.Struct("qd" * SLOTS)  # a block's slots, read in one go
NOTICE_WAIT = b"w"
NOTICE_MOVED = b"m"
WAKE_TIME = b"t"
WAKE_MOVED = b"m"
WAKE_EVENT = b"e"


class Board:
    """The shared page of one run: the offset and every worker's slots. Made by the harness before it
    forks any worker, so each worker inherits the same memory."""

    def __init__(self, workers: int):
        self.workers = workers
        self.mem = mmap.mmap(-1, _HEADER + workers * _BLOCK)  # anonymous and shared across fork

    def close(self) -> None:
        self.mem.close()

    # -- the offset -------------------------------------------------------------------------------
    @property
    def offset_ns(self) -> int:
        return struct.unpack_from("q", self.mem, 0)[0]

    @offset_ns.setter
    def offset_ns(self, value: int) -> None:
        struct.pack_into("q", self.mem, 0, value)

    # -- slots ------------------------------------------------------------------------------------
    def _at(self, worker: int, slot: int) -> int:
        return _HEADER + worker * _BLOCK + 8 + slot * _SLOT

    def set(self, worker: int, slot: int, state: int, deadline: float = math.inf) -> None:
        at = self._at(worker, slot)
        struct.pack_into("d", self.mem, at + 8, deadline)  # the deadline first: a reader that sees
        struct.pack_into("q", self.mem, at, state)  # the state sees the deadline that goes with it

    def state(self, worker: int, slot: int) -> tuple[int, float]:
        at = self._at(worker, slot)
        state = struct.unpack_from("q", self.mem, at)[0]
        return state, struct.unpack_from("d", self.mem, at + 8)[0]

    def wakes(self, worker: int) -> int:
        return struct.unpack_from("q", self.mem, _HEADER + worker * _BLOCK)[0]

    def bump(self, worker: int) -> None:
        at = _HEADER + worker * _BLOCK
        struct.pack_into("q", self.mem, at, struct.unpack_from("q", self.mem, at)[0] + 1)

    def reset(self, worker: int) -> None:
        """A new worker process: its business thread busy from the start, every other slot free."""
        self.mem[_HEADER + worker * _BLOCK:_HEADER + (worker + 1) * _BLOCK] = bytes(_BLOCK)
        self.set(worker, 0, BUSY)

    def snapshot(self, worker: int) -> list[tuple[int, int, float]] | None:
        """The worker's used slots as (slot, state, deadline), read consistently: None when one of
        its threads woke another meanwhile (read again later)."""
        at = _HEADER + worker * _BLOCK
        before = struct.unpack_from("q", self.mem, at)[0]
        values = _SLOTS_FORMAT.unpack_from(self.mem, at + 8)  # every slot's state and deadline
        if struct.unpack_from("q", self.mem, at)[0] != before:
            return None
        return [(slot, values[2 * slot], values[2 * slot + 1]) for slot in range(SLOTS)
                if values[2 * slot] != FREE]


class Clock:
    """What a target waits through (``ctx.clock``): the run's time, and waits the harness can see.

    ``now()`` is database time (epoch seconds, the scale of ``expires_at``); ``sleep``,
    ``wait_until`` and :class:`ClockEvent` waits let the harness move time forward while every
    thread of every worker waits. Outside a harness run (no board) it is the plain real clock.
    """

    def __init__(self, board: Board | None = None, worker: int = 0,
                 wake_fds: tuple[tuple[int, int], ...] = (), notice_fd: int | None = None, *,
                 virtual: bool = False):
        self._board = board
        self._worker = worker
        self._wake_fds = wake_fds  # per slot: (read end, write end) of its wake pipe
        self._notice_fd = notice_fd
        self.virtual = virtual and board is not None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._used = {0} if board is not None else set()  # slot 0 is the business thread's
        self._main = threading.main_thread()

    # -- reading ----------------------------------------------------------------------------------
    def offset(self) -> float:
        """Seconds the run's time is ahead of real time."""
        return self._board.offset_ns / 1e9 if self._board is not None else 0.0

    def now(self) -> float:
        """The run's time as epoch seconds: what the store's ``{now}`` gives in the same instant."""
        return time.time() + self.offset()

    def monotonic(self) -> float:
        return time.monotonic() + self.offset()

    # -- waiting ----------------------------------------------------------------------------------
    def sleep(self, seconds: float) -> None:
        self.wait_until(self.now() + max(0.0, seconds))

    def wait_until(self, when: float, *, or_moved: bool = False) -> bool:
        """Wait until the run's time reaches ``when`` (epoch seconds). With ``or_moved``, a step
        moved by another worker ends the wait early: returns True then, else False."""
        return self._wait(when, or_moved=or_moved) == "moved"

    def hang(self) -> None:
        """Block this thread for good (a ``hang`` fault): it will never hold the run's time."""
        slot = self._slot()
        if slot is not None and self._board is not None:
            self._board.set(self._worker, slot, HUNG)
            self._notice(NOTICE_WAIT)
        threading.Event().wait()

    def moved(self) -> None:
        """Tell the harness a step moved (a commit, a claim freed...): it wakes the workers that
        wait for a move, instead of their polling."""
        self._notice(NOTICE_MOVED, always=True)

    def event(self) -> "ClockEvent":
        return ClockEvent(self)

    # -- the machinery ------------------------------------------------------------------------------
    def _notice(self, byte: bytes, *, always: bool = False) -> None:
        if self._notice_fd is None or not (self.virtual or always):
            return
        try:
            os.write(self._notice_fd, byte)
        except (BlockingIOError, OSError):
            pass  # the pipe is full of notices the harness has not read yet: it will look anyway

    def _slot(self) -> int | None:
        """This thread's slot, taken on its first wait (None: untracked, no board or no slot left)."""
        slot = getattr(self._local, "slot", -1)
        if slot != -1:
            return slot
        if self._board is None:
            slot = None
        elif threading.current_thread() is self._main:
            slot = 0
        else:
            with self._lock:
                free = [s for s in range(1, SLOTS) if s not in self._used]
                slot = free[0] if free else None
                if slot is not None:
                    self._used.add(slot)
                    self._board.set(self._worker, slot, BUSY)
                    weakref.finalize(threading.current_thread(), self._release, slot)
        self._local.slot = slot
        return slot

    def _release(self, slot: int) -> None:
        """The thread that held ``slot`` ended: it holds no time any more."""
        with self._lock:
            self._used.discard(slot)
            if self._board is not None:
                try:
                    self._board.set(self._worker, slot, FREE)
                except (ValueError, TypeError):
                    pass  # the board is closed: the run or the process is ending

    def _wait(self, deadline: float, *, or_moved: bool = False, event: "ClockEvent | None" = None) -> str:
        slot = self._slot()
        if slot is None:
            return self._wait_untracked(deadline, event)
        board, fd = self._board, self._wake_fds[slot][0]
        assert board is not None
        state = WAIT_MOVE if or_moved else WAIT
        while True:
            if event is not None and event.is_set():
                return "event"
            now = self.now()
            if now >= deadline:
                return "time"
            if event is not None:
                event._waiter = slot
            board.set(self._worker, slot, state, deadline)
            if event is not None and event.is_set():  # set between our check and our publishing
                board.set(self._worker, slot, BUSY)
                return "event"
            self._notice(NOTICE_WAIT)
            timeout = None if deadline == math.inf else max(0.0, deadline - now)
            ready, _, _ = select.select([fd], [], [], timeout)
            board.set(self._worker, slot, BUSY)
            if event is not None:
                event._waiter = None
            if ready:
                data = os.read(fd, 256)
                if or_moved and WAKE_MOVED in data:
                    return "moved"

    def _wait_untracked(self, deadline: float, event: "ClockEvent | None") -> str:
        """A thread without a slot waits in short real steps, watching the offset move."""
        while True:
            if event is not None and event.is_set():
                return "event"
            remaining = deadline - self.now()
            if remaining <= 0:
                return "time"
            step = min(remaining, 0.05)
            if event is not None:
                event._flag.wait(step)
            else:
                time.sleep(step)


class ClockEvent:
    """A flag one thread of a worker sets and another waits for, with a deadline on the run's clock
    (the heartbeat waits on one). Setting it marks the waiting thread busy before waking it."""

    def __init__(self, clock: Clock):
        self._clock = clock
        self._flag = threading.Event()
        self._waiter: int | None = None

    def is_set(self) -> bool:
        return self._flag.is_set()

    def clear(self) -> None:
        self._flag.clear()

    def set(self) -> None:
        clock = self._clock
        self._flag.set()
        waiter = self._waiter
        if waiter is None or clock._board is None:
            return
        with clock._lock:
            clock._board.bump(clock._worker)
            clock._board.set(clock._worker, waiter, BUSY)
        try:
            os.write(clock._wake_fds[waiter][1], WAKE_EVENT)
        except OSError:
            pass

    def wait(self, until: float = math.inf) -> bool:
        """Wait until the flag is set (True) or the run's time reaches ``until`` (False)."""
        return self._clock._wait(until, event=self) == "event"


_installed: Clock | None = None


def install(clock: Clock | None) -> None:
    """Install this worker process's clock (the harness does it once, right after the fork)."""
    global _installed
    _installed = clock


def current() -> Clock:
    """This process's clock: the one the harness installed, else the plain real clock."""
    return _installed if _installed is not None else Clock()



class RunClock:
    """The harness's side of one run's clock: the shared page, the pipes, and the jumps.

    ``virtual`` False is the clock off (``--real-time``): the offset stays 0, nothing jumps, and
    waits still end early when a step moves.
    """

    def __init__(self, *, virtual: bool, capacity: int, set_store_offset: Callable[[float], None]):
        self.virtual = virtual
        self.board = Board(capacity)
        self.capacity = capacity
        self._set_store_offset = set_store_offset
        self.notice_r, self.notice_w = os.pipe()
        os.set_blocking(self.notice_r, False)
        os.set_blocking(self.notice_w, False)
        self._pipes: dict[int, list[tuple[int, int]]] = {}  # worker index -> (read, write) per slot
        self._next = 0
        # (CLOCK_MONOTONIC ns when the offset moved, the offset in ns from then on), in order.
        self.jumps: list[tuple[int, int]] = []

    # -- workers ------------------------------------------------------------------------------------
    def add_worker(self) -> int | None:
        """Make room for one more worker process (before its fork); None when the page is full
        (that worker then runs untracked: it never lets time jump while it is alive)."""
        if self._next >= self.capacity:
            return None
        index = self._next
        self._next += 1
        self.board.reset(index)
        self._pipes[index] = [os.pipe() for _ in range(SLOTS)]
        return index

    def worker_clock(self, index: int | None) -> Clock:
        """The clock a forked worker installs (call it in the child)."""
        if index is None:
            return Clock(self.board, 0, (), self.notice_w, virtual=False)
        return Clock(self.board, index, tuple(self._pipes[index]), self.notice_w, virtual=self.virtual)

    def forked(self, index: int | None) -> None:
        """In the harness, after the fork: keep only the write ends."""
        for r, _ in self._pipes.get(index, ()) if index is not None else ():
            os.close(r)

    def exited(self, index: int | None) -> None:
        for _, w in self._pipes.pop(index, ()) if index is not None else ():
            try:
                os.close(w)
            except OSError:
                pass

    def close(self) -> None:
        for index in list(self._pipes):
            self.exited(index)
        for fd in (self.notice_r, self.notice_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self.board.close()

    # -- time ---------------------------------------------------------------------------------------
    def offset_s(self) -> float:
        return self.board.offset_ns / 1e9

    def now(self) -> float:
        return time.time() + self.offset_s()

    def virtual_ns(self, t: int) -> int:
        """A CLOCK_MONOTONIC reading of this run as the run's time: plus the offset then in force."""
        if not self.jumps:
            return t
        i = bisect.bisect_right(self.jumps, (t, math.inf)) - 1
        return t + (self.jumps[i][1] if i >= 0 else 0)

    def notices(self) -> bool:
        """Read the notices; True if a worker reported a step moved."""
        moved = False
        while True:
            try:
                data = os.read(self.notice_r, 4096)
            except BlockingIOError:
                return moved
            if not data:
                return moved
            moved = moved or NOTICE_MOVED in data

    def wake(self, index: int, slot: int, why: bytes) -> None:
        self.board.set(index, slot, BUSY)
        try:
            os.write(self._pipes[index][slot][1], why)
        except (KeyError, OSError):
            pass

    def service(self, live: list[int | None], moved: bool, quiet: Callable[[], bool]) -> float:
        """Wake the waits that are over (their deadline passed, or a step moved), and when every
        live, unfrozen worker thread waits on the clock, move the run's time to the earliest
        deadline and wake those waiting for it. ``live`` are the indexes of the live workers that
        are not stopped; ``quiet()`` says no message from a worker is waiting to be read (one may
        change what they wait for). Returns how long the harness may sleep (seconds)."""
        now = self.now()
        earliest = math.inf
        all_wait = bool(live)
        woke = False
        for index in live:
            if index is None:
                all_wait = False  # untracked: it holds time
                continue
            slots = self.board.snapshot(index)
            if slots is None:
                all_wait = False
                continue
            for slot, state, deadline in slots:
                if state == BUSY:
                    all_wait = False
                elif state in (WAIT, WAIT_MOVE):
                    if moved and state == WAIT_MOVE:
                        self.wake(index, slot, WAKE_MOVED)
                        woke = True
                    elif deadline <= now:
                        self.wake(index, slot, WAKE_TIME)
                        woke = True
                    else:
                        earliest = min(earliest, deadline)
        if woke:
            return 0.0
        if all_wait and self.virtual and earliest < math.inf and quiet():
            self.jump(earliest - now)
            return 0.0
        return min(0.02, max(0.0, earliest - now))

    def jump(self, seconds: float) -> None:
        """Move the run's time ``seconds`` forward: the store's offset first, then the page, so a
        worker that sees the new time finds the store already there."""
        offset_ns = self.board.offset_ns + max(0, int(math.ceil(seconds * 1e9)))
        self._set_store_offset(offset_ns / 1e9)
        self.board.offset_ns = offset_ns
        self.jumps.append((time.monotonic_ns(), offset_ns))
