"""The ``killpoint`` fixture and the session's services behind it."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import pickle
from typing import TYPE_CHECKING, Any, Callable, Generator, NoReturn, Sequence

import pytest

from killpoint._plugin.marker import _Case, _collection_error, _marker_kwargs
from killpoint._plugin.settings import Settings, _points
from killpoint._plugin.state import _HANDLE, _RUNS, _STATE, INDEX, _State
from killpoint._plugin.verdict import CrashVerdict, _Run, _verdict

if TYPE_CHECKING:
    from killpoint.chaos.schedule import Schedule
    from killpoint.harness.workload import Workload
    from killpoint.harness.run import RunConfig, RunResult, Session

class Killpoint:
    """What the ``killpoint`` fixture gives a test: runs crashes, returns verdicts.

    ``target`` is ``"reference"``, ``"mutant:NAME"``, ``"pkg.module:function"`` or a function taking a
    :class:`killpoint.WorkerContext` (even one defined inside the test: workers are forked). Name it
    as a string when you want the reproduce command to be runnable as is.
    """

    def __init__(self, item: pytest.Item, state: _State, session_getter: Callable[[], "Session"]):
        self._item = item
        self._state = state
        self._session_getter = session_getter
        self._verdict: CrashVerdict | None = None
        self._marked_check = False

    @property
    def settings(self) -> Settings:
        """This session's options (store, report dir, seed, points, budget, shard, jobs, real time)."""
        return self._state.settings

    @property
    def verdict(self) -> CrashVerdict:
        """The verdict of this item's single crash (tests marked ``@pytest.mark.killpoint`` only)."""
        if self._verdict is None:
            raise AttributeError("killpoint.verdict is set only in tests marked @pytest.mark.killpoint; "
                                 "elsewhere use the verdict returned by killpoint.run(...) or .matrix(...)")
        return self._verdict

    # -- running -----------------------------------------------------------------------------
    def run(self, schedule: "str | Schedule" = "", *, target: "str | Callable[..., None]" = "reference",
            workload: "str | Workload | None" = None, workers: int = 2, seed: int | None = None,
            **config: Any) -> CrashVerdict:
        """One run under ``schedule`` (text such as ``"A@charge.after_call:kill"``, or a Schedule).

        ``workload``: a built-in name, ``pkg.module:function`` or a :class:`killpoint.Workload`; by
        default the target's own (``orders`` for the reference and the mutants, ``plain`` for yours).
        ``config`` passes further :class:`killpoint.RunConfig` fields (``timing``, ``bound_s``,
        ``same_identity``).
        """
        from killpoint import chaos
        from killpoint.chaos.points import DB_POINTS

        if isinstance(schedule, str):
            points = frozenset(self._declared(target).points) | frozenset(DB_POINTS)
            try:
                parsed = chaos.parse(schedule, points=points)
            except chaos.InvalidSchedule as exc:
                _fail(f"killpoint: schedule {schedule[:200]!r}: {exc}")
        else:
            parsed = schedule
        run = self._config(parsed, target, workload, workers, seed, config)
        self._check_schedule(run)
        return self._judge([run])

    def matrix(self, *, target: "str | Callable[..., None]" = "reference",
               points: Sequence[str] | None = None, steps: Sequence[str] | None = None, depth: int = 1,
               workload: "str | Workload | None" = None, workers: int = 2, seed: int | None = None,
               actions: "Sequence[str] | str" = ("kill", "pause"), hits: str = "paths",
               max_hits: int | None = None, **config: Any) -> CrashVerdict:
        """The schedules ``killpoint matrix`` runs for the same arguments, in its order: worker A
        killed at each point of each step (hung at the heartbeat) and, with ``actions`` (as
        ``--actions``; default kill and pause), frozen past its lease at each point where it holds
        one; with ``depth=2`` every ordered pair of crashes on a step, by default on the steps
        more than one instance runs (``killpoint matrix --depth 2``).

        ``hits`` and ``max_hits`` are ``--hits`` and ``--max-hits`` (depth 1 with kills): after a
        fault-free run with worker A alone, A is also killed at each later hit that ends a new path
        (``paths``, the default), at every later hit (``all``), or at none (``first``).

        Points default to all the target declares (narrowed by ``--killpoint-points``); under
        ``--killpoint-shard K/N`` this runs the K-th share of the list, which is the same in every job.
        """
        from killpoint.harness.workload import default_for

        seed = self.settings.seed if seed is None else seed
        declared = self._declared(target)
        built = self._workload(workload if workload is not None else default_for(target, declared), seed)
        known = built.step_names
        from killpoint.chaos import generator

        asked = {"points": points, "steps": steps}
        points = _names(points, "points")
        steps = _names(steps, "steps")
        if steps is None and depth == 2:
            steps = generator.repeated_steps(built)
        steps = steps if steps is not None else known
        from killpoint.harness import inputs  # not at load time: the plugin loads in every session
        wrong = inputs.unknown_steps(steps, built.name, known)
        if wrong:
            _fail(f"killpoint.matrix(steps={asked['steps']!r}): {wrong}")
        if type(depth) is not int or depth not in (1, 2):  # True and 1.0 equal 1: they ran as depth 1
            _fail(f"killpoint.matrix(depth={depth!r}): depth is 1 (single crashes) or 2 (pairs)")
        try:
            chosen = _points(points, self.settings, declared.points)
            plans = _plans(steps, chosen, depth, actions, order=declared.points, lease=declared.lease_points,
                           claim=declared.claim_point)
        except ValueError as exc:
            _fail(f"killpoint.matrix: {exc}")
        if not plans:
            _fail(f"killpoint.matrix(points={asked['points']!r}, actions={actions!r}): no run to make: "
                  f"a pause is scheduled only where a lease is held "
                  f"({', '.join(declared.lease_points) or 'this target declares no such point'})")
        if hits not in generator.HIT_MODES:
            _fail(f"killpoint.matrix(hits={hits!r}): use one of {', '.join(generator.HIT_MODES)}")
        if max_hits is not None and (type(max_hits) is not int or max_hits < 0):
            _fail(f"killpoint.matrix(max_hits={max_hits!r}): give a whole number of at least 0, or None")
        found = None
        if depth == 1 and hits != "first" and "kill" in _actions(actions):
            # The fault-free run with A alone (in every shard: each needs the same list), then a
            # kill at each later hit it shows, as killpoint matrix runs them.
            from killpoint.chaos.schedule import Schedule
            from killpoint.harness.paths import explore_hits

            probe = self._config(Schedule(), target, workload, 1, seed, dict(config))
            found = self._session_getter().run(probe)
            plans = plans + list(explore_hits(found, tuple(steps), tuple(chosen), hits, max_hits).plans)
        k, n = self.settings.shard
        mine = generator.shard(plans, k, n)
        if plans and not mine:
            pytest.skip(f"shard {k}/{n} has no share of this matrix of {len(plans)} schedules")
        # Each pair of depth 2 comes with the restart rule its second fault needs.
        return self._judge([self._config(p.schedule, target, workload, workers, seed,
                                         {**p.overrides(), **config}) for p in mine],
                           before=[found] if found is not None and found.valid is not True and k == 1 else [])

    def explore(self, *, target: "str | Callable[..., None]" = "reference", budget: int | None = None,
                seed: int | None = None, workload: str | None = None, workers: int = 2) -> CrashVerdict:
        """Schedules drawn with Hypothesis (``killpoint explore``), a failure shrunk to a minimal one;
        the verdict's ``results`` hold that counterexample's run and every run that was unknown.

        ``budget`` defaults to ``--killpoint-budget``. Under ``--killpoint-shard K/N`` this job draws
        its share of the budget from a seed of its own, so N jobs together draw the whole budget.
        """
        from killpoint._plugin.explore import explore

        return explore(self, target=target, budget=budget, seed=seed, workload=workload, workers=workers)

    # -- inside ------------------------------------------------------------------------------
    def _declared(self, target: Any) -> Any:
        """The target with its declaration, or a test failure naming the bad target."""
        from killpoint.harness.targets import InvalidTarget, declared

        try:
            return declared(target)
        except InvalidTarget as exc:
            problem = str(exc)
        _fail(f"killpoint: {problem}")

    def _workload(self, workload: Any, seed: int) -> "Workload":
        """A workload given by name (or as a Workload), or a test failure naming the bad one."""
        from killpoint.harness.workload import InvalidWorkload, Workload, cached_workload

        if isinstance(workload, Workload):
            return workload
        try:
            return cached_workload(workload, seed)  # the run's own cache: built once
        except InvalidWorkload as exc:
            _fail(f"killpoint: {exc}")

    def _check_schedule(self, config: "RunConfig") -> None:
        """Refuse, as ``killpoint replay`` does, a schedule that could never fire: a step the
        workload does not have, or a worker no run with these workers ever starts."""
        from killpoint.errors import BadInput, InvalidTarget
        from killpoint.harness.identities import check_schedule

        workload = self._workload(config.workload_spec or config.workload_name, config.seed)
        try:
            check_schedule(config.schedule, steps=workload.step_names, workers=config.workers,
                           owns_state=self._declared(config.target).owns_state)
        except (BadInput, InvalidTarget) as exc:
            _fail(f"killpoint: {exc}")

    def _config(self, schedule: Any, target: Any, workload: Any, workers: int, seed: int | None,
                extra: dict[str, Any]) -> "RunConfig":
        from killpoint.errors import InvalidConfig
        from killpoint.harness.run import RunConfig
        from killpoint.harness.workload import Workload

        self._declared(target)
        seed = self.settings.seed if seed is None else seed
        if isinstance(workload, Workload):
            extra = {"workload_spec": workload, **extra}
            workload = workload.name
        elif workload is not None:
            self._workload(workload, seed)  # a bad name fails here, naming it
        fields = {f.name for f in dataclasses.fields(RunConfig)}
        unknown = sorted(set(extra) - fields)
        if unknown:
            _fail(f"killpoint: unknown keyword {', '.join(map(repr, unknown))}; a run takes target, "
                  f"workload, workers, seed and RunConfig's {', '.join(sorted(fields - _SET_HERE))}")
        try:
            config = RunConfig(schedule=schedule, target=target, workload=workload, workers=workers,
                               seed=seed, store=self.settings.store, **extra)
        except InvalidConfig as exc:
            _fail(f"killpoint: {exc}")
        # --killpoint-real-time: the clock off, as killpoint matrix --real-time (a default timing
        # becomes the real-time one; the reproduce line says --real-time).
        return config.with_clock(False) if self.settings.real_time else config

    def _guard(self) -> None:
        """Crashes must only ever hit children: refuse if this (pytest's) process has failpoints."""
        from killpoint.chaos import points as chaos_points

        if getattr(chaos_points, "_installed", None) is not None:
            raise RuntimeError("killpoint: failpoints are installed in the pytest process itself, so a "
                               "scheduled kill would kill pytest; only worker processes may install them")

    def _jobs(self) -> int:
        """Runs side by side: --killpoint-jobs, else the cores (1 in an xdist worker, already one of many)."""
        from killpoint.harness.jobs import default_jobs

        return self.settings.jobs or (1 if self._state.worker_id else default_jobs())

    def _judge(self, configs: Sequence["RunConfig"], before: Sequence["RunResult"] = ()) -> CrashVerdict:
        """Run ``configs`` and judge them; ``before``: runs made already that belong to the verdict
        (a matrix's fault-free run that was not valid)."""
        session = self._session_getter()
        results: list[Any] = list(before)
        runs = [self._keep(r) for r in before]
        self._guard()
        jobs = self._jobs()
        from killpoint.errors import InvalidTarget

        try:
            for result in session.run_many(configs, jobs=jobs):
                self._guard()
                results.append(result)
                runs.append(self._keep(result))
        except InvalidTarget as exc:  # its setup() refused the run (a store it cannot use)
            _fail(f"killpoint: {exc}")
        target = configs[0].target_name if configs else "none"
        seed = configs[0].seed if configs else self.settings.seed
        return _verdict(runs, results, target, seed)

    def _keep(self, result: "RunResult") -> _Run:
        """Check that a run crashed only children, write its page, record it; what the verdict keeps."""
        _assert_children_only(result)
        page = self._write_page(result)
        config = result.config
        note = "" if "<locals>" not in config.target_name else \
            "a target defined inside a test cannot be named on the command line: name it " \
            "as pkg.module:function to replay it"
        run = _Run(str(config.schedule), result.valid, result.verdict.violations,
                   tuple(result.verdict.unknown_reasons), config.reproduce_command(), page, note)
        self._record(run, result, target=config.target_name, seed=config.seed, page=page)
        return run

    def _write_page(self, result: "RunResult") -> str | None:
        """The run's HTML report, written by the process that holds its history (xdist-safe names)."""
        report_dir = self.settings.report_dir
        if report_dir is None:
            return None
        from killpoint.reports import write_run_report

        from killpoint.reports.files import claim_report_dir

        self._state.pages += 1
        prefix = f"{self._state.worker_id}-" if self._state.worker_id else ""
        path = os.path.join(report_dir, f"{prefix}run-{self._state.pages:04d}.html")
        try:
            claim_report_dir(report_dir)
            return write_run_report(result, path, back=INDEX)
        except OSError as exc:  # a report never hides the verdict
            import warnings

            from killpoint.errors import KillpointWarning

            warnings.warn(f"killpoint: report {path} not written: {exc.strerror or exc}", KillpointWarning,
                          stacklevel=1)  # about the report, not the test that asked for it
            return None

    def _record(self, run: _Run, result: "RunResult | None", *, target: str, seed: int,
                page: str | None = None, count: int = 1) -> None:
        """Keep a plain record of runs for the terminal summary and the index (xdist sends it on)."""
        record = {"nodeid": self._item.nodeid, "schedule": run.schedule, "valid": run.valid,
                  "target": target, "seed": seed, "count": count,
                  "violated": sorted({v.invariant for v in run.violations}),
                  "reproduce": run.reproduce, "page": page,
                  "light": _light(result) if (result is not None and page) else None,
                  "points": _points_fired(result) if result is not None else None}
        self._item.stash.setdefault(_RUNS, []).append(record)
        if page:  # linked from the test: pytest's JUnit XML carries user_properties
            self._item.user_properties.append(("killpoint_report", page))



