"""One run's life, from its folder to its result: prepared, lived (its workers supervised), settled
(its history gathered and judged), and cleaned up whatever happens on the way.

:class:`Run` is made by :class:`~killpoint.harness.run.Session`, which holds what many runs share.
A run's pieces may interleave with another run's (:class:`Meanwhile`, :class:`Settling`): while one
run's workers need nothing of the harness, the run before is judged and the run after prepared.
:class:`RunResult` is what a run gives; users import it from :mod:`killpoint.harness.run` (or as
``killpoint.RunResult``), which re-exports it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generator

from killpoint import vocab
from killpoint.errors import InfrastructureError, InvalidTarget, KillpointWarning
from killpoint.harness import clock as run_clock
from killpoint.harness import downstream as ds
from killpoint.harness import history as hist
from killpoint.harness import signals
from killpoint.harness.checkers.base import Verdict
from killpoint.harness.declaration import TargetRun
from killpoint.harness.disk import DISK_ERRORS, disk_failure
from killpoint.harness.exercise import Exercise
from killpoint.harness.hooks import Hooks
from killpoint.harness.identities import check_owned_faults
from killpoint.harness.judge import gathering, judging
from killpoint.harness.run_config import RunConfig
from killpoint.harness.store import check_faults, open_store, schema_name
from killpoint.harness.store.base import Store
from killpoint.harness.supervise import Supervisor
from killpoint.harness.targets import declared
from killpoint.harness.workload import Workload, cached_workload

if TYPE_CHECKING:
    from killpoint.harness.run import Session

__all__ = ["Meanwhile", "Run", "RunResult", "Settling"]


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
    """A lived run's judging (:meth:`Run.settling`), done a piece at a time: ``step()`` does the
    next piece (a millisecond or so) and says whether the result is there."""

    def __init__(self, run: "Run") -> None:
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


class Run:
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

    @property
    def broke(self) -> bool:
        """Whether the run's infrastructure failed (its result is then in hand: :meth:`broken`)."""
        return self._result is not None

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
        # Signals held until every step is done (each is bounded: workers are SIGKILLed, the store's
        # statements carry the run's I/O bound): one raised halfway cut a schema's DROP short and
        # skipped the steps after it. It is raised once the run is clean.
        with signals.sigint_deferred():
            for step in steps:
                try:
                    step()
                except Exception:
                    pass  # best effort: the cause that matters is the one being reported
            signals.drop_repeats()

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
