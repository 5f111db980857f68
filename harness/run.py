"""One run: a store, the downstream, N worker processes forked from this warm parent, a schedule.

A :class:`Session` holds what many runs share (the downstream process, a folder); :meth:`Session.run`
takes a :class:`RunConfig` and gives a :class:`RunResult`. The run is three jobs, each in a module of
its own: :mod:`killpoint.harness.supervise` starts, pauses, resumes and ends the worker processes
(the only place that starts them), :mod:`killpoint.harness.messages` is the protocol the workers
speak to the harness, and :mod:`killpoint.harness.judge` turns what happened into a verdict.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from killpoint.chaos.schedule import Schedule
from killpoint.harness import downstream as ds
from killpoint.harness import history as hist
from killpoint.harness.checkers.base import Verdict
from killpoint.harness.judge import gather_history, judge
from killpoint.harness.declaration import TargetRun
from killpoint.harness.hooks import Hooks
from killpoint.harness.store import check_faults, open_store, schema_name
from killpoint.harness.store.base import Store
from killpoint.harness.supervise import Supervisor, WorkerProcess, kill
from killpoint.harness.targets import Target, declared
from killpoint.harness.worker import Timing
from killpoint.harness.workload import Workload, resolve_workload


@functools.lru_cache(maxsize=64)
def _workload(name: str, seed: int) -> Workload:
    """Workloads are immutable values of (name, seed); building one with Faker costs milliseconds."""
    return resolve_workload(name, seed)


@dataclass(frozen=True)
class RunConfig:
    schedule: Schedule = field(default_factory=Schedule)
    target: "str | Target" = "reference"
    # A built-in name or pkg.module:function; None: the target's own (orders for the reference and
    # the mutants, plain for a user's target unless it declares one).
    workload: str | None = None
    workers: int = 2
    seed: int = 0
    store: str = "sqlite"
    timing: Timing = field(default_factory=Timing)
    bound_s: float = 30.0
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


class Session:
    """Services shared by many runs: the downstream process and a folder for run files.

    Use it as a context manager: leaving it ends every process it started.
    """

    def __init__(self, base_dir: str | None = None, *, keep: bool = False):
        self._own_dir = base_dir is None
        self.base_dir = base_dir or tempfile.mkdtemp(prefix="killpoint-")
        os.makedirs(self.base_dir, exist_ok=True)
        self.keep = keep
        self.downstream = ds.start(os.path.join(self.base_dir, "downstream-ledger.sqlite"))
        self._runs = 0
        self._live: dict[int, WorkerProcess] = {}

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for w in list(self._live.values()):
            kill(w)
        self._live.clear()
        self.downstream.stop()
        if self._own_dir and not self.keep:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def run(self, config: RunConfig) -> RunResult:
        self._runs += 1
        # Numbered for people, with a random tail so that no other process can guess a live run's id.
        run_id = f"run{self._runs:04d}-s{config.seed}-{secrets.token_hex(4)}"
        return _Run(self, config, run_id).execute()


class _Run:
    """One run: open its store, supervise its workers until quiescence (or the bound), judge it."""

    def __init__(self, session: Session, config: RunConfig, run_id: str):
        self.s = session
        self.config = config
        self.run_id = run_id
        self.run_dir = os.path.join(session.base_dir, run_id)
        os.makedirs(self.run_dir, exist_ok=True)
        self.declared = declared(config.target)
        self.workload: Workload = config.workload_spec or _workload(config.workload_name, config.seed)
        known = {str(f) for f in config.schedule.faults}
        for fault, services in config.restarts.items():
            if fault not in known or not set(services) <= {"downstream", "store"}:
                raise ValueError(f"restarts {fault!r}: {services!r}: name a fault of the schedule "
                                 f"and any of 'downstream', 'store'")
        check_faults(config.store, config.schedule)  # InvalidStore, a ValueError
        self.target = self.declared
        self.target_run = TargetRun(run_id, self.run_dir, schema_name(f"{run_id}_target"), self.workload,
                                    f"{session.downstream.url}/runs/{run_id}", config.store, config.seed)
        self.hooks = Hooks(self.declared, self.target_run)
        self.harness_events: list[dict[str, Any]] = []

    def note(self, kind: str, **data: Any) -> None:
        self.harness_events.append({"t": time.monotonic_ns(), "kind": kind, **data})

    def downstream_config(self) -> dict[str, Any]:
        """The workload's downstream configuration with the target's and the run's overrides."""
        from killpoint.harness.mutants import downstream_for

        return {**self.workload.downstream_config(), **downstream_for(self.config.target),
                **self.config.downstream_overrides}

    def execute(self) -> RunResult:
        started = time.monotonic()
        store = open_store(self.config.store, self.run_dir, self.run_id)
        store.setup(self.workload.checkpoints())
        client = ds.DownstreamClient(self.s.downstream.url, self.run_id)
        client.configure(self.downstream_config())
        sup = Supervisor(self.config, run_id=self.run_id, run_dir=self.run_dir, target=self.target,
                         workload=self.workload, store=store, downstream=self.s.downstream,
                         registry=self.s._live, note=self.note, target_run=self.target_run,
                         finished=self.hooks.done if self.declared.owns_state else None)
        if not self.hooks.setup():
            sup.halted = True  # the target could not set up its own state: no worker starts
        try:
            bound_hit, quiescent = sup.supervise(started + self.config.bound_s)
        except BaseException:
            sup.end_workers()
            if not self.s.keep:  # an interrupted run leaves no file or schema behind either
                store.drop()
                self.hooks.teardown()
            client.close()
            raise
        finally:
            sup.end_workers()
        try:
            if quiescent and self.config.after_quiescent is not None:
                self.note("after_quiescent")
                self.config.after_quiescent(store, client)
            history = gather_history(workload=self.workload, store=store, client=client,
                                     workers=sup.workers, harness_events=self.harness_events,
                                     schedule=self.config.schedule, timing=self.config.timing,
                                     quiescent=quiescent, bound_hit=bound_hit, hooks=self.hooks)
            store.close()
            if not self.s.keep:  # the history holds all a report needs; the run's tables can go
                store.drop()
            # A target that raised, or a hook that did, is a finding: the run cannot be valid.
            judged = judge(history, self.config.schedule, sup.tally.fired,
                           sup.raised.reasons() + tuple(self.hooks.errors))
            return RunResult(self.config, self.run_id, history, judged.verdict, judged.fired,
                             judged.unfired, len(sup.workers), time.monotonic() - started, self.run_dir)
        finally:
            client.close()
            if not self.s.keep:
                self.hooks.teardown()
