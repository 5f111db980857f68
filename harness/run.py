"""One run: a store, the downstream, N worker processes forked from this warm parent, a schedule.

A :class:`Session` holds what many runs share (the downstream process, a folder); :meth:`Session.run`
takes a :class:`RunConfig` and gives a :class:`RunResult`. The run is three jobs, each in a module of
its own: :mod:`killpoint.harness.supervise` starts, pauses, resumes and ends the worker processes
(the only place that starts them), :mod:`killpoint.harness.messages` is the protocol the workers
speak to the harness, and :mod:`killpoint.harness.judge` turns what happened into a verdict.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import os
import secrets
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterator, Mapping, Sequence

from killpoint import vocab
from killpoint.chaos.schedule import Schedule
from killpoint.harness import clock as run_clock
from killpoint.harness import downstream as ds
from killpoint.harness import signals
from killpoint.harness import history as hist
from killpoint.harness.checkers.base import Verdict
from killpoint.harness.exercise import Exercise
from killpoint.harness.judge import gathering, judging
from killpoint.harness.declaration import TargetRun
from killpoint.harness.hooks import Hooks
from killpoint.harness.redact import redact
from killpoint.harness.settings import Settings, find, load
from killpoint.harness.store import check_faults, open_store, schema_name
from killpoint.harness.store.base import Store
from killpoint.errors import InfrastructureError, InvalidConfig, InvalidTarget, KillpointWarning
from killpoint.harness.disk import DISK_ERRORS, disk_failure
from killpoint.harness.identities import check_owned_faults
from killpoint.harness.starts import WorkerProcess, kill
from killpoint.harness.supervise import Supervisor
from killpoint.harness.targets import WorkerFn, declared
from killpoint.harness.worker import REAL_TIME_TIMING, Timing
from killpoint.harness.workload import Workload, cached_workload


def _owns_state(target: Any) -> bool:
    """Whether ``target`` declares that it keeps its state in a system of its own."""
    if isinstance(target, str) and (target == "reference" or target.startswith("mutant:")):
        return False
    try:
        return bool(declared(target).owns_state)
    except Exception:  # noqa: BLE001 - an unresolvable target fails later, with its own message
        return False


def off_the_run_clock(target: Any) -> bool:
    """Whether ``target`` keeps its state, and its leases' times, in a system of its own whose clock
    the run clock cannot move: it owns its state and does not declare ``run_clock=True``."""
    if not _owns_state(target):
        return False
    try:
        return not declared(target).run_clock
    except Exception:  # noqa: BLE001 - an unresolvable target fails later, with its own message
        return True


@dataclass(frozen=True)
class RunConfig:
    schedule: Schedule = field(default_factory=Schedule)
    target: "str | WorkerFn" = "reference"
    # A built-in name or pkg.module:function; None: the target's own (orders for the reference and
    # the mutants, plain for a user's target unless it declares one).
    # (A killpoint.Workload built in code is taken too: it becomes workload_spec, this its name.)
    workload: str | None = None
    workers: int = 2
    seed: int = 0
    store: str = "sqlite"
    # None: the default for the clock -- production-like (Timing()) on the virtual clock,
    # REAL_TIME_TIMING with it off. Always a Timing once the config is made.
    timing: Timing = None  # type: ignore[assignment]  # resolved in __post_init__
    bound_s: float = 30.0  # wall seconds; the run's own time is bounded too (virtual_bound_s)
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
    # What the harness restarts when a fault fires, by the fault's text: ``target`` (the target's own
    # server, through its restart() hook), ``downstream`` (same
    # ledger, same port) and/or ``store`` (every connection to it cut: the live workers are killed
    # and replaced, the harness reopens its handle). A worker paused by that fault is released at
    # once, without SIGSTOP: it only waited for the restart.
    restarts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._check()
        if self.timing is None:
            # A mutant whose bug shows only with one period short next to a step's work brings its
            # own timings, wherever it runs (matrix, replay, explore, the plugin), on either clock.
            if isinstance(self.target, str) and self.target.startswith("mutant:"):
                from killpoint.harness.mutants import timing_for

                object.__setattr__(self, "timing", timing_for(self.target))
        if self.timing is None:
            # A target that owns its state keeps its leases and heartbeats in its own system, on that
            # system's clock, which the run clock cannot move: it runs in real time, with the short
            # timings, unless it declares that it reads its time from ctx.clock (run_clock=True).
            if self.virtual_time and off_the_run_clock(self.target):
                object.__setattr__(self, "virtual_time", False)
            object.__setattr__(self, "timing", Timing() if self.virtual_time else REAL_TIME_TIMING)

    def _check(self) -> None:
        """Refuse a field no run can have, naming it (:class:`InvalidConfig`, exit 2 in the CLI)."""
        def bad(name: str, why: str) -> InvalidConfig:
            return InvalidConfig(f"RunConfig({name}={getattr(self, name)!r}): {why}")

        from killpoint.harness import inputs  # the words the command line and the plugin use

        if (isinstance(self.workers, bool) or not isinstance(self.workers, numbers.Integral)
                or not 1 <= self.workers <= inputs.MAX_WORKERS):
            raise bad("workers", inputs.WORKERS_WORDS)
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise bad("seed", inputs.SEED_WORDS)
        if (isinstance(self.bound_s, bool) or not isinstance(self.bound_s, (int, float))
                or not 0 < self.bound_s <= 86_400):
            raise bad("bound_s", "give a number of seconds above 0 and at most 86400 (a day)")
        if (isinstance(self.same_identity, bool) or not isinstance(self.same_identity, (int, float))
                or not 0 <= self.same_identity <= 1):
            raise bad("same_identity", "give a probability from 0 to 1")
        if self.timing is not None and not isinstance(self.timing, Timing):
            raise bad("timing", "give a killpoint.Timing (its fields in milliseconds)")
        if isinstance(self.workload, Workload):
            # A workload built in code, as the fixture's ``workload=`` takes one: it is the run's
            # workload_spec, and ``workload`` its name.
            if self.workload_spec is not None and self.workload_spec is not self.workload:
                raise bad("workload", "give a workload built in code as workload or as workload_spec, not both")
            object.__setattr__(self, "workload_spec", self.workload)
            object.__setattr__(self, "workload", self.workload.name)
        if self.workload is not None and not isinstance(self.workload, str):
            raise bad("workload", "give a built-in name, 'pkg.module:function' or a killpoint.Workload")
        if self.workload_spec is not None and not isinstance(self.workload_spec, Workload):
            raise bad("workload_spec", "give a killpoint.Workload")
        if self.schedule is None:  # no faults (a template config, its schedules set later)
            object.__setattr__(self, "schedule", Schedule())
        if not isinstance(self.schedule, Schedule):
            raise bad("schedule", "give a Schedule (killpoint.parse_schedule(text))")

    def with_clock(self, virtual: bool) -> "RunConfig":
        """The same run on the virtual clock or off it; a default timing follows the clock."""
        if virtual == self.virtual_time:
            return self
        timing = self.timing
        if timing == (Timing() if self.virtual_time else REAL_TIME_TIMING):
            timing = Timing() if virtual else REAL_TIME_TIMING
        return dataclasses.replace(self, virtual_time=virtual, timing=timing)

    def warnings(self) -> tuple[str, ...]:
        """What to warn about before the run, one line each: a stall that races the stuck monitor
        (:meth:`racy_stalls`), and a heartbeat not shorter than the lease (a live worker then loses
        its lease between two renewals, and every step longer than the lease is taken over)."""
        lines = list(self.racy_stalls())
        timing = self.timing
        if timing.heartbeat_ms >= timing.lease_ttl_ms:
            lines.append(f"timing heartbeat-ms {timing.heartbeat_ms:g} is not shorter than lease-ttl-ms "
                         f"{timing.lease_ttl_ms:g}: a live worker's lease runs out between two renewals, "
                         f"so any step longer than the lease is taken over from a healthy worker; "
                         f"give a heartbeat a third of the lease or less")
        return tuple(lines)

    def racy_stalls(self) -> tuple[str, ...]:
        """What to warn about in the schedule: a ``sleep`` whose end races the stuck monitor
        (:attr:`Timing.stuck_race_ms`) where a lease is held (a point of the protocol that holds
        one, or a point of the target's own, which may), one line each, naming the value."""
        from killpoint.chaos.generator import LEASE_HELD
        from killpoint.chaos.points import POINTS

        lo, hi = self.timing.stuck_race_ms
        lines = []
        for fault in self.schedule.faults:
            if fault.point in POINTS and fault.point not in LEASE_HELD:
                continue
            for term in fault.actions.terms:
                if term.action == "sleep" and term.arg is not None and lo <= term.arg <= hi:
                    lines.append(
                        f"sleep({term.arg}) in {fault} ends where the stuck monitor's flag races it "
                        f"({lo:.0f} to {hi:.0f} ms with a {self.timing.stuck_bound_ms:.0f} ms stuck "
                        f"bound): whether the lease is flagged, and so the verdict, can differ between "
                        f"runs of the same seed; keep a stall below {lo:.0f} ms or above {hi:.0f} ms")
        return tuple(lines)

    @property
    def virtual_bound_s(self) -> float:
        """The most run time (database time) a run may take: ``bound_s`` counted in stuck windows
        (bound plus slack) as the real-time timings have them, so a run that waits for ever on
        the virtual clock ends after as many windows as it would in real time, in about as many
        jumps, and a hang nobody flags is still judged."""
        t, real = self.timing, REAL_TIME_TIMING
        window = (t.stuck_bound_ms + t.stuck_slack_ms) / (real.stuck_bound_ms + real.stuck_slack_ms)
        return self.bound_s * max(1.0, window)

    @property
    def io_bound_s(self) -> float:
        """The most any one wait on a service over the network may last, in real seconds: connecting
        to the PostgreSQL store, a statement's answer, COMMIT's. A third of the run's bound, from 5
        to 30 s (10 s for the default 30 s bound): far above what a statement takes on a loaded
        machine, short enough that a partition ends the run well inside its bound."""
        return min(30.0, max(5.0, self.bound_s / 3))

    @property
    def workload_name(self) -> str:
        """The workload the run uses: ``workload``, or the target's default."""
        from killpoint.harness.workload import default_for

        if self.workload_spec is not None:
            return self.workload_spec.name
        if self.workload:
            return self.workload
        try:
            own = declared(self.target)
        except Exception:  # noqa: BLE001 - an unresolvable target fails later, with its own message
            own = None
        return default_for(self.target, own)

    @property
    def target_name(self) -> str:
        t = self.target
        return t if isinstance(t, str) else f"{getattr(t, '__module__', '?')}:{getattr(t, '__qualname__', '?')}"

    def reproduce_command(self) -> str:
        """The one ``killpoint replay`` line that runs this configuration again: shell-quoted, the
        store's password hidden (:func:`killpoint.harness.redact.redact`)."""
        # A setting is named when it is not killpoint's default, or when the [tool.killpoint] table
        # a replay started here would read sets it (the table would otherwise give its own value).
        table = _project_table()
        parts = ["killpoint", "replay", str(self.schedule), "--target", self.target_name,
                 "--seed", str(self.seed)]
        if self.workers != 2 or "workers" in table.values:
            parts += ["--workers", str(self.workers)]
        built = self.workload_spec is not None and not _named_as(self.workload_spec, self.seed)
        if built or self.workload_name != RunConfig(target=self.target).workload_name \
                or "workload" in table.values:
            parts += ["--workload", self.workload_name]
        if self.store != "sqlite" or "store" in table.values:
            parts += ["--store", redact(self.store)]  # before quoting: '***' must be quoted
        if self.same_identity != 0.5:  # the restart rule decides who recovers: it is part of the run
            parts += ["--same-identity", f"{self.same_identity:g}"]
        if not self.virtual_time:  # the clock is part of the run too
            parts += ["--real-time"]
        elif "real_time" in table.values:
            parts += ["--no-real-time"]
        default = Timing() if self.virtual_time else REAL_TIME_TIMING
        named = [f.name for f in dataclasses.fields(Timing)
                 if getattr(self.timing, f.name) != getattr(default, f.name) or f.name in table.timing]
        if named:  # --timing replaces the table's timings whole: the others take the clock's default
            parts += ["--timing", ",".join(f"{n.replace('_', '-')}={getattr(self.timing, n):g}" for n in named)]
        line = " ".join(shlex.quote(p) for p in parts)
        # What a command line cannot name: said after the command, so that the line does not pass
        # for a replay of this run (it would fail to import the target, or run another workload).
        notes = []
        if not isinstance(self.target, str) and "<" in self.target_name:
            notes.append(f"the target {self.target_name} is defined inside a function")
        if built:
            notes.append(f"the workload {self.workload_name} was built in code")
        if notes:
            line += f"  # {' and '.join(notes)}: give it as pkg.module:function to replay this run"
        return redact(line)


def _project_table() -> Settings:
    """The ``[tool.killpoint]`` table a ``killpoint replay`` started in this directory would read
    (empty when there is none, or it cannot be read: the replay then says why itself)."""
    try:
        path = find()
        stamp = os.stat(path).st_mtime_ns if path is not None else 0
    except OSError:
        return Settings()
    return _table_at(path, stamp) if path is not None else Settings()


@functools.lru_cache(maxsize=8)
def _table_at(path: str, stamp: int) -> Settings:
    try:
        return load(path=path)
    except Exception:  # noqa: BLE001 - a broken table is the replay's to report
        return Settings()


def _named_as(workload: Workload, seed: int) -> bool:
    """Whether ``workload`` is what its name resolves to (a built-in name or pkg.module:function
    giving the same instances), so that ``--workload NAME`` replays it."""
    from killpoint.harness.workload import resolve_workload

    try:
        return resolve_workload(workload.name, seed) == workload
    except Exception:  # noqa: BLE001 - InvalidWorkload, or a user's function that fails: names nothing
        return False


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
    # What the run's faults provoked (a takeover, a late write...); None: the run broke before judging.
    exercise: "Exercise | None" = None
    # What the target's own hooks did wrong (raised, gave a history() of unknown kinds or bad
    # fields): each also an unknown reason; said once per command, whatever the verdict.
    target_errors: tuple[str, ...] = ()
    # Why the run's infrastructure broke (the store, the downstream, the disk), or None: the run is
    # then unknown, and a command makes no further run (they would meet the same failure).
    infrastructure: str | None = None

    @property
    def valid(self) -> bool | None:
        return self.verdict.valid

    @property
    def schedule(self) -> str:
        return str(self.config.schedule)


# A folder in memory for run files, when the machine has one with room to spare (Linux's /dev/shm).
_SHM = "/dev/shm"
_SHM_MIN_FREE = 1 << 30


def run_files_dir() -> str | None:
    """Where a session that keeps nothing puts its run files: memory (``/dev/shm``) when it is there,
    writable and has a GiB free, unless ``TMPDIR`` names a place; else None (the temporary folder).

    A run's store, journals and the downstream's ledger are written and thrown away in milliseconds.
    On a disk every SQLite file created, checkpointed and deleted costs fsyncs and the file system's
    own journal: measured here, 50 write transactions took 37 ms on a disk against 9 ms in memory.
    Runs kill processes, never the machine, so what a killed process wrote survives in memory as
    it would on a disk: the verdicts are the same."""
    if os.environ.get("TMPDIR") or os.environ.get("KILLPOINT_NO_SHM"):
        return None
    try:
        if not (os.path.isdir(_SHM) and os.access(_SHM, os.W_OK | os.X_OK)):
            return None
        st = os.statvfs(_SHM)
    except OSError:
        return None
    return _SHM if st.f_bavail * st.f_frsize >= _SHM_MIN_FREE else None


class Session:
    """Services shared by many runs: the downstream process and a folder for run files.

    Use it as a context manager: leaving it ends every process it started.
    """

    def __init__(self, base_dir: str | None = None, *, keep: bool = False, real_time: bool = False,
                 downstream: "ds.DownstreamProcess | None" = None):
        self.real_time = real_time  # every run with the clock off (--real-time), whatever its config
        self._own_dir = base_dir is None
        self.base_dir = base_dir or tempfile.mkdtemp(prefix="killpoint-", dir=None if keep else run_files_dir())
        os.makedirs(self.base_dir, exist_ok=True)
        self.keep = keep
        # A downstream given is borrowed (a --jobs runner shares its parent's): never stopped here.
        self._own_downstream = downstream is None
        try:
            self.downstream = downstream or ds.start(os.path.join(self.base_dir,
                                                                  "downstream-ledger.sqlite"))
        except BaseException:
            if self._own_dir:
                shutil.rmtree(self.base_dir, ignore_errors=True)
            raise
        self._runs = 0
        self._live: dict[int, WorkerProcess] = {}
        self._client: ds.DownstreamClient | None = None  # the harness's connections, for every run

    def client_for(self, run_id: str) -> ds.DownstreamClient:
        """The harness's client of ``run_id``, over the session's connection to the downstream."""
        if self._client is None or self._client.url != self.downstream.url:
            if self._client is not None:
                self._client.close()
            self._client = ds.DownstreamClient(self.downstream.url, "session")
        return self._client.for_run(run_id)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for w in list(self._live.values()):
            kill(w)
        self._live.clear()
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._own_downstream:
            self.downstream.stop()
        if self._own_dir and not self.keep:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def run(self, config: RunConfig, *, number: int | None = None) -> RunResult:
        """Run ``config``; ``number`` is the run's number in its id (default: the next of this
        session's), given by a ``--jobs`` runner so that ids stay unique across runners."""
        _warn_before_runs([config])
        return self._new_run(config, number).execute()

    def reserve(self, count: int) -> int:
        """Take ``count`` run numbers for runs made elsewhere (``--jobs`` runners); returns the
        number before the first of them."""
        base = self._runs
        self._runs += count
        return base

    def _new_run(self, config: RunConfig, number: int | None = None) -> "_Run":
        signals.check()  # a Ctrl-C swallowed where it landed ends the session before another run
        if self.real_time:
            config = config.with_clock(False)
        if number is None:
            self._runs += 1
            number = self._runs
        # Numbered for people, with a random tail so that no other process can guess a live run's id.
        run_id = f"run{number:04d}-s{config.seed}-{secrets.token_hex(4)}"
        return _Run(self, config, run_id)

    def run_in_turn(self, configs: "Sequence[RunConfig]") -> "Iterator[RunResult]":
        """Run ``configs`` one at a time and yield their results in order. While a run's workers
        need nothing of the harness, the harness judges the run before it and prepares the run
        after it (its folder, store, downstream configuration and first worker process): gathering
        and judging a history, and setting a run up, take the harness milliseconds that the
        workers of the run going need no harness for. Only for targets without hooks, whose runs
        share nothing in this process (a hook's teardown would otherwise come after the next run's
        setup); the others run one after the other, as :meth:`run`."""
        _warn_before_runs(configs)
        unsettled: list[_Run] = []  # lived, not judged yet
        ahead: _Run | None = None  # the next run, made (and prepared) while this one goes
        going: _Run | None = None  # the run living now, until it is among the unsettled or judged
        try:
            for i, config in enumerate(configs):
                run = going = ahead if ahead is not None else self._new_run(config)
                ahead = None
                before = Settling(unsettled.pop(0)) if unsettled else None
                try:
                    if run.deferrable():
                        if i + 1 < len(configs):
                            try:
                                ahead = self._new_run(configs[i + 1])
                            except Exception:  # noqa: BLE001 - raised again in its turn, after this run
                                ahead = None
                        run.live(Meanwhile(before.step if before is not None else None,
                                           ahead.prepare_step if ahead is not None and ahead.deferrable()
                                           else None))
                        unsettled.append(run)
                        going = None
                        result = None
                    else:
                        if before is not None:
                            before.finish()
                        result = run.execute()
                        going = None
                finally:
                    if before is not None and before.result is None:
                        unsettled.insert(0, before.run)  # cut short: cleaned up below
                if before is not None:
                    assert before.result is not None
                    yield before.result
                if result is not None:
                    yield result
            while unsettled:
                yield unsettled.pop(0).settle()
        finally:
            # Interrupted, or the caller stopped asking: the runs not judged, the one living (an
            # interruption while it finished the next run's preparation, after its own workers
            # ended, once left its tables behind) and the one prepared ahead.
            for run in unsettled:
                run.cleanup()
            if going is not None:
                going.cleanup()
            if ahead is not None:
                ahead.cleanup()

    def run_many(self, configs: "Sequence[RunConfig]", *, jobs: int = 1) -> "Iterator[RunResult]":
        """Run independent configurations, ``jobs`` at a time (each job a process of its own);
        yields their results in the order of ``configs``."""
        from killpoint.harness.jobs import run_many

        _warn_before_runs(configs)  # here, not in the runner processes, whose warnings nobody catches
        return run_many(self, configs, jobs)


def _warn_before_runs(configs: "Sequence[RunConfig]") -> None:
    """A :class:`KillpointWarning` for each of :meth:`RunConfig.warnings` of ``configs`` (a stall
    that races the stuck monitor, a heartbeat not shorter than the lease). Always from this line,
    so that Python's filter shows a given one once however many entry points a batch of runs goes
    through."""
    import warnings

    for line in dict.fromkeys(line for config in configs for line in config.warnings()):
        # stacklevel 1: always this line, so the default filter shows each warning once however many
        # entry points a batch of runs goes through
        warnings.warn(line, KillpointWarning, stacklevel=1)


class Meanwhile:
    """What the harness does while a run's workers need nothing of it, a piece at a time: each of
    ``steps`` is called until it says it is done (True), then the next; ``step()`` does one piece
    and says whether all of them are done."""

    def __init__(self, *steps: "Callable[[], bool] | None") -> None:
        self._steps = [step for step in steps if step is not None]

    def step(self) -> bool:
        while self._steps:
            if not self._steps[0]():
                return False
            self._steps.pop(0)
        return True

    def finish(self) -> None:
        while not self.step():
            pass


class Settling:
    """A lived run's judging (:meth:`_Run.settling`), done a piece at a time: ``step()`` does the
    next piece (a millisecond or so) and says whether the result is there."""

    def __init__(self, run: "_Run") -> None:
        self.run = run
        self.result: RunResult | None = None
        self._pieces = run.settling()

    def step(self) -> bool:
        if self.result is not None:
            return True
        try:
            next(self._pieces)
        except StopIteration as done:
            self.result = done.value
            return True
        return False

    def finish(self) -> RunResult:
        while not self.step():
            pass
        assert self.result is not None
        return self.result


class _Run:
    """One run: open its store, supervise its workers until quiescence (or the bound), judge it."""

    def __init__(self, session: Session, config: RunConfig, run_id: str):
        self.s = session
        self.config = config
        self.run_id = run_id
        self.run_dir = os.path.join(session.base_dir, run_id)
        self.declared = declared(config.target)
        self.workload: Workload = config.workload_spec or cached_workload(config.workload_name, config.seed)
        known = {str(f) for f in config.schedule.faults}
        for fault, services in config.restarts.items():
            if fault not in known or not set(services) <= {"downstream", "store", "target"}:
                raise ValueError(f"restarts {fault!r}: {services!r}: name a fault of the schedule "
                                 f"and any of 'downstream', 'store', 'target'")
        check_faults(config.store, config.schedule)  # InvalidStore, a ValueError
        if self.declared.owns_state:
            check_owned_faults(config.schedule)  # InvalidTarget, bad input
        self.target = self.declared
        self.target_run = TargetRun(run_id, self.run_dir, schema_name(f"{run_id}_target"), self.workload,
                                    f"{session.downstream.url}/runs/{run_id}", config.store, config.seed)
        self.hooks = Hooks(self.declared, self.target_run)
        self.harness_events: list[dict[str, Any]] = []
        self.phase = "creating the run's folder"
        self.store: Store | None = None
        self.client: ds.DownstreamClient | None = None
        self.sup: Supervisor | None = None
        self.clock: run_clock.RunClock | None = None
        self._result: RunResult | None = None
        self._cleaned = False
        self.left_behind: list[str] = []  # what cleanup() could not remove (a schema), said in the verdict
        self._preparing: "Generator[None, None, None] | None" = None
        self._prepared = False

    def note(self, kind: str, **data: Any) -> None:
        self.harness_events.append({"t": time.monotonic_ns(), "kind": kind, **data})

    def downstream_config(self) -> dict[str, Any]:
        """The workload's downstream configuration with the target's and the run's overrides."""
        from killpoint.harness.mutants import downstream_for

        return {**self.workload.downstream_config(), **downstream_for(self.config.target),
                **self.config.downstream_overrides}

    def execute(self) -> RunResult:
        """Run and judge. A failure of the infrastructure itself (the store lost or unreachable, the
        downstream failing, a full disk, a worker that cannot be started) ends the run as *unknown*
        with its cause, never as a violation and never as a bare traceback; a Ctrl-C or SIGTERM
        ends it too, with every process and the run's schema gone."""
        self.live()
        return self.settle()

    def deferrable(self) -> bool:
        """Whether judging this run may wait until the next one is going: a target without hooks
        (see :meth:`Session.run_in_turn`)."""
        return not self.declared.hooks

    def live(self, meanwhile: "Meanwhile | None" = None) -> None:
        """The run up to its judging (:meth:`settle`); ``meanwhile``, another run's judging or
        preparation, is done a piece at a time while this run's workers need nothing of the
        harness (and finished at the end)."""
        ahead = self._prepared  # prepared while the run before went: the bound counts from now
        while not self.prepare_step():
            pass
        if ahead:
            self.started = time.monotonic()
        if self._result is None:
            try:
                self._outcome = self._supervise(meanwhile)
            except Exception as exc:
                self.cleanup()
                self._result = self.broken(exc, self.started)
            except BaseException:
                self.cleanup()
                raise
        self.lived_s = time.monotonic() - self.started
        if meanwhile is not None:
            meanwhile.finish()

    def prepare_step(self) -> bool:
        """Do the next piece of the run's preparation (see :meth:`preparing`); True once it is
        done, or has failed (the run is then *unknown*, with the cause, when it lives)."""
        if self._prepared:
            return True
        if self._preparing is None:
            self.started = time.monotonic()
            self._preparing = self.preparing()
        try:
            next(self._preparing)
            return False
        except StopIteration:
            self._prepared = True
        except BaseException as exc:
            self._prepared = True
            self.cleanup()
            # A Ctrl-C, or the target's setup() saying it cannot run as asked (bad input): raised.
            if not isinstance(exc, Exception) or isinstance(exc, InvalidTarget):
                raise
            self._result = self.broken(exc, self.started)
        return True

    def settle(self) -> RunResult:
        """Gather the history, judge it and drop the run's tables: the run's result."""
        return Settling(self).finish()

    def settling(self) -> "Generator[None, None, RunResult]":
        """:meth:`settle` a piece at a time (see :class:`Settling`)."""
        if self._result is not None:
            return self._result
        started = time.monotonic()
        try:
            result = yield from self._settle(*self._outcome)
        except Exception as exc:
            self.cleanup()
            return self.broken(exc, started - self.lived_s)
        except BaseException:
            self.cleanup()
            raise
        self.close_client()
        if self.clock is not None:
            self.clock.close()
        self._cleaned = True  # nothing of it is left to end
        return dataclasses.replace(result, duration_s=self.lived_s + time.monotonic() - started)

    def preparing(self) -> "Generator[None, None, None]":
        """Everything before the first worker starts: the run's folder, its store and clock, the
        store's tables, the downstream's configuration, the target's own setup, and a first
        worker process (parked until it is told who it is). Yields between pieces."""
        os.makedirs(self.run_dir, exist_ok=True)
        self.phase = "opening the store"
        store = self.store = open_store(self.config.store, self.run_dir, self.run_id,
                                              io_timeout_s=self.config.io_bound_s)
        clock = self.clock = run_clock.RunClock(
            virtual=self.config.virtual_time, capacity=Supervisor.spawn_cap_for(self.config) + 2,
            set_store_offset=lambda s: sup.store.set_clock(s))
        sup = self.sup = Supervisor(self.config, run_id=self.run_id, run_dir=self.run_dir,
                                    target=self.target, workload=self.workload, store=store,
                                    downstream=self.s.downstream, registry=self.s._live, note=self.note,
                                    target_run=self.target_run,
                                    finished=self.hooks.done if self.declared.owns_state else None,
                                    restart_target=self.hooks.restart, clock=clock)
        yield
        self.phase = "opening the store"
        store.setup(self.workload.checkpoints())
        sup.store_ready = True
        yield
        self.phase = "configuring the downstream"
        client = self.client = self.s.client_for(self.run_id)
        client.configure(self.downstream_config())
        self.phase = "setting up the target's own state"
        if not self.hooks.setup():
            sup.halted = True  # the target could not set up its own state: no worker starts
        yield
        # The first worker is forked (and parked) now, after the target's setup (whose work in
        # this process the workers inherit), to open its store connection before it is told who
        # it is.
        self.phase = "starting the workers"
        sup.park()

    def _supervise(self, meanwhile: "Meanwhile | None") -> tuple[bool, bool]:
        store, client, sup, clock = self.store, self.client, self.sup, self.clock
        assert store is not None and client is not None and sup is not None and clock is not None
        self.phase = "supervising the workers"

        def probe() -> None:  # a service that went silent ends the run, named (Supervisor.probe)
            self.phase = "checking that the store answers"
            store.now()
            self.phase = "checking that the downstream answers"
            client.health()
            self.phase = "supervising the workers"
        sup.probe = probe
        try:
            bound_hit, quiescent = sup.supervise(self.started + self.config.bound_s,
                                                 clock.now() + self.config.virtual_bound_s,
                                                 meanwhile=meanwhile)
        finally:
            sup.end_workers()
        self.phase = "checking the disk"
        self.check_disk()
        if quiescent and self.config.after_quiescent is not None:
            self.phase = "running the outside actor"
            self.note(vocab.AFTER_QUIESCENT)
            self.config.after_quiescent(store, client)
        return bound_hit, quiescent

    def _settle(self, bound_hit: bool, quiescent: bool) -> "Generator[None, None, RunResult]":
        store, client, sup, clock = self.store, self.client, self.sup, self.clock
        assert store is not None and client is not None and sup is not None and clock is not None
        self.phase = "gathering the history"
        history = yield from gathering(workload=self.workload, store=store, client=client,
                                       workers=sup.workers, harness_events=self.harness_events,
                                       schedule=self.config.schedule, timing=self.config.timing,
                                       quiescent=quiescent, bound_hit=bound_hit, hooks=self.hooks,
                                       at=clock.virtual_ns)
        yield
        store.close()
        if not self.s.keep:  # the history holds all a report needs; the run's tables can go
            self.phase = "dropping the run's tables"
            store.drop()
        self.store = None
        yield
        self.phase = "judging"
        # A target that raised, or a hook that did, is a finding: the run cannot be valid.
        judged = yield from judging(history, self.config.schedule, sup.tally.fired,
                                    sup.raised.reasons() + tuple(self.hooks.errors) + sup.still_paused(),
                                    self.declared.sometimes, tuple(self.hooks.history_errors))
        if bound_hit and judged.verdict.valid is None and clock.virtual and not clock.jumps:
            # The run clock never moved: nobody waited through ctx.clock, so every wait was real
            # time against the production-like timings (a takeover waits out a 30 s lease).
            verdict = dataclasses.replace(judged.verdict, unknown_reasons=judged.verdict.unknown_reasons + (
                f"the run hit its {self.config.bound_s:g} s bound and its clock never moved: no worker waited "
                f"through ctx.clock, so each wait took real time against the run clock's timings (lease "
                f"{self.config.timing.lease_ttl_ms:g} ms); wait through ctx.clock, or give --real-time "
                f"(short timings) or --timing",))
            judged = dataclasses.replace(judged, verdict=verdict)
        if not self.s.keep:
            self.hooks.teardown()
        return RunResult(self.config, self.run_id, history, judged.verdict, judged.fired,
                         judged.unfired, len(sup.workers), time.monotonic() - self.started, self.run_dir,
                         judged.exercise, tuple(self.hooks.errors))

    def check_disk(self) -> None:
        """Write a page into the run's folder: a full or failing disk there (workers that could not
        journal, a store that could not write) is the infrastructure's failure, named as such."""
        probe = os.path.join(self.run_dir, ".disk-probe")
        try:
            with open(probe, "wb") as fh:
                fh.write(b"\0" * 4096)
                fh.flush()
            os.unlink(probe)
        except FileNotFoundError as exc:
            raise InfrastructureError(f"the run's folder {self.run_dir} was removed while the run went on "
                                      f"(a cleaner of temporary files?); give TMPDIR a folder nothing "
                                      f"else cleans") from exc
        except OSError as exc:
            if exc.errno not in DISK_ERRORS:
                raise
            raise InfrastructureError(f"the disk under {self.run_dir} failed: {exc.strerror}") from exc

    def close_client(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def cleanup(self) -> None:
        """End every worker, close the client, drop the run's tables: each on its own, so that one
        that fails (the store is gone) does not keep the others from happening. Once."""
        if self._cleaned:
            return
        self._cleaned = True
        steps: list[Callable[[], None]] = []
        if self.sup is not None:
            steps.append(self.sup.end_workers)
        steps.append(self.close_client)
        if self.store is not None:
            store = self.store
            steps.append(store.close)
            if not self.s.keep:  # an interrupted or broken run leaves no file or schema behind
                steps.append(functools.partial(self._drop, store))
        if not self.s.keep:
            steps.append(self.hooks.teardown)
        if self.clock is not None:
            steps.append(self.clock.close)
        for step in steps:
            try:
                step()
            except Exception:
                pass  # best effort: the cause that matters is the one being reported

    def _drop(self, store: Store) -> None:
        """Drop the run's tables; where that fails (the PostgreSQL server went away mid-run) the
        schema stays in the database, so say which, with the statement that drops it, as a warning
        and in the run's unknown reasons: nothing is left behind without a word."""
        try:
            store.drop()
        except Exception as exc:
            schema = getattr(store, "schema", None)
            if not schema:
                raise
            line = (f"run {self.run_id} left its PostgreSQL schema {schema} in the database (dropping it failed: "
                    f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}); drop it by hand: "
                    f'DROP SCHEMA "{schema}" CASCADE')
            self.left_behind.append(line)
            import warnings

            warnings.warn(line, KillpointWarning, stacklevel=1)  # about the run, not its caller

    def broken(self, exc: Exception, started: float) -> RunResult:
        """The run's result when its infrastructure broke: unknown, with the cause."""
        disk = disk_failure(exc)
        if disk is not None:  # whichever write met it first, and in which phase, the cause is the disk
            cause = f"infrastructure failure: the disk under {self.run_dir} failed: {disk}"
        else:
            cause = f"infrastructure failure while {self.phase}: {type(exc).__name__}: " \
                    f"{' '.join(str(exc).split())[:300]}"
        if os.environ.get("KILLPOINT_DEBUG"):
            traceback.print_exception(exc, file=sys.stderr)
        self.note(vocab.INFRASTRUCTURE_FAILURE, phase=self.phase, error=cause)
        workers = self.sup.workers if self.sup is not None else []
        fired_counts = self.sup.tally.fired if self.sup is not None else {}
        history = hist.merge({}, [], [], self.harness_events, schedule=str(self.config.schedule),
                             quiescent=False)
        faults = self.config.schedule.faults
        fired = {str(f): fired_counts.get(i, 0) for i, f in enumerate(faults)}
        unfired = tuple(str(f) for i, f in enumerate(faults) if i not in fired_counts)
        return RunResult(self.config, self.run_id, history, Verdict(None, (), (cause, *self.left_behind)), fired,
                         unfired, len(workers), time.monotonic() - started, self.run_dir, infrastructure=cause)
