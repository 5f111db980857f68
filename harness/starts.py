"""Start order and spares: the supervisor's processes, from fork to reaping.

Workers are forked straight from this warm process (``os.fork``, each watched through a pidfd),
so a worker costs a fork, not an interpreter start, and a target may be any function, even one
defined inside a test. While another start is still to come, one process is forked ahead and parked
(:meth:`Starts.park`); the start hands it its identity. Every process started here is ended
here, by PID.

Workers start in name order: B starts once every fault scheduled for A has fired (or A is gone), so
a scheduled fault lands where it was asked to. A worker killed by a fault is replaced, by a fresh
identity or, drawn from the seed, by one with the same identity; a replacement without a fault of
its own starts after the whole pool and after the replacements before it, whenever the harness
happens to see the death. A fault that killed is spent and is not inherited.

:class:`Starts` is the first layer of :class:`~killpoint.harness.supervise.Supervisor`: it holds
the state every layer reads (set up in its ``__init__``, each field's comment saying what it is
for) and the processes; the layers above it add the late-worker grace, service restarts, pauses and
the main loop.
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import string
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from killpoint import vocab
from killpoint.chaos import seeds
from killpoint.chaos.actions import LAPSE
from killpoint.harness import clock as run_clock
from killpoint.harness import downstream as ds
from killpoint.harness import hooks
from killpoint.harness.child import parked_main, worker_main
from killpoint.harness.declaration import Target, TargetRun
from killpoint.harness.forking import ForkedWorker
from killpoint.harness.identities import spawn_cap, worker_identity
from killpoint.harness.messages import FaultTally, Inbox
from killpoint.errors import InfrastructureError
from killpoint.harness.signals import sigint_deferred
from killpoint.harness.store.base import Store
from killpoint.harness.worker import DONE, plan
from killpoint.harness.workload import Workload

if TYPE_CHECKING:
    from killpoint.harness.run_config import RunConfig

Note = Callable[..., None]


@dataclass
class WorkerProcess:
    """The harness's handle on one worker process."""

    label: str  # the incarnation: A, A.2, C ...
    worker_id: str  # the identity the store sees
    proc: Any
    inbox: Inbox  # read end: messages from the worker
    control: int  # write end: resume byte
    journal: str
    state: str = "running"  # running | paused | hung | exited (parked: a spare, see Supervisor.park)
    paused: tuple[str, str, int] | None = None  # (instance, step, state_version) at pause
    exitcode: int | None = None
    clock: int | None = None  # its block on the run clock's page (None: untracked)
    dying: bool = False  # a kill fired in it: it is about to end (and be replaced)
    raised: tuple[str, str] | None = None  # (signature, "Type: message") when its target raised
    late: bool = False  # resumed after a pause: a stale worker whose late writes the run waits for
    never_resumed: bool = False  # still paused when the run hit its bound (and was then killed)
    until: str | None = None  # while paused: the resume moment its schedule named (None: moved on)
    paused_at: float = 0.0  # run time of its pause
    late_step: tuple[str | None, str | None] | None = None  # resumed: the (instance, step) it was frozen on
    # Workers held at this one's resume moment until its late attempt is over (see harness.pauses).
    holding: list["WorkerProcess"] = field(default_factory=list)

    @property
    def events(self) -> int:
        return self.inbox.fd


def kill(w: WorkerProcess) -> None:
    """SIGKILL a worker by PID (resuming it first if stopped) and reap it."""
    pid = w.proc.pid
    if pid is None or w.state == "exited":
        return
    for sig in (signal.SIGKILL, signal.SIGCONT):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    w.proc.join(5)
    w.state = "exited"
    for fd in (w.events, w.control):
        try:
            os.close(fd)
        except OSError:
            pass


