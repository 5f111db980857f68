"""What the workers say, and the pauses the harness answers with.

Each worker's messages (:mod:`killpoint.harness.messages`) are answered here: a hit, a fault that
fired, a pause, a point watched for a resume moment, a ``terminate``, an exception, an exit.

A paused worker (SIGSTOP) comes back at the moment its schedule names. A plain ``pause``: once
another worker has moved its step on. ``pause(until=POINT)``: once another worker reaches POINT of
the same step; that worker is held there (it waits for the harness, and the history says ``held``)
while the frozen one makes its late attempt, and goes on once that attempt is over -- the late
worker reached ``after_commit`` of the step or a point of another step, waits on the run clock,
paused, hung or exited. ``pause(until=lapse)``: once its lease lapsed and another worker is about to
claim the step (its ``before_claim``), held there likewise. Whatever the moment, a frozen worker
also comes back when the work was finished without it, when no other worker is left that could
move, or when no worker that is not frozen made progress (no point hit, no journal entry, no
downstream request) for :data:`BLOCKED_S` of run time in which the clock did not jump (they are
blocked on the frozen one: a row lock, a library lock). Each resume is a ``cont`` event saying the
moment asked for and why it came (``vocab.RESUMED``), so a pause that never met its moment says so.
A worker at a ``terminate`` waits while the harness ends its PostgreSQL sessions, then goes on.

A layer of :class:`~killpoint.harness.supervise.Supervisor`, over the grace (a paused worker of an
owned-state target comes back once ``done()`` says yes) and the restarts (a fault that fired may
restart a service).
"""

from __future__ import annotations

import os
import signal
from typing import Any

from killpoint import vocab
from killpoint.chaos.actions import LAPSE
from killpoint.harness import clock as run_clock
from killpoint.harness import messages
from killpoint.harness.grace import LateGrace
from killpoint.harness.messages import RESUME
from killpoint.harness.restarts import Restarts
from killpoint.harness.starts import WorkerProcess

# Run time (seconds, the clock's jumps not counted) in which no worker that is not frozen made any
# progress, after which a frozen worker is resumed (or a held one released): they are blocked on it.
BLOCKED_S = 3.0