def _plans(steps: Sequence[str], points: Sequence[str], depth: int,
           actions: "Sequence[str] | str" = ("kill", "pause"),
           order: Sequence[str] | None = None, lease: Sequence[str] | None = None,
           claim: str | None = None) -> list[Any]:
    """What ``matrix()`` runs: the generator's plans, as ``killpoint matrix`` builds them (``order``:
    the target's declared points, the order its attempts pass them in; ``lease``, ``claim``: where
    it holds a lease and where it has just taken one)."""
    from killpoint.chaos import generator

    return generator.matrix(steps, points, depth=depth, actions=_actions(actions), order=order, lease=lease,
                            claim=claim)


# RunConfig fields the fixture sets itself (from its own arguments and the session's options).
_SET_HERE = frozenset({"schedule", "target", "workload", "workers", "seed", "store", "virtual_time",
                       "workload_spec"})


def _fail(message: str) -> NoReturn:
    """Fail the calling test with ``message`` alone: bad input to the fixture, one line."""
    __tracebackhide__ = True
    _collection_error(message)  # the same failure, whether at collection or in a test


def _names(value: "Sequence[str] | str | None", what: str) -> tuple[str, ...] | None:
    """``points=`` or ``steps=`` as ``--points`` reads it: a name, a comma-separated string or a
    sequence of names (None: all)."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(n.strip() for n in items if isinstance(n, str) and n.strip())
    if not names:
        _fail(f"killpoint.matrix({what}={value!r}): name at least one, or leave it out for all")
    if len(names) != len(items):
        _fail(f"killpoint.matrix({what}={value!r}): expected names such as 'after_call'")
    return names


def _actions(actions: "Sequence[str] | str") -> tuple[str, ...]:
    """``actions=`` as ``--actions`` reads it: a comma-separated string or a sequence of names."""
    from killpoint.chaos.generator import ACTIONS

    from killpoint.harness import inputs  # not at load time: the plugin loads in every session

    chosen, wrong = inputs.action_names(actions, ACTIONS)
    if wrong:
        raise ValueError(f"actions={actions!r}: {wrong}")
    return chosen


def _points_fired(result: "RunResult") -> dict[str, Any]:
    """The crash points a run reached and fired, plain enough to travel from an xdist worker."""
    from killpoint.harness.stats import PointStats

    stats = PointStats.of(result.history)
    return {"reached": dict(stats.reached), "fired": [[*key, n] for key, n in sorted(stats.fired.items())]}


def _assert_children_only(result: "RunResult") -> None:
    """A run's workers are processes the harness forked, never pytest (or this xdist worker)."""
    from killpoint.harness.events import HarnessAction

    me = os.getpid()
    for e in result.history.typed(HarnessAction):
        if e.pid == me:
            raise RuntimeError(f"killpoint: run {result.run_id} reports {e.kind} of a worker with the "
                               f"PID of the pytest process ({me}); crashes must only hit child processes")


