"""killpoint's pytest plugin: crash matrices as ordinary tests, in anyone's CI.

pytest loads this module in every session of an environment that has killpoint installed (the
``pytest11`` entry point ``killpoint``), so at load time it imports pytest and the standard library
only; the harness (processes, HTTP, databases) is imported inside the hooks and fixtures that use it.

What it gives a test suite:

- the ``killpoint`` fixture: ``killpoint.run(schedule, target=...)``, ``killpoint.matrix(...)`` and
  ``killpoint.explore(...)`` return a :class:`CrashVerdict`; ``verdict.assert_valid()`` fails naming
  each violated invariant, the schedule and the command that reproduces the run;
- the marker ``@pytest.mark.killpoint(points=..., target=..., workers=...)``: one test item per crash
  point (``test_checkout[after_call]``), each running that single crash; the test reads the verdict as
  ``killpoint.verdict`` and fails when it is not valid (``check=False`` to judge it yourself);
- options in a ``killpoint`` group with ini equivalents, a terminal summary, HTML reports, and
  scale-out with pytest-xdist (``-n 2``) and ``--killpoint-shard K/N``.

The downstream service starts once per session (per xdist worker) and every run gets a run id, a
store and a folder of its own, so tests never see each other's runs. Injected crashes only ever kill
processes the harness forked: the fixture refuses to run when failpoints are installed in the pytest
process itself, and fails loudly if a run ever reports a worker with pytest's PID.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import pickle
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generator, NoReturn, Sequence

import pytest

if TYPE_CHECKING:
    from killpoint.chaos.schedule import Schedule
    from killpoint.harness.workload import Workload
    from killpoint.harness.checkers.base import Violation
    from killpoint.harness.run import RunConfig, RunResult, Session

__all__ = ["CrashVerdict", "Killpoint", "KillpointUnavailable", "Settings"]

# Every option: its name after the --killpoint- prefix (the ini key is killpoint_NAME), metavar, help.
_OPTIONS = (
    ("store", "STORE", "where runs keep their state: sqlite (default, a file per run) or a "
                       "postgresql:// URL (a schema per run)"),
    ("report-dir", "DIR", "write an HTML report per crash run and an index over them into DIR"),
    ("seed", "N", "seed for the workload data and every random draw of a run (default: 0)"),
    ("points", "P1,P2", "only these crash points in marked tests, matrices and explorations "
                        "(default: all)"),
    ("budget", "N", "schedules killpoint.explore() draws when the test does not say (default: 100)"),
    ("shard", "K/N", "run only the K-th of N deterministic shares of the crash points of marked "
                     "tests, of each killpoint.matrix() and of each exploration's budget"),
)
DEFAULT_BUDGET = 100
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
INDEX = "index.html"


class KillpointUnavailable(RuntimeError):
    """Asked for a part of killpoint this installation does not have (e.g. exploration)."""


@dataclass(frozen=True)
class Settings:
    """The resolved options of this session (command line over ini over defaults)."""

    store: str = "sqlite"
    report_dir: str | None = None  # absolute; None: no HTML reports
    seed: int = 0
    points: tuple[str, ...] | None = None  # None: every point
    budget: int = DEFAULT_BUDGET
    shard: tuple[int, int] = (1, 1)  # (K, N), 1 <= K <= N

    def in_shard(self, position: int) -> bool:
        """Whether the ``position``-th (0-based) member of a deterministic list is this shard's.

        Round robin, so shares differ by at most one member and together cover the list.
        """
        k, n = self.shard
        return position % n == k - 1


@dataclass(frozen=True)
class _Case:
    """One item of a marked test: a single crash at ``point`` (of ``step``, or any step)."""

    point: str
    step: str | None

    @property
    def id(self) -> str:
        return f"{self.step}.{self.point}" if self.step else self.point


class _State:
    """Per-process plugin state and the session-end hooks, registered once per config.

    A plugin object rather than module globals: pytester can run several sessions in one process.
    """

    def __init__(self, settings: Settings, worker_id: str | None) -> None:
        self.settings = settings
        self.worker_id = worker_id  # the xdist worker id (gw0, ...); None on the controller or without xdist
        self.pages = 0  # run report pages this process wrote
        self.records: list[dict[str, Any]] = []  # every run of the session, for the summary and index
        self.index: str | None = None  # the HTML index, once written
        self.index_error: str | None = None
        self.failed: set[str] = set()  # node ids of tests that failed or errored

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Collect run records (on the controller they arrive from xdist workers in reports)."""
        self.records.extend(getattr(report, "killpoint_runs", None) or ())
        if report.failed:
            self.failed.add(report.nodeid)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Write the HTML index over every run of the session: on the controller only, once."""
        if self.worker_id is not None or self.settings.report_dir is None:
            return
        lights = sorted((r for r in self.records if r.get("light")), key=lambda r: (r["nodeid"], r["page"]))
        if not lights:
            return
        from killpoint.reports.model import build_index
        from killpoint.reports.render import render_index, write_text

        results = [pickle.loads(base64.b64decode(r["light"])) for r in lights]
        model = build_index(results, [os.path.basename(r["page"]) for r in lights],
                            title="killpoint: pytest session", reproduce=[r["reproduce"] for r in lights])
        self.index = write_text(os.path.join(self.settings.report_dir, INDEX), render_index(model))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.worker_id is not None or not self.records:
            return
        _summary(terminalreporter, self)


_STATE = pytest.StashKey[_State]()
_HANDLE = pytest.StashKey["Killpoint"]()  # the fixture object of an item, for the after-body check
_RUNS = pytest.StashKey[list]()  # records of the runs an item made


# -- options ------------------------------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("killpoint", "crash-injection testing (killpoint)")
    for name, metavar, help_text in _OPTIONS:
        ini = "killpoint_" + name.replace("-", "_")
        group.addoption(f"--killpoint-{name}", dest=ini, metavar=metavar, default=None,
                        help=f"{help_text}; ini: {ini}")
        parser.addini(ini, help_text, default=None)


def _raw(config: pytest.Config, name: str) -> tuple[str | None, str]:
    """The value of one option and where it came from (for error messages and relative paths)."""
    key = "killpoint_" + name.replace("-", "_")
    value = config.getoption(key)
    if value is not None:
        return str(value), f"--killpoint-{name}"
    value = config.getini(key)
    return (str(value).strip() or None) if value is not None else None, f"ini {key}"


def _settings(config: pytest.Config) -> Settings:
    """Read and check every option once, at configure time: bad values stop the session early."""
    values: dict[str, Any] = {}
    store, where = _raw(config, "store")
    if store is not None:
        if store != "sqlite" and not store.startswith(("postgresql://", "postgres://")):
            raise pytest.UsageError(f"{where} {store!r}: expected 'sqlite' or a postgresql:// URL")
        values["store"] = store
    report_dir, where = _raw(config, "report-dir")
    if report_dir is not None:
        base = config.invocation_params.dir if where.startswith("--") else \
            (config.inipath.parent if config.inipath else config.rootpath)
        values["report_dir"] = os.path.abspath(os.path.join(base, report_dir))
    for name, low in (("seed", 0), ("budget", 1)):
        text, where = _raw(config, name)
        if text is None:
            continue
        try:
            number = int(text)
        except ValueError:
            number = low - 1
        if number < low:
            raise pytest.UsageError(f"{where} {text!r}: expected a whole number of at least {low}")
        values[name] = number
    points, where = _raw(config, "points")
    if points is not None:
        from killpoint.chaos.points import ORDERED_POINTS

        # Any name: a target may declare points of its own; each marked test or matrix then runs
        # the declared points among these.
        chosen = tuple(p.strip() for p in points.split(",") if p.strip())
        bad = [p for p in chosen if not _NAME.match(p)]
        if bad or not chosen:
            raise pytest.UsageError(f"{where}: bad crash point name {', '.join(map(repr, bad)) or repr(points)}; "
                                    f"give names such as {', '.join(ORDERED_POINTS[:3])} or a target's own")
        values["points"] = chosen
    shard, where = _raw(config, "shard")
    if shard is not None:
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", shard)
        if not m or not 1 <= int(m[1]) <= int(m[2]):
            raise pytest.UsageError(f"{where} {shard!r}: expected K/N with 1 <= K <= N, as in 1/4")
        values["shard"] = (int(m[1]), int(m[2]))
    return Settings(**values)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "killpoint(points=None, target='reference', workers=2, steps=None, action=None, "
        "workload=None, seed=None, check=True): run the test once per crash point the target "
        "declares, each item "
        "with that single crash; the test gets the verdict as killpoint.verdict and fails when it "
        "is not valid (check=False: judge it yourself)")
    settings = _settings(config)
    workerinput = getattr(config, "workerinput", None)  # set on pytest-xdist workers only
    if workerinput is not None and workerinput.get("killpoint_report_dir"):
        # The controller resolved the path: every worker writes into the same folder.
        settings = dataclasses.replace(settings, report_dir=workerinput["killpoint_report_dir"])
    state = _State(settings, workerinput.get("workerid") if workerinput is not None else None)
    config.stash[_STATE] = state
    config.pluginmanager.register(state, "killpoint-session")


# -- the marker ----------------------------------------------------------------------------------
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("killpoint")
    if marker is None:
        return
    name = metafunc.definition.name
    if "killpoint" not in metafunc.fixturenames:
        _collection_error(
            f"{name} is marked @pytest.mark.killpoint but does not take the killpoint fixture, "
            f"which hands it each crash's verdict: write def {name}(killpoint): ...")
    if marker.args:
        _collection_error(f"{name}: @pytest.mark.killpoint takes keywords only, "
                                f"as in @pytest.mark.killpoint(points=['after_call'])")
    kwargs = _marker_kwargs(name, marker.kwargs)
    settings = metafunc.config.stash[_STATE].settings
    try:
        points = _points(kwargs["points"], settings, _declared_points(name, kwargs["target"]))
    except ValueError as exc:
        _collection_error(f"{name}: @pytest.mark.killpoint: {exc}")
    cases = [_Case(point, step) for step in (kwargs["steps"] or (None,)) for point in points]
    metafunc.parametrize("killpoint", cases, ids=[c.id for c in cases], indirect=True)


_MARKER_KEYS = ("points", "target", "workers", "steps", "action", "workload", "seed", "check")


def _marker_kwargs(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Check a marker's keywords at collection, so a typo is a collection error naming it."""
    unknown = sorted(set(kwargs) - set(_MARKER_KEYS))
    if unknown:
        _collection_error(f"{name}: @pytest.mark.killpoint got unknown keyword "
                                f"{', '.join(map(repr, unknown))}; it takes {', '.join(_MARKER_KEYS)}")
    out = {"points": None, "target": "reference", "workers": 2, "steps": None, "action": None,
           "workload": None, "seed": None, "check": True, **kwargs}
    for key in ("points", "steps"):
        value = out[key]
        if isinstance(value, str):
            value = [value]
        if value is not None:
            value = tuple(value)
            bad = [v for v in value if not isinstance(v, str) or not _NAME.match(v)]
            if bad or not value:
                _collection_error(f"{name}: @pytest.mark.killpoint({key}={out[key]!r}): expected "
                                        f"names such as 'after_call'")
        out[key] = value
    if out["action"] is not None:
        from killpoint.chaos.actions import InvalidAction, parse

        try:
            parse(out["action"])
        except InvalidAction as exc:
            _collection_error(f"{name}: @pytest.mark.killpoint(action={out['action']!r}): {exc}")
    return out


