"""When the work of a target that owns its state is done, and the late worker's grace.

Such a target's workers may serve forever (a library's worker loop), and killpoint's store does not
see its steps move: its ``done()`` hook says when the work is finished, asked at most every 50 ms.
A worker resumed after its pause is the stale worker of the lease-takeover exercise, and what it
does late is what the run is for, so it gets :data:`LATE_GRACE_S` after ``done()`` first said yes,
counted in time it could run (a loaded machine's wait for a CPU is left out, up to
:data:`LATE_GRACE_CAP_S` of wall time). A layer of :class:`~killpoint.harness.supervise.Supervisor`.
"""

from __future__ import annotations

import os
import time

from killpoint import vocab
from killpoint.harness.starts import Starts

LATE_GRACE_S = 1.0  # how long a late (resumed) worker of an owned-state target may go on after done()
LATE_GRACE_CAP_S = 20 * LATE_GRACE_S  # ... at most, in wall time, however long it waited for a CPU
UNFIRED_GRACE_S = 1.0  # how long a finished owned-state run waits for a fault that has not fired


def runqueue_waits(pid: int) -> dict[int, int] | None:
    """How long each thread of process ``pid`` has waited, runnable, for a CPU: nanoseconds by
    thread id, the second field of Linux's /proc/PID/task/TID/schedstat. None where that cannot be
    read (the process is gone, or this is not Linux); a thread that ends while it is read is left out.

    This is the time a loaded machine held the process back: a late worker's grace is counted
    without it (:meth:`Supervisor.owned_done`)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    waits = {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                waits[int(tid)] = int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return waits


class LateGrace(Starts):
    """Whether an owned-state run is done, and the grace its late workers get first."""

    @property
    def owns_state(self) -> bool:
        """The target keeps its own state: its done() says when the work is finished."""
        return self.finished != self._store_done

    @property
    def asks_done(self) -> bool:
        """The target that owns its state has a ``done()`` hook to ask while its workers run. Without
        one, its work is done once its workers exit (the hook's default says yes at once, which,
        asked while they ran, ended them before their work: a false verdict on a loaded machine)."""
        return self.owns_state and self.target.hook("done") is not None

    def _done_polled(self) -> bool:
        """The target's done(), asked at most every 50 ms (False in between, and always False
        for a target without the hook: see :attr:`asks_done`)."""
        if not self.asks_done:
            return False
        now = time.monotonic()
        if now < self._next_done_poll:
            return False
        self._next_done_poll = now + 0.05
        return bool(self.finished())

    def owned_done(self) -> bool:
        """For a target that owns its state, whose workers may serve forever (a library's worker
        loop): its ``done()``, asked while workers run -- at most every 50 ms, and only while no
        worker is paused, so no pause is cut short (a hung worker is ended with the others; a fault
        still unfired gets :data:`UNFIRED_GRACE_S` before the run ends without it)."""
        if not self.owns_state or self.halted or self.deferred:
            return False
        live = self.live()
        # A hung worker does not hold the run: once done() says the work is finished, another worker
        # finished what it hung in, and it is ended with the others (as a finished run's are).
        if not live or any(w.state not in ("running", "hung") for w in live) or \
                all(w.state == "hung" for w in live) or not self._done_polled():
            return False
        now = time.monotonic()
        if self.pending_faults() or len(self.tally.fired) < len(self.schedule.faults):
            # The work is finished and a fault has still not fired: it can no longer fire (a point
            # the target passes only while it works, or one it passes outside any step, which a
            # fault at a step never matches). Once done() has said so for UNFIRED_GRACE_S the run
            # ends, unknown for that fault, instead of waiting out its bound (30 s a run).
            if self._unfired_done_at is None:
                self._unfired_done_at = now
            if now - self._unfired_done_at < UNFIRED_GRACE_S:
                return False
            self.note(vocab.UNFIRED_GIVEN_UP, seconds=UNFIRED_GRACE_S,
                      faults=[str(f) for i, f in enumerate(self.schedule.faults) if i not in self.tally.fired])
            return True
        late = [w for w in live if w.late]
        if not late:
            return True
        # A worker resumed after its pause is the stale worker of the lease-takeover exercise:
        # what it does now (its late calls and writes) is what the run is for, so done() does not
        # cut it short. A library's worker loop exits by itself once the work is done; one that
        # serves forever is ended LATE_GRACE_S after done() first said yes -- counted in time it
        # could run. In wall time, a loaded machine (a CI runner) that left the worker runnable
        # but off the CPU had it ended before its late call landed: a duplicate came out valid.
        # So the time its threads waited for a CPU since then is not counted (summed over its
        # threads: more grace, never less; of several late workers, the one held back longest),
        # up to LATE_GRACE_CAP_S of wall time, so that a worker starved for good cannot hold the
        # run (nor can any, past its bound). A worker whose waits cannot be read gets wall time.
        if self._done_at is None:
            self._done_at = now
        for w in late:
            if w.proc.pid not in self._late_waits:
                self._late_waits[w.proc.pid] = runqueue_waits(w.proc.pid)
        wall = now - self._done_at
        held = max(self._held_back_s(w.proc.pid) for w in late)
        capped = wall - held < LATE_GRACE_S  # over only because of the cap, if at all
        if capped and wall < LATE_GRACE_CAP_S:
            return False
        self.note(vocab.LATE_GRACE_OVER, workers=[w.label for w in late], seconds=LATE_GRACE_S,
                  wall_s=round(wall, 3), capped=capped)
        return True

    def _held_back_s(self, pid: int) -> float:
        """How long late worker ``pid``'s threads have waited for a CPU since its grace began
        (0 where that cannot be read). A thread started since counts from its start."""
        before, now = self._late_waits.get(pid), runqueue_waits(pid)
        if before is None or now is None:
            return 0.0
        return sum(max(0, ns - before.get(tid, 0)) for tid, ns in now.items()) / 1e9
