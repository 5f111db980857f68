"""Supervision: the worker processes of one run, from fork to reaping, and the loop that watches them.

:class:`Supervisor` is built in layers, one concern to a module, each layer a subclass of the ones
it calls (so every module reads on its own, and mypy checks each call between them):

* :mod:`~killpoint.harness.starts` -- start order and spares: forking, replacing and ending workers;
* :mod:`~killpoint.harness.grace` -- when a target that owns its state is done, and the late worker's grace;
* :mod:`~killpoint.harness.restarts` -- the services a fault restarts (downstream, store, the target's server);
* :mod:`~killpoint.harness.pauses` -- the workers' messages, and pauses with their resume moments;
* this module -- the main loop.

What runs in a forked worker is :mod:`~killpoint.harness.child`; the identities a run starts and
the schedule checks that follow from them are :mod:`~killpoint.harness.identities`.

When no worker is left running and a lease is still held (by a frozen or a dead worker), the run's
time is moved past its expiry before a replacement starts, so the replacement can take the step
over at once.
"""

from __future__ import annotations

import math
import select
import time
from typing import TYPE_CHECKING

from killpoint import vocab
from killpoint.harness import signals
from killpoint.harness.pauses import Pauses
from killpoint.harness.starts import WorkerProcess

if TYPE_CHECKING:
    from killpoint.harness.lifecycle import Meanwhile

STARVED_S = 0.05  # a wait that overran by more than this: the machine starved the harness