def _collection_error(message: str) -> NoReturn:
    """Fail the collection of a test with just ``message`` (the plugin's traceback helps nobody)."""
    __tracebackhide__ = True
    pytest.fail(message, pytrace=False)


def _points(asked: Sequence[str] | None, settings: Settings,
            declared: Sequence[str] | None = None) -> tuple[str, ...]:
    """The points a marked test or a matrix runs: its own (or all the target declares), narrowed by
    --killpoint-points. A point the target does not declare is never scheduled."""
    from killpoint.chaos.points import DEFAULT_POINTS

    declared = tuple(declared) if declared else DEFAULT_POINTS
    points = tuple(asked) if asked else declared
    undeclared = [p for p in points if p not in declared]
    if undeclared:
        raise ValueError(f"points {undeclared!r}: the target does not declare them; it declares "
                         f"{', '.join(declared)}")
    if settings.points is not None:
        narrowed = tuple(p for p in points if p in settings.points)
        if points and not narrowed:
            raise ValueError(f"--killpoint-points {','.join(settings.points)} leaves none of the points "
                             f"this target declares ({', '.join(points)})")
        points = narrowed
    return points


def _declared_points(name: str, target: Any) -> tuple[str, ...]:
    """The crash points a marked test's target declares (a collection error if it cannot be found)."""
    from killpoint.harness.targets import InvalidTarget, declared

    try:
        return declared(target).points
    except InvalidTarget as exc:
        _collection_error(f"{name}: @pytest.mark.killpoint(target={target!r}): {exc}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the marked items of other shards: round robin over marked items in collection order,
    which is the same in every CI job that runs the same command."""
    settings = config.stash[_STATE].settings
    if settings.shard == (1, 1):
        return
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    position = 0
    for item in items:
        if isinstance(_case_of(item), _Case):
            (keep if settings.in_shard(position) else dropped).append(item)
            position += 1
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def _case_of(item: pytest.Item) -> _Case | None:
    callspec = getattr(item, "callspec", None)
    case = callspec.params.get("killpoint") if callspec is not None else None
    return case if isinstance(case, _Case) else None


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    """After the body of a marked test passed, fail it if its crash run was not valid.

    After, not before: the body's own assertions (or its call of ``assert_valid``) report first.
    """
    result = yield
    handle = pyfuncitem.stash.get(_HANDLE, None)
    if handle is not None and handle._marked_check and handle._verdict is not None \
            and handle._verdict.valid is not True:
        pytest.fail(handle._verdict.explain(
            "this test is marked @pytest.mark.killpoint, so its crash run must be valid "
            "(mark it with check=False to judge killpoint.verdict yourself)"), pytrace=False)
    return result


# -- the verdict ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Run:
    """What a verdict keeps of one run: enough to explain it and to reproduce it."""

    schedule: str
    valid: bool | None
    violations: tuple["Violation", ...]
    unknown: tuple[str, ...]
    reproduce: str
    report: str | None
    note: str = ""  # e.g. why the reproduce command cannot name the target


@dataclass(frozen=True)
class CrashVerdict:
    """The verdict over one or more crash runs: valid is True, False, or None (unknown).

    Unknown -- a run that could not be judged, such as a scheduled fault that never fired -- is never
    valid: ``assert_valid`` fails on it too. Don't write ``assert verdict`` (a verdict has no truth
    value); write ``verdict.assert_valid()`` or test ``verdict.valid``.
    """

    valid: bool | None
    runs: int
    results: tuple["RunResult", ...] = field(repr=False)  # every run, with its history (none for an exploration)
    report_path: str | None  # HTML report of the first run that was not valid (else the first run)
    target: str
    seed: int
    _runs: tuple[_Run, ...] = field(default=(), repr=False)

    @property
    def violations(self) -> tuple["Violation", ...]:
        """Every violation of every run; each names its invariant, instance, step and schedule."""
        return tuple(v for r in self._runs for v in r.violations)

    @property
    def unknown_reasons(self) -> tuple[str, ...]:
        return tuple(f"{r.schedule or 'no faults'}: {why}" for r in self._runs for why in r.unknown)

    @property
    def reproduce(self) -> tuple[str, ...]:
        """The command that reproduces each run that was not valid."""
        return tuple(r.reproduce for r in self._runs if r.valid is not True)

    def __bool__(self) -> bool:
        raise TypeError("a CrashVerdict has no truth value (it may be unknown): use "
                        "verdict.assert_valid() or compare verdict.valid with True, False or None")

    def explain(self, why: str = "") -> str:
        """The failure message: each violated invariant with its schedule and reproduce command."""
        bad = [r for r in self._runs if r.valid is not True]
        violated = sum(1 for r in bad if r.valid is False)
        runs = f"{self.runs} crash run{'s' if self.runs != 1 else ''}"
        head = (f"killpoint: {violated} of {runs} violated an invariant" if violated else
                f"killpoint: {len(bad)} of {runs} could not be judged, so the verdict is unknown")
        lines = [f"{head} (target {self.target}, seed {self.seed})" + (f"; {why}" if why else "")]
        for r in bad:
            if r.violations:
                names = ", ".join(dict.fromkeys(v.invariant for v in r.violations))
                lines += ["", f"VIOLATED {names} under {r.schedule or 'no faults'}"]
                lines += [f"  {v.invariant} at {v.instance}:{v.step}: {v.detail}" for v in r.violations]
            else:
                lines += ["", f"UNKNOWN under {r.schedule or 'no faults'}"]
                lines += [f"  {reason}" for reason in r.unknown or ("the verdict is unknown",)]
            lines += _tail(r)
        return "\n".join(lines)

    def assert_valid(self) -> None:
        """Fail (AssertionError) unless every run was valid, naming what was violated and how to replay it."""
        __tracebackhide__ = True
        if self.valid is not True:
            raise AssertionError(self.explain())


def _tail(r: _Run) -> list[str]:
    lines = [f"  reproduce: {r.reproduce}"]
    if r.note:
        lines.append(f"  ({r.note})")
    if r.report:
        lines.append(f"  report: {r.report}")
    return lines


def _verdict(runs: Sequence[_Run], results: Sequence["RunResult"], target: str, seed: int, *,
             total: int | None = None) -> CrashVerdict:
    """Rank the runs (False > None > True); no runs at all is unknown, never valid."""
    from killpoint.harness.checkers.base import rank

    total = len(runs) if total is None else total
    valid = (rank(r.valid for r in runs) if runs else True) if total else None
    first_bad = next((r for r in runs if r.valid is not True and r.report), None)
    report = first_bad.report if first_bad else next((r.report for r in runs if r.report), None)
    return CrashVerdict(valid, total, tuple(results), report, target, seed, tuple(runs))


# -- the fixture ---------------------------------------------------------------------------------
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
        """This session's options (store, report dir, seed, points, budget, shard)."""
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
                pytest.fail(f"killpoint: schedule {schedule[:200]!r}: {exc}", pytrace=False)
        else:
            parsed = schedule
        return self._judge([self._config(parsed, target, workload, workers, seed, config)])

    def matrix(self, *, target: "str | Callable[..., None]" = "reference",
               points: Sequence[str] | None = None, steps: Sequence[str] | None = None, depth: int = 1,
               workload: "str | Workload | None" = None, workers: int = 2, seed: int | None = None,
               **config: Any) -> CrashVerdict:
        """Every single crash at each point of each step, as ``killpoint matrix`` runs them; with
        ``depth=2`` every ordered pair of crashes on a step (``killpoint matrix --depth 2``).

        Points default to all the target declares (narrowed by ``--killpoint-points``); under
        ``--killpoint-shard K/N`` this runs the K-th share of the list, which is the same in every job.
        """
        from killpoint.harness.workload import default_for, resolve_workload

        seed = self.settings.seed if seed is None else seed
        declared = self._declared(target)
        built = resolve_workload(workload if workload is not None else default_for(target, declared), seed)
        known = built.step_names
        points = [points] if isinstance(points, str) else points
        steps = (steps,) if isinstance(steps, str) else tuple(steps) if steps is not None else known
        bad = [s for s in steps if s not in known]
        if bad:
            raise ValueError(f"steps {bad!r}: the {built.name} workload's steps are {', '.join(known)}")
        schedules = _schedules(steps, _points(points, self.settings, declared.points), depth)
        mine = [s for i, s in enumerate(schedules) if self.settings.in_shard(i)]
        if schedules and not mine:
            k, n = self.settings.shard
            pytest.skip(f"shard {k}/{n} has no share of this matrix of {len(schedules)} schedules")
        return self._judge([self._config(s, target, workload, workers, seed, {**needs, **config})
                            for s, needs in mine])

    def explore(self, *, target: str = "reference", budget: int | None = None, seed: int | None = None,
                workload: str | None = None, workers: int = 2) -> CrashVerdict:
        """Schedules drawn with Hypothesis (``killpoint explore``), a failure shrunk to a minimal one.

        ``budget`` defaults to ``--killpoint-budget``. Under ``--killpoint-shard K/N`` this job draws
        its share of the budget from a seed of its own, so N jobs together draw the whole budget.
        """
        import argparse
        import contextlib
        import importlib
        import io
        import json

        try:
            command = importlib.import_module("killpoint.harness.commands.explore")
        except ModuleNotFoundError as exc:
            if exc.name != "killpoint.harness.commands.explore":
                raise
            raise KillpointUnavailable(
                "killpoint.explore() needs schedule exploration (the `killpoint explore` command), "
                "which this killpoint installation does not have yet; use killpoint.matrix() for "
                "every single crash, or killpoint.run(schedule) for one") from None
        if not isinstance(target, str):
            raise TypeError("killpoint.explore(target=...) takes a name: 'reference', 'mutant:NAME' "
                            "or 'pkg.module:function'")
        k, n = self.settings.shard
        total = self.settings.budget if budget is None else budget
        share = total // n + (1 if k - 1 < total % n else 0)
        if total and not share:
            pytest.skip(f"shard {k}/{n} has no share of an exploration budget of {total}")
        seed = (self.settings.seed if seed is None else seed) + (k - 1)
        parser = argparse.ArgumentParser(prog="killpoint explore")
        command.add_arguments(parser)
        argv = ["--target", target, "--budget", str(share), "--seed", str(seed),
                "--workers", str(workers), "--store", self.settings.store, "--json"]
        if workload is not None:
            argv += ["--workload", workload]
        if self.settings.points is not None:
            argv += ["--points", ",".join(self.settings.points)]
        args = parser.parse_args(argv)
        self._guard()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            command.run(args)
        return self._from_json(json.loads(out.getvalue()), target, seed, workload, workers)

    # -- inside ------------------------------------------------------------------------------
    def _declared(self, target: Any) -> Any:
        """The target with its declaration, or a test failure naming the bad target."""
        from killpoint.harness.targets import InvalidTarget, declared

        try:
            return declared(target)
        except InvalidTarget as exc:
            problem = str(exc)
        pytest.fail(f"killpoint: {problem}", pytrace=False)

    def _config(self, schedule: Any, target: Any, workload: Any, workers: int, seed: int | None,
                extra: dict[str, Any]) -> "RunConfig":
        from killpoint.harness.run import RunConfig
        from killpoint.harness.workload import InvalidWorkload, Workload, resolve_workload

        self._declared(target)
        seed = self.settings.seed if seed is None else seed
        if isinstance(workload, Workload):
            extra = {"workload_spec": workload, **extra}
            workload = workload.name
        elif workload is not None:
            try:
                resolve_workload(workload, seed)
            except InvalidWorkload as exc:
                pytest.fail(f"killpoint: {exc}", pytrace=False)
        return RunConfig(schedule=schedule, target=target, workload=workload, workers=workers,
                         seed=seed, store=self.settings.store, **extra)

    def _guard(self) -> None:
        """Crashes must only ever hit children: refuse if this (pytest's) process has failpoints."""
        from killpoint.chaos import points as chaos_points

        if getattr(chaos_points, "_installed", None) is not None:
            raise RuntimeError("killpoint: failpoints are installed in the pytest process itself, so a "
                               "scheduled kill would kill pytest; only worker processes may install them")

    def _judge(self, configs: Sequence["RunConfig"]) -> CrashVerdict:
        from killpoint.harness.commands.common import replay_command

        session = self._session_getter()
        results, runs = [], []
        for config in configs:
            self._guard()
            result = session.run(config)
            _assert_children_only(result)
            page = self._write_page(result)
            note = "" if "<locals>" not in config.target_name else \
                "a target defined inside a test cannot be named on the command line: name it " \
                "as pkg.module:function to replay it"
            run = _Run(str(config.schedule), result.valid, result.verdict.violations,
                       tuple(result.verdict.unknown_reasons), replay_command(result), page, note)
            results.append(result)
            runs.append(run)
            self._record(run, result, target=config.target_name, seed=config.seed, page=page)
        target = configs[0].target_name if configs else "none"
        seed = configs[0].seed if configs else self.settings.seed
        return _verdict(runs, results, target, seed)

    def _from_json(self, data: dict[str, Any], target: str, seed: int, workload: str,
                   workers: int) -> CrashVerdict:
        """A verdict from a command's ``--json`` object (DESIGN section 10); it has no histories."""
        import types

        from killpoint import chaos
        from killpoint.harness.checkers.base import Violation
        from killpoint.harness.commands.common import replay_command
        from killpoint.harness.run import RunConfig

        found: dict[str, list[Violation]] = {}
        commands: dict[str, str] = {}
        for v in data.get("violations", []):
            schedule = v.get("schedule", "")
            found.setdefault(schedule, []).append(Violation(
                v["invariant"], v.get("instance"), v.get("step"), v.get("detail", ""),
                tuple(v.get("events", ())), schedule))
            commands[schedule] = v.get("reproduce", "")
        runs = [_Run(schedule, False, tuple(vs), (), commands[schedule], None) for schedule, vs in found.items()]
        for u in data.get("unknown", []):
            schedule = u.get("schedule", "")
            if schedule in found:
                continue
            config = RunConfig(schedule=chaos.parse(schedule), target=target, workload=workload,
                               workers=workers, seed=seed, store=self.settings.store)
            runs.append(_Run(schedule, None, (), tuple(u.get("reasons", ())),
                             replay_command(types.SimpleNamespace(config=config)), None))
        total = max(int(data.get("runs", len(runs))), len(runs))
        for run in runs:
            self._record(run, None, target=target, seed=seed)
        if total > len(runs):  # the valid runs, as one record: an exploration may make thousands
            self._record(_Run("", True, (), (), "", None), None, target=target, seed=seed,
                         count=total - len(runs))
        verdict = _verdict(runs, (), target, seed, total=total)
        return dataclasses.replace(verdict, report_path=data.get("report") or verdict.report_path)

    def _write_page(self, result: "RunResult") -> str | None:
        """The run's HTML report, written by the process that holds its history (xdist-safe names)."""
        report_dir = self.settings.report_dir
        if report_dir is None:
            return None
        from killpoint.reports import write_run_report

        self._state.pages += 1
        prefix = f"{self._state.worker_id}-" if self._state.worker_id else ""
        path = os.path.join(report_dir, f"{prefix}run-{self._state.pages:04d}.html")
        os.makedirs(report_dir, exist_ok=True)
        return write_run_report(result, path, back=INDEX)

    def _record(self, run: _Run, result: "RunResult | None", *, target: str, seed: int,
                page: str | None = None, count: int = 1) -> None:
        """Keep a plain record of runs for the terminal summary and the index (xdist sends it on)."""
        record = {"nodeid": self._item.nodeid, "schedule": run.schedule, "valid": run.valid,
                  "target": target, "seed": seed, "count": count,
                  "violated": sorted({v.invariant for v in run.violations}),
                  "reproduce": run.reproduce, "page": page,
                  "light": _light(result) if (result is not None and page) else None}
        self._item.stash.setdefault(_RUNS, []).append(record)


