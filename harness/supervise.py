"""Supervision: the worker processes of one run, from fork to reaping.

Workers are forked straight from this warm process (``os.fork``, each watched through a pidfd),
so a worker costs a fork, not an interpreter start, and a target may be any function, even one
defined inside a test. While another start is still to come, one process is forked ahead and parked
(:meth:`Supervisor.park`); the start hands it its identity. Every process started here is ended
here, by PID.

Workers start in name order: B starts once every fault scheduled for A has fired (or A is gone), so
a scheduled fault lands where it was asked to. A worker killed by a fault is replaced, by a fresh
identity or, drawn from the seed, by one with the same identity; a replacement without a fault of
its own starts after the whole pool and after the replacements before it, whenever the harness
happens to see the death. A fault that killed is spent and is not inherited. When no worker is left
running and a lease is still held (by a frozen or a dead worker), the run's time is moved past its
expiry before a replacement starts, so the replacement can take the step over at once.

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
"""

from __future__ import annotations

import ctypes
import errno
import math
import os
import pickle
import random
import select
import signal
import string
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable


from killpoint import chaos, vocab
from killpoint.chaos.journal import Journal
from killpoint.chaos import seeds
from killpoint.chaos.points import DB_POINTS, Failpoints
from killpoint.chaos.actions import LAPSE
from killpoint.harness import clock as run_clock
from killpoint.harness import downstream as ds
from killpoint.harness import hooks, messages
from killpoint.harness.declaration import Target, TargetRun
from killpoint.harness.forking import ForkedWorker as ForkedWorker
from killpoint.harness.messages import RESUME, FaultTally, Inbox
from killpoint.errors import BadInput, InfrastructureError, InvalidTarget, shown
from killpoint.harness import signals
from killpoint.harness.signals import sigint_deferred, unblock_sigint
from killpoint.harness.store.base import Store
from killpoint.harness.targets import WorkerFn
from killpoint.harness.worker import DONE, WorkerContext, plan
from killpoint.harness.workload import Workload

if TYPE_CHECKING:
    from killpoint.harness.run import Meanwhile, RunConfig

# Errors that say the disk the run writes to is full or unusable: infrastructure, not the target.
DISK_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})
EXIT_DISK = 75  # EX_TEMPFAIL: a worker that ended because the disk failed it
STARVED_S = 0.05  # a wait that overran by more than this: the machine starved the harness
LATE_GRACE_S = 1.0  # how long a late (resumed) worker of an owned-state target may go on after done()
LATE_GRACE_CAP_S = 20 * LATE_GRACE_S  # ... at most, in wall time, however long it waited for a CPU
UNFIRED_GRACE_S = 1.0  # how long a finished owned-state run waits for a fault that has not fired
# Run time (seconds, the clock's jumps not counted) in which no worker that is not frozen made any
# progress, after which a frozen worker is resumed (or a held one released): they are blocked on it.
BLOCKED_S = 3.0