class Supervisor(Pauses):
    """Starts, replaces, pauses, resumes and ends the workers of one run, and answers their messages.

    ``registry`` is the session's map of live workers by PID (so that closing the session ends any
    worker a run left); ``note`` records a harness event in the run's history.
    """

    def lease_left(self) -> float:
        """Run time until the first lease held by a worker that is not running lapses (0: none is
        held). For a target that keeps its own state, whose leases killpoint's store does not see:
        until a lease of the run's timing, taken at a frozen worker's pause, would have lapsed."""
        if self.owns_state:
            now, ttl = self.clock.now(), self.config.timing.lease_ttl_ms / 1000.0
            frozen = [w.paused_at + ttl - now for w in self.live() if w.state == "paused"]
            return max(0.0, min(frozen)) + 0.002 if frozen and min(frozen) > 0 else 0.0
        running = {w.worker_id for w in self.live() if w.state == "running"}
        now, rows = self.store.snapshot()
        left = [r["expires_at"] - now for r in rows if r["owner_worker"] is not None
                and r["owner_worker"] not in running and r["expires_at"] is not None
                and r["expires_at"] > now]
        # Just past the expiry, as a worker waits for it (SQLite's clock ticks in milliseconds).
        return min(left) + 0.002 if left else 0.0

    def wait_for_lapse(self, live: list[WorkerProcess], sentinels: list[int]) -> bool:
        """Before a replacement starts with no worker running: move the run's time past the first
        lease a frozen or dead worker still holds (on the virtual clock), or wait a poll for it (on
        real time; True: it has not lapsed yet, look again). Not while a worker hangs: its
        heartbeat renews its lease, and it holds time."""
        if any(w.state == "hung" for w in live):
            return False
        left = self.lease_left()
        if left <= 0:
            return False
        if self.clock.virtual:
            self.clock.jump(left)
            return False
        select.select(sentinels + [self.clock.notice_r], [], [], min(left, 0.02))
        return True

    def supervise(self, deadline: float, run_deadline: float = float("inf"),
                  meanwhile: "Meanwhile | None" = None) -> tuple[bool, bool]:
        """Run the workers until the run is done or the bound is hit: ``(bound_hit, quiescent)``.
        ``deadline`` is CLOCK_MONOTONIC seconds, ``run_deadline`` the run's own time (database
        time, which the virtual clock moves). ``meanwhile`` (the judging of the run before and the
        preparation of the run after, see :meth:`Session.run_in_turn`) is done a piece at a time
        whenever no worker has anything for the harness, so that a fault that fires is answered
        within a piece.

        The caller ends the workers afterwards (:meth:`end_workers`), also when this raises.
        """
        self.start_gated()
        next_probe = time.monotonic() + self.probe_every_s
        while True:
            signals.check()  # a Ctrl-C whose exception was swallowed (in a finalizer) ends the run too
            if self.probe is not None and time.monotonic() >= next_probe:
                self.probe()
                next_probe = time.monotonic() + self.probe_every_s
            live = self.live()
            active = [w for w in live if w.state == "running"]
            if not active:
                over = self._nobody_running(live)
                if over is not None:
                    return over
                continue
            if time.monotonic() > deadline or self.clock.now() > run_deadline:
                if time.monotonic() > deadline:
                    self.note(vocab.BOUND_HIT, seconds=self.config.bound_s)
                else:
                    self.note(vocab.BOUND_HIT, seconds=self.config.virtual_bound_s, clock="run")
                for w in live:
                    w.never_resumed = w.state == "paused"
                    self.kill_worker(w, "bound")
                return True, False
            fds = {w.events: w for w in live}
            sentinels = {w.proc.sentinel: w for w in live}
            watched = list(fds) + list(sentinels) + [self.clock.notice_r]
            # Wake the waits that are over; when every live, unfrozen thread waits on the clock,
            # move the run's time to the first deadline (harness.clock). Not while a message is
            # unread: what a worker said before it started waiting may change what happens next.
            timeout = self.clock.service([w.clock for w in live if w.state != "paused"], self.moved,
                                         quiet=lambda: not select.select(watched, [], [], 0)[0])
            if meanwhile is not None and timeout != 0.0 and not select.select(watched, [], [], 0)[0]:
                if meanwhile.step():
                    meanwhile = None
                continue
            moved, self.moved = self.moved, False
            asked = time.monotonic()
            if self.probe is not None:
                timeout = max(0.0, min(next_probe - asked, timeout if timeout is not None else math.inf))
            ready, _, _ = select.select(watched, [], [], timeout)
            late = time.monotonic() - asked - (timeout if timeout is not None else 0.0)
            if not ready and timeout is not None and late > STARVED_S:
                # The machine did not run the harness for a while (a loaded CI runner): the
                # workers' monitors were most likely held back as well, and stuck_detected
                # gives a hang this much more time to be flagged.
                self.note(vocab.STARVED, ms=round(late * 1000, 1))
            if self.clock.notice_r in ready:
                self.moved = self.clock.notices()
            for fd in ready:
                if fd in fds and fds[fd].state != "exited":
                    self.read_messages(fds[fd])
            for fd in ready:
                if fd in sentinels and sentinels[fd].state != "exited":
                    self.on_exit(sentinels[fd])
            self.start_gated()
            if not (moved or self.moved or not ready):
                continue  # nothing moved and no time passed: a paused worker's step did not move on
            for w in self.live():
                if w.state == "paused":
                    self.maybe_resume(w, others_active=any(o.state == "running" for o in self.live()
                                                           if o is not w))
            if any(w.holding for w in self.live()):
                self.idle_late()
            if any(w.state == "paused" or w.holding for w in self.live()) and self.blocked():
                self.unblock()
            if self.owned_done():
                for w in self.live():
                    self.kill_worker(w, "quiescent: the target's done() says the work is finished")
                return False, True

    def _nobody_running(self, live: list[WorkerProcess]) -> "tuple[bool, bool] | None":
        """A turn of :meth:`supervise` with no worker running: resume a frozen one, start a
        replacement, or end the run. The run's outcome when it is over, None to look again."""
        paused = [w for w in live if w.state == "paused"]
        if paused:
            if any(w.until is not None for w in paused) and not self.owns_state and self.finished():
                for w in paused:
                    self._resume(w, vocab.RESUMED_DONE, reason="the work was finished without it")
                return None
            if not self.halted and len(self.workers) < self.spawn_cap:
                # Nobody left to move the frozen worker's step on (one worker, the others
                # hung or frozen too, or they gave up on its lease and exited): start
                # another once the lease lapsed, as for a killed one, so the pause outlives
                # the lease and the late worker meets the takeover.
                if self.wait_for_lapse(live, sentinels=[w.proc.sentinel for w in live]):
                    return None
                self.replace(paused[-1])
                return None
            for w in paused:
                self.maybe_resume(w, others_active=False)
            return None
        finished = self.finished()
        if finished or self.halted or len(self.workers) >= self.spawn_cap:
            for w in live:  # only hung workers are left: end them
                self.kill_worker(w, "quiescent: the run is done and this worker hangs")
            if finished or self.halted:  # halted: unknown, for the exception it raised
                return False, finished
            # the workers keep dying: the run could not finish
            self.note(vocab.BOUND_HIT, reason=f"{len(self.workers)} worker processes spawned, "
                                              f"the cap; the target keeps failing")
            return True, False
        self.start_gated()
        if not self.live() or all(w.state != "running" for w in self.live()):
            if self.wait_for_lapse(live, sentinels=[w.proc.sentinel for w in live]):
                return None
            self.replace(live[-1] if live else self.workers[-1])
        return None