def _schedules(steps: Sequence[str], points: Sequence[str], depth: int) -> list[tuple[Any, dict[str, Any]]]:
    """The matrix as ``killpoint matrix`` builds it: (schedule, RunConfig fields it needs) pairs."""
    from killpoint.harness.commands import matrix

    if depth == 1:
        return [(s, {}) for s in matrix.single_crash_schedules(steps, points)]
    pairs = getattr(matrix, "double_crash_schedules", None)
    if depth == 2 and pairs is None:
        raise KillpointUnavailable("killpoint.matrix(depth=2) needs the double-crash matrix "
                                   "(`killpoint matrix --depth 2`), which this installation does not "
                                   "have yet; use depth=1")
    if depth == 2:
        # Each pair comes with the restart rule its second fault needs.
        return [(s, {"same_identity": same}) for s, same in pairs(steps, points)]
    raise ValueError(f"killpoint.matrix(depth={depth!r}): depth is 1 (single crashes) or 2 (pairs)")


def _assert_children_only(result: "RunResult") -> None:
    """A run's workers are processes the harness forked, never pytest (or this xdist worker)."""
    me = os.getpid()
    for e in result.history.events:
        if e.process == "harness" and e.get("pid") == me:
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

    Its folder is under this process's pytest temporary directory, so xdist workers never share one;
    the downstream listens on an ephemeral port; PostgreSQL runs each get a schema of their own.
    """
    from killpoint.harness.run import Session
    from killpoint.harness.store import InvalidStore, check_store

    settings = pytestconfig.stash[_STATE].settings
    try:
        check_store(settings.store)
        problem = None
    except InvalidStore as exc:
        problem = str(exc)
    if problem is not None:
        pytest.fail(f"killpoint: {problem.replace('--store', '--killpoint-store', 1)}", pytrace=False)
    with Session(str(tmp_path_factory.mktemp("killpoint"))) as session:
        if session.downstream.pid == os.getpid():
            raise RuntimeError("killpoint: the downstream must be a child process of pytest")
        yield session


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

        action = kw["action"] or ("hang" if case.point == "heartbeat" else "kill")
        schedule = Schedule((Fault("A", case.point, parse_actions(action), case.step),))
        handle._marked_check = bool(kw["check"])
        handle._verdict = handle.run(schedule, target=kw["target"], workload=kw["workload"],
                                     workers=kw["workers"], seed=kw["seed"])
    return handle


# -- reporting -----------------------------------------------------------------------------------
@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """Attach the item's run records to its teardown report: xdist sends them to the controller."""
    report = yield
    if call.when == "teardown":
        records = item.stash.get(_RUNS, None)
        if records:
            report.killpoint_runs = list(records)
            item.stash[_RUNS] = []
    return report


