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

import dataclasses
from typing import Any, Generator

import pytest

from killpoint.vocab import VERDICT_WORDS
# The fixtures are found by pytest as attributes of this module, the plugin it loads.
from killpoint._plugin.fixture import Killpoint, _killpoint_session, killpoint  # noqa: F401 (pytest finds them here)
from killpoint._plugin.marker import (_Case, _case_of, _cases, _collection_error, _declared_target,
                                      _marker_kwargs)
from killpoint._plugin.settings import KillpointUnavailable, Settings, _points, _settings, add_options
from killpoint._plugin.state import _HANDLE, _RUNS, _STATE, _State
from killpoint._plugin.verdict import CrashVerdict
from killpoint._plugin import interrupt as _interrupt

# pytest catches no Ctrl-C while it loads plugins and the first conftest files (a traceback): from
# here until pytest_configure, where it does, Ctrl-C ends it with one line and exit 2.
_interrupt.guard_startup()

__all__ = ["CrashVerdict", "Killpoint", "KillpointUnavailable", "Settings", "killpoint"]


# -- options ------------------------------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    _interrupt.started()
    config.addinivalue_line(
        "markers",
        "killpoint(points=None, target='reference', workers=2, steps=None, actions=('kill', 'pause'), "
        "action=None, workload=None, seed=None, check=True): run the test once per schedule "
        "killpoint matrix runs for the same points (default: those the target declares), steps and "
        "actions, each item with that single fault; the test gets the verdict as killpoint.verdict and fails when it "
        "is not valid (check=False: judge it yourself)")
    settings = _settings(config)
    workerinput = getattr(config, "workerinput", None)  # set on pytest-xdist workers only
    if workerinput is not None and workerinput.get("killpoint_report_dir"):
        # The controller resolved the path: every worker writes into the same folder.
        settings = dataclasses.replace(settings, report_dir=workerinput["killpoint_report_dir"])
    state = _State(settings, workerinput.get("workerid") if workerinput is not None else None)
    config.stash[_STATE] = state
    config.pluginmanager.register(state, "killpoint-session")
    if workerinput is not None or getattr(config.option, "numprocesses", None):
        # Under xdist, from the start: the controller runs no killpoint session of its own, yet a
        # signal must end it with its summary and reach the workers. Without xdist, the session
        # fixture installs them as a killpoint session starts (a session that runs none keeps
        # Python's defaults).
        from killpoint._plugin import interrupt

        interrupt.install()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: Any) -> Any:
    """The tests are over: a SIGTERM or SIGHUP landing in pytest's own teardown (xdist ending its
    workers) no longer raises there (a traceback, exit 1); the session ends interrupted instead."""
    from killpoint._plugin import interrupt

    interrupt.finishing()
    try:
        return (yield)
    finally:
        if interrupt.received_while_finishing():
            session.exitstatus = pytest.ExitCode.INTERRUPTED


@pytest.hookimpl(tryfirst=True)
def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    """Before pytest draws the interrupt's traceback: entries a signal left without a line number
    go (pytest fails on them; see :func:`killpoint._plugin.interrupt.drop_unlocated_frames`)."""
    _interrupt.drop_unlocated_frames(excinfo.tb)


def pytest_unconfigure(config: pytest.Config) -> None:
    from killpoint._plugin import interrupt

    interrupt.uninstall()


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
        declared = _declared_target(name, kwargs["target"])
        points = _points(kwargs["points"], settings, declared.points)
    except ValueError as exc:
        _collection_error(f"{name}: @pytest.mark.killpoint: {exc}")
    _check_steps(name, kwargs, settings)
    cases = _cases(points, kwargs["steps"], kwargs["actions"], kwargs["action"], declared)
    if not cases:
        _collection_error(f"{name}: @pytest.mark.killpoint(points={kwargs['points']!r}, "
                          f"actions={kwargs['actions']!r}) makes no run: a pause is scheduled only "
                          f"where a lease is held "
                          f"({', '.join(declared.lease_points) or 'this target declares no such point'})")
    metafunc.parametrize("killpoint", cases, ids=[c.id for c in cases], indirect=True)


def _check_steps(name: str, kwargs: dict[str, Any], settings: Any) -> None:
    """A marker's ``steps`` must be steps of its workload (at collection, as ``killpoint matrix
    --steps`` refuses them): else every item would run and come out unknown."""
    from killpoint.harness.targets import declared
    from killpoint.harness.workload import InvalidWorkload, Workload, cached_workload, default_for

    workload = kwargs["workload"]
    seed = settings.seed if kwargs["seed"] is None else kwargs["seed"]
    try:
        built = workload if isinstance(workload, Workload) else cached_workload(
            workload if workload is not None else default_for(kwargs["target"], declared(kwargs["target"])), seed)
    except InvalidWorkload as exc:
        _collection_error(f"{name}: @pytest.mark.killpoint(workload={workload!r}): {exc}")
    from killpoint.harness import inputs  # not at load time: the plugin loads in every session
    wrong = inputs.unknown_steps(kwargs["steps"] or (), built.name, built.step_names)
    if wrong:
        _collection_error(f"{name}: @pytest.mark.killpoint(steps={kwargs['steps']!r}): {wrong}")


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


# -- reporting -----------------------------------------------------------------------------------
@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """Attach the item's run records to its teardown report: xdist sends them to the controller.

    The call's report gets a section naming each run's HTML report (pytest shows it under a
    failure), and every report carries them as ``user_properties`` (in pytest's JUnit XML).
    """
    report = yield
    if call.when == "call":
        pages = [(r["schedule"], r["valid"], r["page"]) for r in item.stash.get(_RUNS, None) or () if r.get("page")]
        if pages:
            word = VERDICT_WORDS
            report.sections.append(("killpoint reports", "\n".join(
                f"{word[valid]:<9} {schedule or 'no faults'}: {page}" for schedule, valid, page in pages)))
    if call.when == "teardown":
        records = item.stash.get(_RUNS, None)
        if records:
            report.killpoint_runs = list(records)
            item.stash[_RUNS] = []
    return report


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_newgateway(gateway: Any) -> None:
    """xdist controller: a worker's process was started; a signal this process gets is passed on to
    it from now, while it is still starting. Told only once it was ready, a worker still importing
    and collecting missed it, and the session waited out xdist's 10 s teardown for it (6.8 s from a
    SIGTERM to the exit, under load)."""
    from killpoint._plugin import interrupt

    popen = getattr(getattr(gateway, "_io", None), "popen", None)
    interrupt.worker_started(getattr(popen, "pid", None))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodeready(node: Any) -> None:
    """xdist controller: a worker is up; a SIGTERM or SIGHUP this process gets is passed on to it."""
    from killpoint._plugin import interrupt

    interrupt.worker_started(_worker_pid(node))


def _worker_pid(node: Any) -> Any:
    """The xdist worker's process id: what its ``workerinfo`` says where xdist sends it, else the
    process execnet started for it (xdist 3.8 sends no pid: the signal was passed on to nobody, and
    the session waited out xdist's 10 s for its workers before killing them)."""
    pid = getattr(node, "workerinfo", {}).get("pid")
    if pid is None:
        popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
        pid = getattr(popen, "pid", None)
    return pid


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: give each worker the resolved report dir, so all write into the same one."""
    state = node.config.stash.get(_STATE, None)
    if state is not None and state.settings.report_dir:
        node.workerinput["killpoint_report_dir"] = state.settings.report_dir