def _light(result: "RunResult") -> str:
    """The run without its history, pickled: what the controller needs to list it in the index.

    Pickle is fine here: it travels only between this session's own processes (xdist workers and
    their controller), which already trust each other with code.
    """
    from killpoint.harness.history import History

    config = dataclasses.replace(result.config, target=result.config.target_name)
    light = dataclasses.replace(result, config=config, history=History(()))
    return base64.b64encode(pickle.dumps(light)).decode("ascii")


@pytest.fixture(scope="session")
def _killpoint_session(pytestconfig: pytest.Config,
                       tmp_path_factory: pytest.TempPathFactory) -> Generator["Session", None, None]:
    """The services of this session (per xdist worker): the downstream, and a folder for runs.

    Its folder is one of its own (xdist workers never share one): in memory when the machine has it
    (see ``run_files_dir``; a run's files live for milliseconds, and on a disk their fsyncs cost a
    tenth of a matrix), removed when the session ends; else under this process's pytest temporary
    directory. The downstream listens on an ephemeral port; PostgreSQL runs each get a schema of
    their own.
    """
    from killpoint.harness.run import Session, run_files_dir
    from killpoint.harness.store import InvalidStore, StoreUnreachable, check_store

    settings = pytestconfig.stash[_STATE].settings
    try:
        check_store(settings.store)
        problem = None
    except (InvalidStore, StoreUnreachable) as exc:  # one line, never a fixture traceback
        problem = str(exc)
    if problem is not None:
        _fail(f"killpoint: {problem.replace('--store', '--killpoint-store', 1)}")
    base = None if run_files_dir() is not None else str(tmp_path_factory.mktemp("killpoint"))
    with Session(base) as session, _terminate_as_interrupt():
        if session.downstream.pid == os.getpid():
            raise RuntimeError("killpoint: the downstream must be a child process of pytest")
        yield session


