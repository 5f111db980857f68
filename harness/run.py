"""One run: a store, the downstream, N worker processes forked from this warm parent, a schedule.

The run loop is the only place that starts processes. Workers are forked (the ``multiprocess``
package, fork start method), so a worker costs a fork, not an interpreter start, and a target may be
any function, even one defined inside a test. Every process started here is ended here, by PID.

Workers start in name order: B starts once every fault scheduled for A has fired (or A is gone), so
a scheduled fault lands where it was asked to. A worker killed by a fault is replaced at once, by a
fresh identity or, drawn from the seed, by one with the same identity; a fault that killed is spent
and is not inherited. A paused worker (SIGSTOP) is resumed once another worker has moved its step on.
A worker at a ``terminate`` waits while the harness ends its PostgreSQL sessions, then goes on.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import json
import os
import random
import select
import shutil
import signal
import string
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import multiprocess

from killpoint import chaos
from killpoint.chaos.journal import Journal
from killpoint.chaos.points import Failpoints
from killpoint.chaos import seeds
from killpoint.chaos.schedule import Schedule
from killpoint.harness import checkpoint
from killpoint.harness import clock as run_clock
from killpoint.harness import downstream as ds
from killpoint.harness import history as hist
from killpoint.harness.checkers import check_all
from killpoint.harness.signals import sigint_deferred, unblock_sigint
from killpoint.harness.checkers.base import Verdict
from killpoint.harness.store import check_faults, open_store
from killpoint.harness.store.base import Store
from killpoint.harness.targets import Target, resolve
from killpoint.harness.worker import DONE, REAL_TIME_TIMING, Heartbeat, Timing, WorkerContext, plan
from killpoint.harness.workload import Workload, resolve_workload

_FORK = multiprocess.get_context("fork")


@functools.lru_cache(maxsize=64)
def _workload(name: str, seed: int) -> Workload:
    """Workloads are immutable values of (name, seed); building one with Faker costs milliseconds."""
    return resolve_workload(name, seed)
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class RunConfig:
    schedule: Schedule = field(default_factory=Schedule)
    target: "str | Target" = "reference"
    workload: str = "orders"
    workers: int = 2
    seed: int = 0
    store: str = "sqlite"
    # None: the default for the clock -- production-like (Timing()) on the virtual clock,
    # REAL_TIME_TIMING with it off. Always a Timing once the config is made.
    timing: "Timing | None" = None
    bound_s: float = 30.0  # wall seconds; the run's own time is bounded too (see virtual_bound_s)
    # The run clock (harness.clock): True moves the run's time past waits when every worker waits,
    # so leases and bounds cost no wall time; False (--real-time) is plain real time.
    virtual_time: bool = True
    same_identity: float = 0.5  # chance that a killed worker comes back under its own identity
    # Merged over the workload's downstream configuration, e.g. {"ignore_intent": True}; a
    # ``mutant:NAME`` target's own downstream overrides are applied first.
    downstream_overrides: Mapping[str, Any] = field(default_factory=dict)
    # A workload built in code (a scenario's own); ``workload`` is then only its name.
    workload_spec: Workload | None = None
    # Called once the run is quiescent, before judging: an outside actor (an operator resolving a
    # step in manual review) acts on the store or the downstream, and the history records it.
    after_quiescent: "Callable[[Store, ds.DownstreamClient], None] | None" = None
    # What the harness restarts when a fault fires, by the fault's text: ``downstream`` (same
    # ledger, same port) and/or ``store`` (every connection to it cut: the live workers are killed
    # and replaced, the harness reopens its handle). A worker paused by that fault is released at
    # once, without SIGSTOP: it only waited for the restart.
    restarts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.timing is None:
            object.__setattr__(self, "timing", Timing() if self.virtual_time else REAL_TIME_TIMING)

    def with_clock(self, virtual: bool) -> "RunConfig":
        """The same run on the virtual clock or off it; a default timing follows the clock."""
        if virtual == self.virtual_time:
            return self
        timing = self.timing
        if timing == (Timing() if self.virtual_time else REAL_TIME_TIMING):
            timing = None
        return dataclasses.replace(self, virtual_time=virtual, timing=timing)

    @property
    def stuck_slack_ms(self) -> float:
        """How late past the stuck bound a hang may be flagged: the heartbeat and look periods."""
        t = self.timing
        assert t is not None
        return max(250.0, 2 * t.heartbeat_ms + 20 * t.poll_ms)

    @property
    def virtual_bound_s(self) -> float:
        """The most run time (database time) a run may take: ``bound_s`` counted in stuck windows
        (bound plus slack) as the real-time timings have them, so a run that waits for ever on
        the virtual clock ends after as many windows as it would in real time, in about as many
        jumps, and a hang nobody flags is still judged."""
        t = self.timing
        assert t is not None
        real = REAL_TIME_TIMING
        window = (t.stuck_bound_ms + self.stuck_slack_ms) / (real.stuck_bound_ms + max(
            250.0, 2 * real.heartbeat_ms + 20 * real.poll_ms))
        return self.bound_s * max(1.0, window)

    @property
    def target_name(self) -> str:
        t = self.target
        return t if isinstance(t, str) else f"{getattr(t, '__module__', '?')}:{getattr(t, '__qualname__', '?')}"


@dataclass
class RunResult:
    config: RunConfig
    run_id: str
    history: hist.History
    verdict: Verdict
    fired: dict[str, int]  # fault text -> times an action fired
    unfired: tuple[str, ...]
    spawned: int
    duration_s: float
    run_dir: str

    @property
    def valid(self) -> bool | None:
        return self.verdict.valid

    @property
    def schedule(self) -> str:
        return str(self.config.schedule)


@dataclass
class _Worker:
    label: str  # the incarnation: A, A.2, C ...
    worker_id: str  # the identity the store sees
    proc: Any
    events: int  # read end: messages from the worker
    control: int  # write end: resume byte
    journal: str
    buf: bytes = b""
    state: str = "running"  # running | paused | hung | exited
    paused: tuple[str, str, int] | None = None  # (instance, step, state_version) at pause
    exitcode: int | None = None
    clock: int | None = None  # its block on the run clock's page (None: untracked)


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _worker_main(target: Target, ctx_args: dict[str, Any], faults, hits, seed: int,
                 events_fd: int, control_fd: int) -> None:
    """The body of a worker process (runs in the forked child)."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the harness decides when workers end
    unblock_sigint()
    clock = ctx_args["clock"]
    run_clock.install(clock)
    journal = Journal(ctx_args["journal"])
    journal.write("start", pid=os.getpid(), worker=ctx_args["worker_id"])
    store: Store = ctx_args["store"]
    chaos.points.install(Failpoints(list(faults), journal, seed, events_fd, control_fd, dict(hits),
                                    backends=store.backends, clock=clock))
    client = ds.DownstreamClient(ctx_args["url"], ctx_args["run_id"])
    ctx = WorkerContext(ctx_args["worker_id"], store, client, journal, ctx_args["workload"],
                        ctx_args["timing"], clock=clock)
    ctx.heartbeat = Heartbeat(store, journal, ctx.timing, clock)
    target(ctx)
    journal.write("finish")
    os._exit(0)