def disk_failed(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk failed: an OS error of :data:`DISK_ERRORS`, a file whose folder
    was removed, or SQLite's own words for it (it reports a full disk as an OperationalError, not
    an OSError)."""
    if isinstance(exc, FileNotFoundError) and exc.filename:
        # A file of the run's folder, and the folder is gone: removed under the run (a cleaner, a
        # user): the infrastructure's failure, which the harness names, not the target's.
        return not os.path.isdir(os.path.dirname(os.fsdecode(exc.filename)))
    if isinstance(exc, OSError):
        return exc.errno in DISK_ERRORS
    return type(exc).__module__ == "sqlite3" and ("disk is full" in str(exc) or "disk I/O" in str(exc))


def disk_failure(exc: BaseException) -> "str | None":
    """The words for how the disk failed, where ``exc`` (or an exception it was raised from) says
    it did: the OS's own (``No space left on device``), SQLite's full disk in the OS's words too, so
    that which write met the failure first (a worker's journal, the store, the harness's probe) does
    not change what the user reads. None for any other failure (a removed folder has its own words)."""
    seen: "BaseException | None" = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in DISK_ERRORS:
            return os.strerror(seen.errno)
        if type(seen).__module__ == "sqlite3":
            if "disk is full" in str(seen):
                return os.strerror(errno.ENOSPC)
            if "disk I/O" in str(seen):
                return os.strerror(errno.EIO)
        seen = seen.__cause__
    return None


_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15

Note = Callable[..., None]


def worker_identity(n: int) -> str:
    """The ``n``-th identity a run uses (from 0): A, B, ... Z, then A1, B1, ...; the first
    ``workers`` start the run, the others are fresh identities for replacements, in order."""
    return string.ascii_uppercase[n % 26] + ("" if n < 26 else str(n // 26))


def spawn_cap(workers: int, faults: int) -> int:
    """How many worker processes a run may start before it gives up (the target keeps failing)."""
    return 4 * workers + 2 * faults + 4


def reachable_identities(workers: int, faults: int) -> tuple[str, ...]:
    """Every identity a run with ``workers`` workers and ``faults`` faults can ever start."""
    return tuple(dict.fromkeys(worker_identity(n) for n in range(spawn_cap(workers, faults))))


def check_schedule(schedule: "chaos.Schedule", *, steps: "Iterable[str]", workers: int,
                   owns_state: bool = False) -> None:
    """Refuse a schedule whose fault could never fire: a step the workload does not have, or a
    worker no run with ``workers`` workers ever starts (the first ones, then fresh identities for
    replacements up to the run's spawn cap). For a target that ``owns_state``, also a ``terminate``
    or a db point (:func:`check_owned_faults`)."""
    if owns_state:
        check_owned_faults(schedule)
    steps = tuple(steps)
    for fault in schedule.faults:
        if fault.step is not None and fault.step not in steps:
            raise BadInput(f"schedule {shown(str(schedule))}: unknown step {shown(fault.step)} in "
                           f"{shown(str(fault))}; the workload's steps are {', '.join(steps)}")
    reachable = reachable_identities(workers, len(schedule.faults))
    for fault in schedule.faults:
        if fault.worker not in reachable:
            raise BadInput(f"schedule {shown(str(schedule))}: worker {shown(fault.worker)} in "
                           f"{shown(str(fault))} is never started: with {workers} workers a run "
                           f"starts {', '.join(reachable[:workers])}, and replacements "
                           f"{reachable[workers]}..{reachable[-1]}")


def check_owned_faults(schedule: "chaos.Schedule") -> None:
    """For a target that keeps its state in a store of its own: refuse ``terminate`` and the db
    points. Both act on killpoint's store -- the sessions it ends are that store's, the points sit
    inside its COMMIT -- which such a target's workers do not write through: a terminate there
    ended a connection the target never used and still counted as fired, so a run that tested
    nothing could come out valid."""
    for fault in schedule.faults:
        what = ("terminates the worker's sessions of killpoint's store"
                if any(term.action == "terminate" for term in fault.actions.terms) else
                f"is at {fault.point}, inside killpoint's store's COMMIT" if fault.point in DB_POINTS else None)
        if what is not None:
            raise InvalidTarget(f"schedule {shown(str(schedule))}: {shown(str(fault))} {what}, and the target "
                                f"keeps its state in a store of its own, which killpoint cannot cut: kill or "
                                f"pause its workers at its own points instead")


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
    # Workers held at this one's resume moment until its late attempt is over (see the module doc).
    holding: list["WorkerProcess"] = field(default_factory=list)

    @property
    def events(self) -> int:
        return self.inbox.fd


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


def _die_with_parent(parent_pid: int | None = None) -> None:
    """Be SIGKILLed when the parent dies. ``parent_pid`` is the parent's pid read before the fork:
    a parent that died between the fork and the prctl left us orphaned already, so we end now."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        libc.prctl(_PR_SET_NAME, b"kp-worker", 0, 0, 0)  # its name in ps -o comm, top, perf
    except (OSError, AttributeError):
        pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def _thread_hook(args: Any) -> None:
    """In a worker: a thread the full disk ended (the heartbeat) ends quietly, like the worker."""
    if args.exc_value is not None and disk_failed(args.exc_value):
        return
    threading.__excepthook__(args)


def _prepare(ctx_args: dict[str, Any]) -> ds.DownstreamClient:
    """What a worker process does before it knows who it is: end with the harness, leave SIGINT to
    it, and open its connection to the downstream (the server starts the thread that will answer
    its first call meanwhile)."""
    _die_with_parent(ctx_args["parent_pid"])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the harness decides when workers end
    unblock_sigint()
    threading.excepthook = _thread_hook
    client = ds.DownstreamClient(ctx_args["url"], ctx_args["run_id"])
    try:
        client.connect()
    except OSError:
        pass  # the first call says what is wrong with the downstream, where it matters
    return client


def worker_main(target: WorkerFn, ctx_args: dict[str, Any], faults, hits, seed: int,
                events_fd: int, control_fd: int) -> None:
    """The body of a worker process (runs in the forked child)."""
    _work(target, ctx_args, faults, hits, seed, events_fd, control_fd, _prepare(ctx_args))


def parked_main(target: WorkerFn, ctx_args: dict[str, Any], events_fd: int, control_fd: int) -> None:
    """The body of a spare (runs in the forked child): prepared, it waits on its control pipe for
    who it is (:meth:`Supervisor.spawn` sends it), then is that worker. Until then it has journaled
    nothing and holds no time on the run clock; once the store is set up it opens its connection
    to it (it only reads). The end of the pipe (the harness dropped it) ends it."""
    client = _prepare(ctx_args)
    if ctx_args.get("store_ready"):
        # The store is set up: open this process's connection to it now, and read once (the
        # first statement on a connection reads the schema), instead of after the start.
        try:
            ctx_args["store"].now()
        except Exception:  # noqa: BLE001 - the worker meets it again where it matters, and says so
            pass
    size = _read_exactly(control_fd, 4)
    if size is None:
        os._exit(0)
    body = _read_exactly(control_fd, int.from_bytes(size, "big"))
    if body is None:
        os._exit(0)
    who = pickle.loads(body)
    if ForkedWorker.current is not None:
        ForkedWorker.current.name = f"killpoint-worker-{who['label']}"
    ctx_args = {**ctx_args, **who["ctx"]}
    _work(target, ctx_args, who["faults"], who["hits"], who["seed"], events_fd, control_fd, client)


def _read_exactly(fd: int, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _work(target: WorkerFn, ctx_args: dict[str, Any], faults, hits, seed: int,
          events_fd: int, control_fd: int, client: ds.DownstreamClient) -> None:
    clock = ctx_args["clock"]
    run_clock.install(clock)
    try:
        journal = Journal(ctx_args["journal"])
        journal.write(vocab.START, pid=os.getpid(), worker=ctx_args["worker_id"])
        store: Store = ctx_args["store"]
        chaos.points.install(Failpoints(list(faults), journal, seed, events_fd, control_fd, dict(hits),
                                        backends=store.backends, clock=clock,
                                        watch=ctx_args.get("watch", frozenset())))
        declared: Target = target  # type: ignore[assignment]
        ctx = WorkerContext(ctx_args["worker_id"], store, client, journal, ctx_args["workload"],
                            ctx_args["timing"], run_dir=ctx_args["run_dir"],
                            downstream_url=f"{ctx_args['url']}/runs/{ctx_args['run_id']}",
                            points=declared.points, run=ctx_args["target_run"],
                            replaces=ctx_args["replaces"], clock=clock)  # its heartbeat on that clock
        # An exception of the target is a finding (journaled with its traceback, told to the
        # harness); a full disk is the infrastructure's, and is passed on to be named as such.
        code = hooks.worker_body(declared, ctx, journal, events_fd, passes=disk_failed)
        if code == 0:
            journal.write(vocab.FINISH)
    except Exception as exc:
        if not disk_failed(exc):
            raise
        # The disk under the run is full (or gone): the harness finds it and names it; a traceback
        # from each of the workers it keeps replacing would only bury that.
        os._exit(EXIT_DISK)
    os._exit(code)


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


class Supervisor:
    """Starts, replaces, pauses, resumes and ends the workers of one run, and answers their messages.

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
        # Progress seen while a worker is frozen or held: (the mark, run time it was first seen at,
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

    # -- messages ---------------------------------------------------------------------------------
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

    def restart_services(self, index: int) -> None:
        """Restart what ``RunConfig.restarts`` names for fault ``index``, the moment it fired.

        The store has no process of its own to restart (SQLite lives inside its clients), so a
        store restart cuts every connection to it the only real way: every live worker is killed
        (its connections, and any transaction it had open, die with it) and replaced, and the
        harness closes and reopens its own handle (SQLite then replays the write-ahead log).
        """
        fault = str(self.schedule.faults[index])
        if self.spare is not None and self.config.restarts.get(fault):
            self.discard(self.spare)  # forked before the restart: it would start on what went away
        for service in self.config.restarts.get(fault, ()):
            if service == "downstream":
                before = self.downstream.pid
                self.downstream.restart()
                self.note(vocab.DOWNSTREAM_RESTART, fault=fault, pid_before=before,
                          pid=self.downstream.pid, address=self.downstream.address)
                continue
            if service == "target":
                # The target's own server (its restart() hook), e.g. a Restate server killed and
                # started again on the same data.
                ok = self.restart_target() if self.restart_target is not None else False
                self.note(vocab.TARGET_RESTART, fault=fault, ok=ok)
                continue
            killed = self.live()
            for w in killed:
                self.kill_worker(w, "store restart: every connection to the store is cut")
            self.store.close()
            self.store.snapshot()  # a new connection, on what the killed writers left
            self.note(vocab.STORE_RESTART, fault=fault, killed=[w.label for w in killed])
            for w in killed:
                if len(self.workers) < self.spawn_cap:
                    self.replace(w)

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

    def still_paused(self) -> tuple[str, ...]:
        """Why a run that hit its bound cannot be valid: a worker paused then was never resumed,
        so the late writes its pause was for never happened."""
        return tuple(f"worker {w.label} was still paused when the run hit its bound: it never came back, "
                     f"so what it would do late was not tested" for w in self.workers if w.never_resumed)

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

    def _store_done(self) -> bool:
        now, rows = self.store.snapshot()
        return plan(rows, now, self.workload) == DONE

    # -- the loop ---------------------------------------------------------------------------------
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
                paused = [w for w in live if w.state == "paused"]
                if paused:
                    if any(w.until is not None for w in paused) and not self.owns_state and self.finished():
                        for w in paused:
                            self._resume(w, vocab.RESUMED_DONE, reason="the work was finished without it")
                        continue
                    if not self.halted and len(self.workers) < self.spawn_cap:
                        # Nobody left to move the frozen worker's step on (one worker, the others
                        # hung or frozen too, or they gave up on its lease and exited): start
                        # another once the lease lapsed, as for a killed one, so the pause outlives
                        # the lease and the late worker meets the takeover.
                        if self.wait_for_lapse(live, sentinels=[w.proc.sentinel for w in live]):
                            continue
                        self.replace(paused[-1])
                        continue
                    for w in paused:
                        self.maybe_resume(w, others_active=False)
                    continue
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
                        continue
                    self.replace(live[-1] if live else self.workers[-1])
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