@contextlib.contextmanager
def _terminate_as_interrupt() -> Generator[None, None, None]:
    """From this process's first killpoint session on: SIGTERM and SIGHUP (a CI job's timeout,
    ``timeout``, a closed terminal) raise as Ctrl-C does and are remembered, so that pytest ends the
    run in hand (its workers, its PostgreSQL schema) and the session (its folder) as it does on
    Ctrl-C, prints its summary and exits interrupted (:mod:`killpoint._plugin.interrupt`; taken back
    at pytest_unconfigure, so the summary can say what ended the session)."""
    from killpoint._plugin import interrupt

    interrupt.install()
    yield


@pytest.fixture
def killpoint(request: pytest.FixtureRequest) -> Killpoint:
    """Runs crashes and returns verdicts; in a test marked ``@pytest.mark.killpoint``, also
    ``killpoint.verdict``, the verdict of that item's single crash (run before the test body)."""
    state = request.config.stash[_STATE]
    handle = Killpoint(request.node, state,
                       lambda: request.getfixturevalue("_killpoint_session"))
    request.node.stash[_HANDLE] = handle
    case = getattr(request, "param", None)
    if isinstance(case, _Case):
        marker = request.node.get_closest_marker("killpoint")
        kw = _marker_kwargs(request.node.name, marker.kwargs if marker else {})
        from killpoint.chaos.actions import parse as parse_actions
        from killpoint.chaos.schedule import Fault, Schedule

        action = kw["action"] or case.action
        schedule = Schedule((Fault("A", case.point, parse_actions(action), case.step),))
        handle._marked_check = bool(kw["check"])
        handle._verdict = handle.run(schedule, target=kw["target"], workload=kw["workload"],
                                     workers=kw["workers"], seed=kw["seed"])
    return handle