class Session:
    """Services shared by many runs: the downstream process and a folder for run files.

    Use it as a context manager: leaving it ends every process it started.
    """

    def __init__(self, base_dir: str | None = None, *, keep: bool = False, real_time: bool = False):
        self.real_time = real_time  # every run with the clock off (--real-time), whatever its config
        self._own_dir = base_dir is None
        self.base_dir = base_dir or tempfile.mkdtemp(prefix="killpoint-")
        os.makedirs(self.base_dir, exist_ok=True)
        self.keep = keep
        self.downstream = ds.start(os.path.join(self.base_dir, "downstream-ledger.sqlite"))
        self._runs = 0
        self._live: dict[int, _Worker] = {}

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for w in list(self._live.values()):
            _kill(w)
        self._live.clear()
        self.downstream.stop()
        if self._own_dir and not self.keep:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def run(self, config: RunConfig) -> RunResult:
        if self.real_time:
            config = config.with_clock(False)
        self._runs += 1
        run_id = f"run{self._runs:04d}-s{config.seed}"
        return _Run(self, config, run_id).execute()


def _kill(w: _Worker) -> None:
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


class _Run:
    def __init__(self, session: Session, config: RunConfig, run_id: str):
        self.s = session
        self.config = config
        self.run_id = run_id
        self.run_dir = os.path.join(session.base_dir, run_id)
        os.makedirs(self.run_dir, exist_ok=True)
        self.workload: Workload = config.workload_spec or _workload(config.workload, config.seed)
        known = {str(f) for f in config.schedule.faults}
        for fault, services in config.restarts.items():
            if fault not in known or not set(services) <= {"downstream", "store"}:
                raise ValueError(f"restarts {fault!r}: {services!r}: name a fault of the schedule "
                                 f"and any of 'downstream', 'store'")
        check_faults(config.store, config.schedule)  # InvalidStore, a ValueError
        self.target = resolve(config.target)
        self.rng = random.Random(config.seed)  # an int seed: stable in every process
        self.harness_events: list[dict[str, Any]] = []
        self.workers: list[_Worker] = []
        self.schedule = config.schedule
        self.hits: dict[int, int] = {}
        self.fired: dict[int, int] = {}
        self.spent: set[int] = set()  # faults whose action killed their worker
        pool = [string.ascii_uppercase[i] for i in range(config.workers)]
        # Workers named by the schedule start first, in the order the schedule names them.
        self.names = [n for n in config.schedule.workers if n in pool] + \
            [n for n in pool if n not in config.schedule.workers]
        self.deferred: list[str] = []  # replacements held back while a fault is still to fire
        self.started_names: list[str] = []
        self.incarnations: dict[str, int] = {}
        self.next_fresh = config.workers

    def note(self, kind: str, **data: Any) -> None:
        self.harness_events.append({"t": time.monotonic_ns(), "kind": kind, **data})

    # -- processes --------------------------------------------------------------------------------
    def spawn(self, worker_id: str) -> _Worker:
        n = self.incarnations[worker_id] = self.incarnations.get(worker_id, 0) + 1
        label = worker_id if n == 1 else f"{worker_id}.{n}"
        faults = [(i, f) for i, f in self.schedule.for_worker(worker_id) if i not in self.spent]
        events_r, events_w = os.pipe()
        control_r, control_w = os.pipe()
        journal = os.path.join(self.run_dir, f"journal-{label}.jsonl")
        slot = self.clock.add_worker()
        ctx_args = {"worker_id": worker_id, "store": self.store, "url": self.s.downstream.url,
                    "run_id": self.run_id, "workload": self.workload, "timing": self.config.timing,
                    "journal": journal, "clock": self.clock.worker_clock(slot)}
        seed = seeds.derive(self.config.seed, f"worker:{label}")
        proc = _FORK.Process(target=_worker_main, name=f"killpoint-worker-{label}",
                             args=(self.target, ctx_args, faults, self.hits, seed, events_w, control_r))
        with sigint_deferred():
            proc.start()
        os.close(events_w)
        os.close(control_r)
        self.clock.forked(slot)
        w = _Worker(label, worker_id, proc, events_r, control_w, journal, clock=slot)
        self.workers.append(w)
        self.s._live[proc.pid] = w
        self.note("spawn", worker=label, identity=worker_id, pid=proc.pid)
        return w

    def live(self) -> list[_Worker]:
        return [w for w in self.workers if w.state != "exited"]

    def pending_faults(self) -> bool:
        """Whether a live, running worker still has a scheduled fault that has not fired."""
        for i, fault in enumerate(self.schedule.faults):
            if i in self.fired:
                continue
            if any(w.worker_id == fault.worker and w.state == "running" for w in self.workers):
                return True
        return False

    def start_gated(self) -> None:
        """Start held-back workers once no live worker has a fault still to fire.

        The named workers start first, one at a time, then the others and the replacements: while
        a faulted worker has not reached its fault, nobody else can take its work away, so the
        fault lands where the schedule put it.
        """
        for name in self.names:
            if name in self.started_names:
                continue
            if self.pending_faults():
                return
            self.started_names.append(name)
            self.spawn(name)
        while self.deferred and not self.pending_faults():
            self.spawn(self.deferred.pop(0))

    def replace(self, dead: _Worker) -> None:
        if self.rng.random() < self.config.same_identity:
            identity = dead.worker_id
        else:
            identity = string.ascii_uppercase[self.next_fresh % 26] + ("" if self.next_fresh < 26
                                                                        else str(self.next_fresh // 26))
            self.next_fresh += 1
        faulted = any(f.worker == identity and i not in self.spent
                      for i, f in enumerate(self.schedule.faults))
        if faulted or not self.pending_faults():
            self.spawn(identity)
        else:
            self.deferred.append(identity)

    # -- messages ---------------------------------------------------------------------------------
    def read_messages(self, w: _Worker) -> None:
        try:
            chunk = os.read(w.events, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            return
        w.buf += chunk
        *lines, w.buf = w.buf.split(b"\n")
        for line in lines:
            if line:
                self.on_message(w, json.loads(line))

    def on_message(self, w: _Worker, msg: dict[str, Any]) -> None:
        if "hit" in msg:
            self.hits[msg["hit"]] = self.hits.get(msg["hit"], 0) + 1
        elif "fired" in msg:
            i = msg["fired"]
            self.fired[i] = self.fired.get(i, 0) + 1
            if msg["action"] in ("kill", "hang"):
                self.spent.add(i)  # its worker is gone for good: a restart does not inherit it
            if msg["action"] == "hang":
                w.state = "hung"
            self.restart_services(i)
        elif "paused" in msg:
            if w.state == "exited":
                return  # killed (by a store restart) before its pause was read
            if str(self.schedule.faults[msg["paused"]]) in self.config.restarts:
                os.write(w.control, b"r")  # it only waited for the restart, which is done
                self.note("cont", worker=w.label, pid=w.proc.pid, signal=None,
                          reason="released once the restart it waited for was done")
                return
            instance, step = msg.get("instance"), msg.get("step")
            row = self.step_row(instance, step)
            os.kill(w.proc.pid, signal.SIGSTOP)
            w.state = "paused"
            w.paused = (instance, step, row["state_version"] if row else 0)
            self.note("stop", worker=w.label, pid=w.proc.pid, signal="SIGSTOP", instance=instance,
                      step=step, reason="pause")
        elif "terminate" in msg:
            if w.state == "exited":
                return  # killed (by a store restart) before its message was read
            self.terminate_backends(w, msg)

    def terminate_backends(self, w: _Worker, msg: dict[str, Any]) -> None:
        """End the server sessions a worker reported at a ``terminate``, then let it go on.

        The worker waits on its control pipe meanwhile (it is not stopped), so this happens
        between two of its instructions: at a protocol point between transactions, at
        ``before_db_commit`` with its transaction open, at ``in_db_commit`` once the server has
        processed its COMMIT (the store waits for that). Done at once, in the loop, because it takes
        milliseconds and the worker can do nothing until it is done.
        """
        ended = self.store.terminate_backends(msg.get("backend_pids") or (),
                                              await_idle=msg.get("await_idle") or ())
        self.note("terminate_backend", worker=w.label, pid=w.proc.pid, point=msg.get("point"),
                  instance=msg.get("instance"), step=msg.get("step"), fault=msg.get("terminate"),
                  **ended)
        os.write(w.control, b"r")

    def restart_services(self, index: int) -> None:
        """Restart what ``RunConfig.restarts`` names for fault ``index``, the moment it fired.

        The store has no process of its own to restart (SQLite lives inside its clients), so a
        store restart cuts every connection to it the only real way: every live worker is killed
        (its connections, and any transaction it had open, die with it) and replaced, and the
        harness closes and reopens its own handle (SQLite then replays the write-ahead log).
        """
        fault = str(self.schedule.faults[index])
        for service in self.config.restarts.get(fault, ()):
            if service == "downstream":
                before = self.s.downstream.pid
                self.s.downstream.restart()
                self.note("downstream_restart", fault=fault, pid_before=before,
                          pid=self.s.downstream.pid, url=self.s.downstream.url)
                continue
            killed = self.live()
            for w in killed:
                self.kill_worker(w, "store restart: every connection to the store is cut")
            self.store.close()
            self.store.snapshot()  # a new connection, on what the killed writers left
            self.note("store_restart", fault=fault, killed=[w.label for w in killed])
            for w in killed:
                if len(self.workers) < self.spawn_cap:
                    self.replace(w)

    def step_row(self, instance: str | None, step: str | None) -> dict[str, Any] | None:
        for row in self.store.steps():
            if row["instance"] == instance and row["step"] == step:
                return row
        return None

    def maybe_resume(self, w: _Worker, others_active: bool) -> None:
        instance, step, version = w.paused  # type: ignore[misc]
        row = self.step_row(instance, step)
        moved_on = row is None or row["state_version"] >= version + 2 or \
            (row["state_version"] > version and row["owner_worker"] is None)
        if moved_on or not others_active:
            self.note("cont", worker=w.label, pid=w.proc.pid, signal="SIGCONT",
                      reason="its step moved on" if moved_on else "no other worker can move")
            os.kill(w.proc.pid, signal.SIGCONT)
            os.write(w.control, b"r")
            w.state = "running"
            w.paused = None

    def on_exit(self, w: _Worker) -> None:
        w.proc.join()
        code = w.proc.exitcode
        self.read_messages(w)
        w.state = "exited"
        w.exitcode = code
        self.s._live.pop(w.proc.pid, None)
        sig = -code if code is not None and code < 0 else None
        self.note("exit", worker=w.label, pid=w.proc.pid, code=code,
                  signal=signal.Signals(sig).name if sig else None)
        for fd in (w.events, w.control):
            try:
                os.close(fd)
            except OSError:
                pass
        self.clock.exited(w.clock)
        self.moved = True  # it may have moved a step on its way out: let the waiting look again
        if code != 0 and len(self.workers) < self.spawn_cap:
            self.replace(w)

    def downstream_config(self) -> dict[str, Any]:
        """The workload's downstream configuration with the target's and the run's overrides."""
        from killpoint.harness.mutants import downstream_for

        return {**self.workload.downstream_config(), **downstream_for(self.config.target),
                **self.config.downstream_overrides}

    # -- the loop ---------------------------------------------------------------------------------
    def execute(self) -> RunResult:
        started = time.monotonic()
        self.store = open_store(self.config.store, self.run_dir, self.run_id)
        self.store.setup(self.workload.checkpoints())
        client = ds.DownstreamClient(self.s.downstream.url, self.run_id)
        client.configure(self.downstream_config())
        self.spawn_cap = 4 * self.config.workers + 2 * len(self.schedule.faults) + 4
        self.clock = run_clock.RunClock(virtual=self.config.virtual_time, capacity=self.spawn_cap + 2,
                                        set_store_offset=lambda s: self.store.set_clock(s))
        self.moved = False
        bound_hit = quiescent = False
        deadline = started + self.config.bound_s
        run_deadline = self.clock.now() + self.config.virtual_bound_s
        try:
            self.start_gated()
            while True:
                live = self.live()
                active = [w for w in live if w.state == "running"]
                if not active:
                    paused = [w for w in live if w.state == "paused"]
                    if paused:
                        for w in paused:
                            self.maybe_resume(w, others_active=False)
                        continue
                    now, rows = self.store.snapshot()
                    if plan(rows, now, self.workload) == DONE or len(self.workers) >= self.spawn_cap:
                        for w in live:  # only hung workers are left: end them
                            self.kill_worker(w, "quiescent: the run is done and this worker hangs")
                        quiescent = plan(rows, now, self.workload) == DONE
                        if not quiescent:  # the workers keep dying: the run could not finish
                            bound_hit = True
                            self.note("bound_hit", reason=f"{len(self.workers)} worker processes spawned, "
                                                          f"the cap; the target keeps failing")
                        break
                    self.start_gated()
                    if not self.live() or all(w.state != "running" for w in self.live()):
                        self.replace(live[-1] if live else self.workers[-1])
                    continue
                if time.monotonic() > deadline or self.clock.now() > run_deadline:
                    bound_hit = True
                    if time.monotonic() > deadline:
                        self.note("bound_hit", seconds=self.config.bound_s)
                    else:
                        self.note("bound_hit", seconds=self.config.virtual_bound_s, clock="run")
                    for w in live:
                        self.kill_worker(w, "bound")
                    break
                fds = {w.events: w for w in live}
                sentinels = {w.proc.sentinel: w for w in live}
                watched = list(fds) + list(sentinels)
                timeout = self.clock.service(
                    [w.clock for w in live if w.state != "paused"], self.moved,
                    quiet=lambda: not select.select(watched + [self.clock.notice_r], [], [], 0)[0])
                self.moved = False
                ready, _, _ = select.select(watched + [self.clock.notice_r], [], [], timeout)
                if self.clock.notice_r in ready:
                    self.moved = self.clock.notices()
                for fd in ready:
                    if fd in fds and fds[fd].state != "exited":
                        self.read_messages(fds[fd])
                for fd in ready:
                    if fd in sentinels and sentinels[fd].state != "exited":
                        self.on_exit(sentinels[fd])
                self.start_gated()
                for w in self.live():
                    if w.state == "paused":
                        self.maybe_resume(w, others_active=any(o.state == "running" for o in self.live()
                                                               if o is not w))
        except BaseException:
            self.end_workers()
            self.clock.close()
            if not self.s.keep:  # an interrupted run leaves no file or schema behind either
                self.store.drop()
            client.close()
            raise
        finally:
            self.end_workers()
        try:
            if quiescent and self.config.after_quiescent is not None:
                self.note("after_quiescent")
                self.config.after_quiescent(self.store, client)
            return self.judge(client, started, bound_hit, quiescent)
        finally:
            client.close()

    def kill_worker(self, w: _Worker, reason: str) -> None:
        """SIGKILL a live worker on the harness's own account, and record it as its death."""
        self.note("kill", worker=w.label, pid=w.proc.pid, signal="SIGKILL", reason=reason)
        _kill(w)
        w.exitcode = -signal.SIGKILL
        self.s._live.pop(w.proc.pid, None)
        self.note("exit", worker=w.label, pid=w.proc.pid, code=w.exitcode, signal="SIGKILL")

    def end_workers(self) -> None:
        for w in self.live():
            _kill(w)
            self.s._live.pop(w.proc.pid, None)

    # -- judging ------------------------------------------------------------------------------------
    def checkpoint_verdicts(self) -> tuple[dict[str, Any], ...]:
        """What a correct worker concludes about each stored checkpoint: the same pure
        ``checkpoint.verify`` on the stored row, this code's definition and the deployment's key
        and migrations that ``ReferenceWorker.load_instance`` uses. The harness is the oracle, so a
        target that skips or botches the verification cannot also change the answer it is judged by."""
        policy = checkpoint.policy_of(self.workload)
        verdicts = []
        for inst in self.workload.instances:
            loaded = checkpoint.verify(self.store.instance(inst.id), inst, policy)
            verdicts.append({"instance": inst.id, "outcome": loaded.outcome, "reason": loaded.reason})
        return tuple(verdicts)

    def judge(self, client: ds.DownstreamClient, started: float, bound_hit: bool,
              quiescent: bool) -> RunResult:
        journals = {w.label: hist.read_journal(w.journal) for w in self.workers if os.path.exists(w.journal)}
        dead = {w.label for w in self.workers if w.exitcode != 0}
        checkpoints = self.checkpoint_verdicts()
        steps = tuple(hist.StepConfig(inst.id, s.name, s.resource, s.key(inst.id), not s.retry_safe,
                                      s.max_attempts, s.compensation_key(inst.id))
                      for inst in self.workload.instances for s in inst.steps)
        history = hist.merge(journals, self.store.events(), client.ledger(), self.harness_events,
                             dead=dead, steps=steps, final=tuple(self.store.steps()),
                             checkpoints=checkpoints,
                             schedule=str(self.schedule), quiescent=quiescent, bound_hit=bound_hit,
                             stuck_bound_ms=self.config.timing.stuck_bound_ms,
                             stuck_slack_ms=self.config.stuck_slack_ms,
                             at=self.clock.virtual_ns)
        self.clock.close()
        self.store.close()
        if not self.s.keep:  # the history holds all a report needs; the run's tables can go
            self.store.drop()
        verdict = check_all(history, schedule=str(self.schedule))
        unfired = tuple(str(f) for i, f in enumerate(self.schedule.faults) if i not in self.fired)
        if unfired:
            reasons = verdict.unknown_reasons + tuple(f"scheduled fault {u} never fired" for u in unfired)
            valid = False if verdict.valid is False else None
            verdict = Verdict(valid, verdict.results, reasons)
        fired = {str(f): self.fired.get(i, 0) for i, f in enumerate(self.schedule.faults)}
        return RunResult(self.config, self.run_id, history, verdict, fired, unfired, len(self.workers),
                         time.monotonic() - started, self.run_dir)