def _summary(tr: Any, state: _State) -> None:
    """The closing lines: runs, violations by invariant, the HTML index, the reproduce commands."""
    records = sorted(state.records, key=lambda r: r["nodeid"])
    runs = sum(r.get("count", 1) for r in records)
    counts = {word: sum(r.get("count", 1) for r in records if r["valid"] is value)
              for word, value in (("valid", True), ("violated", False), ("unknown", None))}
    tests = len({r["nodeid"] for r in records})
    shard = state.settings.shard
    tr.write_sep("=", "killpoint")
    tr.write_line(f"{runs} crash run{'s' if runs != 1 else ''} in {tests} test{'s' if tests != 1 else ''}: "
                  f"{counts['valid']} valid, {counts['violated']} violated, {counts['unknown']} unknown"
                  + (f" (shard {shard[0]}/{shard[1]})" if shard != (1, 1) else ""))
    by_invariant: dict[str, int] = {}
    for r in records:
        for name in r["violated"]:
            by_invariant[name] = by_invariant.get(name, 0) + 1
    if by_invariant:
        tr.write_line("violations by invariant (runs):")
        for name, n in sorted(by_invariant.items(), key=lambda kv: (-kv[1], kv[0])):
            tr.write_line(f"  {name:<24} {n}")
    if state.index:
        tr.write_line(f"HTML report: {state.index}")
    elif state.index_error:
        tr.write_line(state.index_error)
    elif counts["valid"] != runs and state.settings.report_dir is None:
        tr.write_line("HTML report: none (pass --killpoint-report-dir DIR to write one)")
    bad = [r for r in records if r["valid"] is not True and r["nodeid"] in state.failed]
    judged = sum(r.get("count", 1) for r in records if r["valid"] is not True and r["nodeid"] not in state.failed)
    if judged:
        tr.write_line(f"not valid, in tests that passed and so expected it: {judged} "
                      f"run{'s' if judged != 1 else ''}")
    if bad:
        tr.write_line("reproduce:")
        for r in bad[:20]:
            tr.write_line(f"  {r['nodeid']} ({', '.join(r['violated']) or 'unknown'}): {r['reproduce']}")
        if len(bad) > 20:
            tr.write_line(f"  ... and {len(bad) - 20} more")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: give each worker the resolved report dir, so all write into the same one."""
    state = node.config.stash.get(_STATE, None)
    if state is not None and state.settings.report_dir:
        node.workerinput["killpoint_report_dir"] = state.settings.report_dir