class Pauses(LateGrace, Restarts):
    """Answering the workers' messages, and pausing, holding and resuming them."""

    # -- messages ---------------------------------------------------------------------------------
    def on_exit(self, w: WorkerProcess) -> None:
        w.proc.join()
        code = w.proc.exitcode
        self.read_messages(w)
        w.state = "exited"
        w.exitcode = code
        self.registry.pop(w.proc.pid, None)
        sig = -code if code is not None and code < 0 else None
        self.note(vocab.EXIT, worker=w.label, pid=w.proc.pid, code=code,
                  signal=signal.Signals(sig).name if sig else None)
        if w.raised is not None and self.raised.add(w.raised[0], w.raised[1], w.label) and not self.halted:
            self.halted = True
            self.note(vocab.REPLACEMENTS_STOPPED, worker=w.label, error=w.raised[1],
                      reason="the target raised the same exception again")
        self._close_pipes(w)
        self._release_held(w, vocab.RELEASED_AFTER, f"{w.label}, back from its pause, exited")
        self.moved = True  # it may have moved a step on its way out: let the waiting look again
        if code != 0 and len(self.workers) < self.spawn_cap:
            self.replace(w)

    def read_messages(self, w: WorkerProcess) -> None:
        for msg in w.inbox.read():
            self._progress = None
            messages.dispatch(self, w, msg)

    def on_hit(self, w: WorkerProcess, index: int) -> None:
        self.tally.hit(index)

    def on_fired(self, w: WorkerProcess, index: int, action: str) -> None:
        self.tally.fire(index, action)
        if action == "hang":
            w.state = "hung"
            self._release_held(w, vocab.RELEASED_AFTER, f"{w.label}, back from its pause, hangs")
        elif action == "kill":
            w.dying = True
        self.restart_services(index)

    def on_paused(self, w: WorkerProcess, index: int, instance: str | None, step: str | None,
                  until: str | None = None) -> None:
        if w.state == "exited":
            return  # killed (by a store restart) before its pause was read
        self._release_held(w, vocab.RELEASED_AFTER, f"{w.label}, back from its pause, paused again")
        if str(self.schedule.faults[index]) in self.config.restarts:
            os.write(w.control, RESUME)  # it only waited for the restart, which is done
            self.note(vocab.CONT, worker=w.label, pid=w.proc.pid, signal=None, why=vocab.RESUMED_RESTART,
                      reason="released once the restart it waited for was done")
            return
        row = self.store.step_progress(instance, step) if instance and step and not self.owns_state else None
        os.kill(w.proc.pid, signal.SIGSTOP)
        w.state = "paused"
        w.paused = (instance, step, row[0] if row else 0)  # type: ignore[assignment]
        w.until = until
        w.paused_at = self.clock.now()
        self.note(vocab.STOP, worker=w.label, pid=w.proc.pid, signal="SIGSTOP", instance=instance,
                  step=step, reason="pause", until=until)

    def on_at(self, w: WorkerProcess, point: str, instance: str | None, step: str | None,
              wait: bool) -> None:
        """A worker at a watched point (a resume moment), or a late worker at any point."""
        if w.holding and ((instance, step) != w.late_step or point == "after_commit"):
            where = "the step" if (instance, step) == w.late_step else f"{instance}/{step}"
            self._release_held(w, vocab.RELEASED_AFTER, f"{w.label}, back from its pause, reached {point} "
                                                        f"of {where}: its late attempt is over")
        if not wait or w.state == "exited":
            return
        frozen = next((p for p in self.workers if p is not w and p.state == "paused" and p.paused is not None
                       and tuple(p.paused[:2]) == (instance, step) and p.until is not None
                       and (p.until == point or (p.until == LAPSE and point == "before_claim"))), None)
        if frozen is None:
            self._answer(w)
            return
        w_step = f"{instance}/{step}" if instance else "its step"
        self.note(vocab.HELD, worker=w.label, pid=w.proc.pid, point=point, instance=instance, step=step,
                  frozen=frozen.label)
        frozen.holding.append(w)
        if frozen.until == LAPSE:
            self._resume(frozen, vocab.RESUMED_LAPSED, by=w.label,
                         reason=f"its lease of {w_step} lapsed and {w.label} is about to claim it "
                                f"(held at {point} meanwhile)")
        else:
            self._resume(frozen, vocab.RESUMED_AT, by=w.label,
                         reason=f"{w.label} reached {point} of {w_step}, the moment its pause waited for "
                                f"({w.label} held there meanwhile)")

    def _answer(self, w: WorkerProcess) -> None:
        """Let a worker that waits at a watched point go on."""
        try:
            os.write(w.control, RESUME)
        except OSError:
            pass  # it is gone: its exit is read in its turn

    def _resume(self, w: WorkerProcess, why: str, *, reason: str, **extra: Any) -> None:
        """SIGCONT a frozen worker and let it go on from its pause; the history says the moment its
        pause asked for and why it came back (``why``, one of ``vocab.RESUMED``)."""
        self.note(vocab.CONT, worker=w.label, pid=w.proc.pid, signal="SIGCONT", reason=reason, why=why,
                  moment=w.until, **extra)
        os.kill(w.proc.pid, signal.SIGCONT)
        os.write(w.control, RESUME)
        w.state = "running"
        w.late_step = (w.paused[0], w.paused[1]) if w.paused else None
        w.paused = None
        w.until = None
        w.late = True
        self._progress = None

    def _release_held(self, w: WorkerProcess, why: str, reason: str) -> None:
        """Let the workers held at ``w``'s resume moment go on."""
        held, w.holding = w.holding, []
        for r in held:
            if r.state == "exited":
                continue
            self.note(vocab.CONT, worker=r.label, pid=r.proc.pid, signal=None, why=why, reason=reason,
                      frozen=w.label)
            self._answer(r)
        if held:
            self._progress = None

    def on_raised(self, w: WorkerProcess, signature: str, error: str) -> None:
        w.raised = (signature, error)  # judged at its exit (it exits 1 right after)

    def on_terminate(self, w: WorkerProcess, msg: dict[str, Any]) -> None:
        """End the server sessions a worker reported at a ``terminate``, then let it go on.

        The worker waits on its control pipe meanwhile (it is not stopped), so this happens
        between two of its instructions: at a protocol point between transactions, at
        ``before_db_commit`` with its transaction open, at ``in_db_commit`` once the server has
        processed its COMMIT (the store waits for that). Done at once, in the loop, because it takes
        milliseconds and the worker can do nothing until it is done.
        """
        if w.state == "exited":
            return  # killed (by a store restart) before its message was read
        ended = self.store.terminate_backends(msg.get("backend_pids") or (),
                                              await_idle=msg.get("await_idle") or ())
        self.note(vocab.TERMINATE_BACKEND, worker=w.label, pid=w.proc.pid, point=msg.get("point"),
                  instance=msg.get("instance"), step=msg.get("step"), fault=msg.get("terminate"),
                  **ended)
        os.write(w.control, RESUME)

    def maybe_resume(self, w: WorkerProcess, others_active: bool) -> None:
        instance, step, version = w.paused  # type: ignore[misc]
        if self.owns_state:
            # killpoint's store does not see such a target's steps move; its done() does (asked at
            # most every 50 ms): the work was finished without the paused worker.
            moved_on = self._done_polled()
            why, reason = vocab.RESUMED_DONE, "the target's done() says the work is finished"
        elif w.until is not None:
            # Its moment is another worker's point: a step that moved on without it (a recovery
            # that passes fewer points) is not its moment; the work finished without it is.
            moved_on = False
            why, reason = vocab.RESUMED_DONE, "the work was finished without it"
        else:
            row = self.store.step_progress(instance, step) if instance and step else None
            moved_on = row is None or row[0] >= version + 2 or (row[0] > version and row[1] is None)
            why, reason = vocab.RESUMED_MOVED, "its step moved on"
        # With nobody else running, a replacement is started (once the lease lapsed) while one can
        # be (see supervise): the frozen worker meets a takeover rather than coming back to nothing.
        can_start = not self.halted and len(self.workers) < self.spawn_cap
        if moved_on or not (others_active or can_start):
            if not moved_on:
                why, reason = vocab.RESUMED_NOBODY, "no other worker can move"
            self._resume(w, why, reason=reason)

    # -- progress ---------------------------------------------------------------------------------
    def _progress_mark(self) -> tuple[Any, ...]:
        """What grows while any worker that is not frozen does something: its journal (every point
        hit, claim, call and commit of killpoint's protocol), and the downstream's ledger."""
        marks: list[Any] = []
        for w in self.live():
            if w.state == "paused":
                continue
            try:
                marks.append(os.stat(w.journal).st_size)
            except OSError:
                marks.append(None)
        for path in (self.downstream.ledger_path, self.downstream.ledger_path + "-wal"):
            try:
                st = os.stat(path)
                marks.append((st.st_size, st.st_mtime_ns))
            except OSError:
                marks.append(None)
        return tuple(marks)

    def blocked(self) -> bool:
        """Whether no worker that is not frozen has made progress (see :meth:`_progress_mark`, and
        any message) for :data:`BLOCKED_S` of run time in which the clock did not jump (a jump
        means every one of them waits on the clock: they wait, they are not blocked)."""
        mark, now, jumps = self._progress_mark(), self.clock.now(), len(self.clock.jumps)
        seen = self._progress
        if seen is None or seen[0] != mark or seen[2] != jumps:
            self._progress = (mark, now, jumps)
            return False
        return now - seen[1] >= BLOCKED_S

    def unblock(self) -> None:
        """Nobody that is not frozen moves: release the workers held at a moment, or, if none is
        held, resume the frozen ones."""
        late = [w for w in self.live() if w.holding]
        seconds = f"{BLOCKED_S:g} s of run time"
        if late:
            for w in late:
                self._release_held(w, vocab.RELEASED_BLOCKED,
                                   f"no worker that is not frozen made progress for {seconds} "
                                   f"while {w.label} made its late attempt")
            return
        for w in self.live():
            if w.state == "paused":
                self._resume(w, vocab.RESUMED_BLOCKED,
                             reason=f"no worker that is not frozen made progress for {seconds}: "
                                    f"they are blocked on it")

    def idle_late(self) -> None:
        """Release the workers held for a late worker that now waits on the run clock: its late
        attempt is over (what it waits for cannot come while they are held)."""
        for w in self.live():
            if not w.holding or w.clock is None:
                continue
            slots = self.clock.board.snapshot(w.clock)
            if slots and all(state in (run_clock.WAIT, run_clock.WAIT_MOVE, run_clock.HUNG)
                             for _, state, _ in slots):
                self._release_held(w, vocab.RELEASED_AFTER, f"{w.label}, back from its pause, waits on the "
                                                            f"run clock: its late attempt is over")

    def still_paused(self) -> tuple[str, ...]:
        """Why a run that hit its bound cannot be valid: a worker paused then was never resumed,
        so the late writes its pause was for never happened."""
        return tuple(f"worker {w.label} was still paused when the run hit its bound: it never came back, "
                     f"so what it would do late was not tested" for w in self.workers if w.never_resumed)