class Starts:
    """Starts, replaces and ends the workers of one run: the first layer of the supervisor.

    ``registry`` is the session's map of live workers by PID (so that closing the session ends any
    worker a run left); ``note`` records a harness event in the run's history.
    """

    def __init__(self, config: "RunConfig", *, run_id: str, run_dir: str, target: Target,
                 workload: Workload, store: Store, downstream: ds.DownstreamProcess,
                 registry: dict[int, WorkerProcess], note: Note, target_run: TargetRun | None = None,
                 finished: Callable[[], bool] | None = None,
                 restart_target: Callable[[], bool] | None = None,
                 clock: "run_clock.RunClock | None" = None) -> None:
        self.config = config
        self.restart_target = restart_target
        self.target_run = target_run
        # Is the work done? By default killpoint's store says; a target that owns its state says.
        self.finished = finished or self._store_done
        self.raised = hooks.Raised()
        self.halted = False  # replacements stopped: the target raised the same exception twice
        # Called every probe_every_s real seconds of supervision: raises when a service the run
        # needs (the store, the downstream) gives no answer within its bound, which ends the run as
        # an infrastructure failure instead of leaving the workers to wait out the run's bound.
        self.probe: Callable[[], None] | None = None
        self.probe_every_s = max(1.0, config.io_bound_s / 2)
        self.replaces: dict[str, str] = {}  # identity about to start -> the dead worker id it replaces
        # The late-worker grace's (harness.grace):
        self._next_done_poll = 0.0
        self._done_at: float | None = None  # when done() first said yes with a late worker alive
        self._unfired_done_at: float | None = None  # when done() first said yes with a fault unfired
        # each late worker's runqueue_waits (by PID) from then, or from its resume if that came later
        self._late_waits: dict[int, dict[int, int] | None] = {}
        self.schedule = config.schedule
        self.run_id = run_id
        self.run_dir = run_dir
        self.target = target
        self.workload = workload
        self.store = store
        self.downstream = downstream
        self.registry = registry
        self.note = note
        self.rng = random.Random(config.seed)  # an int seed: stable in every process
        self.tally = FaultTally()
        self.workers: list[WorkerProcess] = []
        pool = [string.ascii_uppercase[i] for i in range(config.workers)]
        # Workers named by the schedule start first, in the order the schedule names them.
        self.names = [n for n in config.schedule.workers if n in pool] + \
            [n for n in pool if n not in config.schedule.workers]
        self.deferred: list[str] = []  # replacements held back while a fault is still to fire
        self.started_names: list[str] = []
        self.incarnations: dict[str, int] = {}
        self.next_fresh = config.workers
        self.spawn_cap = spawn_cap(config.workers, len(self.schedule.faults))
        self.clock = clock or run_clock.RunClock(virtual=False, capacity=self.spawn_cap + 2,
                                                 set_store_offset=lambda s: self.store.set_clock(s))
        self.moved = False  # a worker reported a step moved (or died): wake those waiting for it
        self.spare: WorkerProcess | None = None  # forked ahead of the next start (see park)
        self.store_ready = False  # the store is set up: a spare may connect to it ahead
        # The points whose hits workers tell the harness of and wait at: the schedule's resume
        # moments (a lapse is met at the claim another worker is about to make).
        self.watch = frozenset("before_claim" if m == LAPSE else m for m in self.schedule.moments)
        # Progress seen while a worker is frozen or held (harness.pauses): (the mark, run time it was first seen at,
        # the clock's jumps then); None: something moved since the last look.
        self._progress: tuple[Any, float, int] | None = None

    @staticmethod
    def spawn_cap_for(config: "RunConfig") -> int:
        return spawn_cap(config.workers, len(config.schedule.faults))

    # -- processes --------------------------------------------------------------------------------
    def spawn(self, worker_id: str) -> WorkerProcess:
        n = self.incarnations[worker_id] = self.incarnations.get(worker_id, 0) + 1
        label = worker_id if n == 1 else f"{worker_id}.{n}"
        faults = [(i, f) for i, f in self.schedule.for_worker(worker_id) if i not in self.tally.spent]
        journal = os.path.join(self.run_dir, f"journal-{label}.jsonl")
        who = {"worker_id": worker_id, "journal": journal, "replaces": self.replaces.pop(worker_id, None)}
        seed = seeds.derive(self.config.seed, f"worker:{label}")
        w = self._release(label, who, faults, seed)
        if w is None:
            w = self._fork(worker_main, lambda slot, events_w, control_r: (
                self.target, {**self._ctx_args(slot), **who}, faults, self.tally.hits, seed, events_w,
                control_r), label)
        w.label, w.worker_id, w.journal = label, worker_id, journal
        self.workers.append(w)
        self.note(vocab.SPAWN, worker=label, identity=worker_id, pid=w.proc.pid)
        self.park()
        return w

    def _ctx_args(self, slot: int | None) -> dict[str, Any]:
        """What every worker of this run is given, whoever it turns out to be."""
        return {"clock": self.clock.worker_clock(slot), "store": self.store, "url": self.downstream.url,
                "run_id": self.run_id, "workload": self.workload, "timing": self.config.timing,
                "target_run": self.target_run, "run_dir": self.run_dir, "parent_pid": os.getpid(),
                "store_ready": self.store_ready, "watch": self.watch}

    def _fork(self, main: Callable[..., None],
              args: Callable[[int | None, int, int], tuple[Any, ...]], label: str) -> WorkerProcess:
        events_r, events_w = os.pipe()
        control_r, control_w = os.pipe()
        slot = self.clock.add_worker()
        proc = ForkedWorker(main, args(slot, events_w, control_r), name=f"killpoint-worker-{label}")
        # Registered before a signal can be delivered: a Ctrl-C or SIGTERM that lands at any point
        # of the fork finds the new worker among those the cleanup ends.
        with sigint_deferred():
            try:
                proc.start()
            except OSError as exc:  # EAGAIN, ENOMEM: the machine cannot start another process
                for fd in (events_r, events_w, control_r, control_w):
                    os.close(fd)
                raise InfrastructureError(f"cannot start worker {label}: {type(exc).__name__}: "
                                          f"{exc}") from exc
            os.close(events_w)
            os.close(control_r)
            self.clock.forked(slot)
            w = WorkerProcess(label, label, proc, Inbox(events_r), control_w, "", clock=slot)
            assert proc.pid is not None  # started
            self.registry[proc.pid] = w
        return w

    # -- the spare --------------------------------------------------------------------------------
    # A start costs a fork and the new process's first steps (about 2 ms, most of it copy-on-write
    # faults) before its target runs. While another start is still to come -- a worker of the pool
    # not started yet, a kill still to fire, a killed worker not yet reaped -- one process is forked
    # ahead and parked (:func:`parked_main`); the start that comes hands it its identity and it goes
    # at once. It is told who it is only then, so it is the same worker a fork at that moment would
    # have made: same faults, same hits so far, same seed, same journal.
    def park(self) -> None:
        """Fork the spare, if a start is still to come and there is none."""
        if self.spare is not None or not self._start_ahead():
            return
        try:
            self.spare = self._fork(parked_main, lambda slot, events_w, control_r: (
                self.target, self._ctx_args(slot), events_w, control_r), "spare")
        except InfrastructureError:
            return  # the start that needs one forks it then, and says why it cannot
        self.spare.state = "parked"

    def _start_ahead(self) -> bool:
        if self.halted or len(self.workers) >= self.spawn_cap:
            return False
        if self.pool_waiting() or any(w.dying and w.state != "exited" for w in self.workers):
            return True
        return any(i not in self.tally.fired and any(t.action == "kill" for t in f.actions.terms)
                   for i, f in enumerate(self.schedule.faults))

    def _release(self, label: str, who: dict[str, Any], faults: list[Any], seed: int) -> WorkerProcess | None:
        """The spare, told who it is (None: there is none, or it cannot be used)."""
        w, self.spare = self.spare, None
        if w is None:
            return None
        body = pickle.dumps({"label": label, "ctx": who, "faults": faults, "hits": dict(self.tally.hits),
                             "seed": seed})
        message = len(body).to_bytes(4, "big") + body
        try:
            if not w.proc.is_alive():
                raise OSError("the spare ended")
            while message:
                message = message[os.write(w.control, message):]
        except OSError:
            self.discard(w)
            return None
        w.state = "running"
        return w

    def discard(self, w: WorkerProcess) -> None:
        """End a spare nobody will use (the run is over, or a restart changed what it inherited)."""
        if self.spare is w:
            self.spare = None
        kill(w)
        self.registry.pop(w.proc.pid, None)
        self._close_pipes(w)

    def _close_pipes(self, w: WorkerProcess) -> None:
        """Close the harness's ends of an ended worker's pipes, and its wake pipes on the clock."""
        for fd in (w.events, w.control):
            try:
                os.close(fd)
            except OSError:
                pass
        self.clock.exited(w.clock)

    def live(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.state != "exited"]

    def pending_faults(self) -> bool:
        """Whether a live, running worker still has a scheduled fault that has not fired."""
        for i, fault in enumerate(self.schedule.faults):
            if i in self.tally.fired:
                continue
            if any(w.worker_id == fault.worker and w.state == "running" for w in self.workers):
                return True
        return False

    def pool_waiting(self) -> bool:
        """Whether a worker of the pool (``--workers``) has yet to start."""
        return not self.halted and len(self.started_names) < len(self.names)

    def start_gated(self) -> None:
        """Start held-back workers once no live worker has a fault still to fire.

        The named workers start first, one at a time, then the others and the replacements: while
        a faulted worker has not reached its fault, nobody else can take its work away, so the
        fault lands where the schedule put it.
        """
        if self.halted:
            return
        for name in self.names:
            if name in self.started_names:
                continue
            if self.pending_faults():
                return
            self.started_names.append(name)
            self.spawn(name)
        while self.deferred and not self.pending_faults():
            self.spawn(self.deferred.pop(0))

    def replace(self, dead: WorkerProcess) -> None:
        if self.halted:
            return
        if self.rng.random() < self.config.same_identity:
            identity = dead.worker_id
        else:
            identity = worker_identity(self.next_fresh)
            self.next_fresh += 1
        faulted = any(f.worker == identity and i not in self.tally.spent
                      for i, f in enumerate(self.schedule.faults))
        self.replaces[identity] = dead.worker_id
        # A replacement without a fault of its own waits, as it waits for faults still to fire, for
        # the workers of the pool that have not started yet and for the replacements before it:
        # whether the harness read the dead worker's last message before or together with its exit
        # (a matter of load) must not decide who starts first, or the same seed could let a
        # replacement take the work a named worker's fault was waiting for.
        if faulted or not (self.pending_faults() or self.pool_waiting() or self.deferred):
            self.spawn(identity)
        else:
            self.deferred.append(identity)

    def kill_worker(self, w: WorkerProcess, reason: str) -> None:
        """SIGKILL a live worker on the harness's own account, and record it as its death."""
        self.note(vocab.KILL, worker=w.label, pid=w.proc.pid, signal="SIGKILL", reason=reason)
        kill(w)
        w.exitcode = -signal.SIGKILL
        self.registry.pop(w.proc.pid, None)
        self.note(vocab.EXIT, worker=w.label, pid=w.proc.pid, code=w.exitcode, signal="SIGKILL")

    def end_workers(self) -> None:
        for w in self.live():
            kill(w)
            self.registry.pop(w.proc.pid, None)
        if self.spare is not None:
            self.discard(self.spare)

    def _store_done(self) -> bool:
        now, rows = self.store.snapshot()
        return plan(rows, now, self.workload) == DONE
