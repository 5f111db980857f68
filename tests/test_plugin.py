"""The pytest plugin, as its users meet it: test suites run by a real pytest in a subprocess.

Each ``pytester`` run below is a fresh ``python -m pytest`` that loads the plugin the way users get
it, through the ``pytest11`` entry point of the installed package. Suites stay small (the ``single``
workload or a few points) so the whole module runs in well under a minute on two cores.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import re
import shutil
import sys
from importlib.metadata import entry_points

import pytest
from hang import HANG_S, not_an_xdist_worker

pytest_plugins = ["pytester"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A worker whose commit trusts its old lease: a stale write gets through after a takeover.
BROKEN_WORKER = '''
from killpoint import ReferenceWorker
from killpoint.harness.mutants import BlindCommits


class TrustsItsLease(ReferenceWorker):
    def __init__(self, ctx):
        super().__init__(ctx)
        self.store = BlindCommits(self.store)  # commits with no compare-and-set


def run(ctx):
    TrustsItsLease(ctx).run()
'''

REFERENCE_SUITE = '''
import os

import pytest


def test_one_run(killpoint):
    verdict = killpoint.run("A@charge.after_call:kill")
    verdict.assert_valid()
    assert verdict.valid is True and verdict.runs == 1 and verdict.violations == ()
    # Every process a crash hit was a child of this pytest process, never pytest itself.
    spawned = [e.get("pid") for e in verdict.results[0].history.events
               if e.process == "harness" and e.kind == "spawn"]
    assert spawned and os.getpid() not in spawned


def test_a_matrix(killpoint):
    verdict = killpoint.matrix(steps=["charge"], points=["after_call", "in_call"])
    # as killpoint matrix runs them: the kills, then A frozen past its lease at the same points,
    # back in the takeover window (after the new holder's claim) and after the step moved on
    assert [r.schedule for r in verdict.results] == [
        "A@charge.after_call:kill", "A@charge.in_call:kill",
        "A@charge.after_call:1*pause(until=after_claim)", "A@charge.after_call:1*pause",
        "A@charge.in_call:1*pause(until=after_claim)", "A@charge.in_call:1*pause"]
    verdict.assert_valid()


def test_a_matrix_of_crash_pairs(killpoint):
    verdict = killpoint.matrix(steps=["charge"], points=["after_call"], depth=2)
    assert [r.schedule for r in verdict.results] == [
        "A@charge.after_call:kill,B@charge.after_call:kill",  # the worker that recovers dies too
        "A@charge.after_call:kill,A@charge.after_call#2:kill"]  # A, restarted as itself, dies again
    verdict.assert_valid()


def test_failpoints_installed_in_the_pytest_process_itself_are_refused(killpoint):
    from killpoint.chaos import points as chaos_points
    from killpoint.chaos.journal import NullJournal

    chaos_points.install(chaos_points.Failpoints([], NullJournal()))  # a kill here would kill pytest
    try:
        with pytest.raises(RuntimeError, match="pytest process itself"):
            killpoint.run("A@charge.after_call:kill")
    finally:
        chaos_points.install(None)


@pytest.mark.killpoint(points=["after_claim", "after_call"])
def test_checkout(killpoint):
    # The item ran its one crash, and the crash fired.
    (run,) = killpoint.verdict.results
    assert killpoint.verdict.valid is True and list(run.fired.values()) == [1]
'''

BROKEN_SUITE = '''
import pytest


def test_a_stale_commit(killpoint):
    killpoint.run("A@charge.after_call:1*pause", target="broken_worker:run").assert_valid()


def test_a_mutant(killpoint):
    killpoint.run("A@charge.after_call:1*pause", target="mutant:no-fence-check").assert_valid()


@pytest.mark.killpoint(points=["after_call"], action="1*pause", target="broken_worker:run")
def test_marked_without_assertions(killpoint):
    pass  # the plugin judges the verdict after the body


@pytest.mark.killpoint(points=["after_call"], action="1*pause", target="broken_worker:run", check=False)
def test_marked_expecting_a_catch(killpoint):
    assert killpoint.verdict.valid is False
    assert "stale_writes_rejected" in {v.invariant for v in killpoint.verdict.violations}
'''


def runpytest(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """A real pytest in a subprocess: for everything that runs crashes (they fork the pytest process).

    The inner suites use no Hypothesis, whose pytest plugin alone costs most of a second per process.
    """
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", *args,
                                         timeout=HANG_S)


def inprocess(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """pytest in this process: only for sessions that end before any run (help, collection, bad options)."""
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)


def summary_of(result: pytest.RunResult) -> str:
    """The plugin's closing section of a pytest run's output."""
    text = result.stdout.str()
    start = text.index("= killpoint =")
    end = text.find("\n=", start + 1)
    return text[start:end if end != -1 else len(text)]


# -- registration and load cost --------------------------------------------------------------------
def test_the_plugin_is_registered_as_the_pytest11_entry_point_killpoint():
    found = {e.name: e.value for e in entry_points(group="pytest11")}
    assert found.get("killpoint") == "killpoint.plugin"


def test_the_plugin_modules_import_only_pytest_and_the_standard_library_at_load_time():
    # pytest loads the plugin in every session; the harness must load only when a test uses it.
    paths = [os.path.join(ROOT, "killpoint", "plugin.py")] + sorted(
        glob.glob(os.path.join(ROOT, "killpoint", "_plugin", "*.py")))
    for path in paths:
        with open(path) as fh:
            tree = ast.parse(fh.read())
        top: list[str] = []
        for node in tree.body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
                continue
            if isinstance(node, ast.Import):
                top += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                top.append(node.module or "")
        assert all(m.split(".")[0] in sys.stdlib_module_names or m.split(".")[0] in ("__future__", "pytest")
                   or m.startswith("killpoint._plugin")
                   or m in ("killpoint.errors", "killpoint.vocab")  # each imports nothing
                   for m in top), (path, top)


def test_options_are_listed_in_a_killpoint_group_with_ini_equivalents(pytester):
    out = inprocess(pytester, "--help").stdout.str()
    assert "crash-injection testing (killpoint):" in out
    for name in ("store", "report-dir", "seed", "points", "budget", "shard"):
        assert f"--killpoint-{name}" in out
        assert re.search(rf"^\s*killpoint_{name.replace('-', '_')} \(", out, re.M), name
    assert "killpoint(points=None" in inprocess(pytester, "--markers").stdout.str()


# -- suites ------------------------------------------------------------------------------------------
def test_a_suite_on_the_reference_target_passes_and_the_summary_counts_every_run(pytester):
    pytester.makepyfile(test_reference=REFERENCE_SUITE)
    result = runpytest(pytester, "-v")
    result.assert_outcomes(passed=10)
    result.stdout.fnmatch_lines(["*test_checkout?after_claim? PASSED*", "*test_checkout?after_call? PASSED*",
                                 "*test_checkout?after_claim-pause-until-after_claim? PASSED*",
                                 "*test_checkout?after_claim-pause? PASSED*",
                                 "*test_checkout?after_call-pause-until-after_claim? PASSED*",
                                 "*test_checkout?after_call-pause? PASSED*"])
    summary = summary_of(result)
    assert "15 crash runs in 9 tests: 15 valid, 0 violated, 0 unknown" in summary
    assert "violations by invariant" not in summary and "reproduce:" not in summary


def test_a_broken_target_or_mutant_fails_naming_the_invariant_the_schedule_and_a_reproduce_command(pytester):
    pytester.makepyfile(broken_worker=BROKEN_WORKER, test_broken=BROKEN_SUITE)
    result = runpytest(pytester, "--killpoint-report-dir", "crash-reports", "-v", "--junit-xml", "junit.xml")
    result.assert_outcomes(passed=1, failed=3)
    out = result.stdout.str()
    command = "killpoint replay 'A@charge.after_call:1*pause' --target broken_worker:run --seed 0"
    # The assert_valid() failure: invariant, schedule, reproduce command, report page.
    result.stdout.fnmatch_lines([
        "*AssertionError: killpoint: 1 of 1 crash run violated an invariant (target broken_worker:run, seed 0)",
        "*VIOLATED stale_writes_rejected* under A@charge.after_call:1*pause",
        "*stale_writes_rejected at order-1:charge: *stale write",
        f"*reproduce: {command}",
        "*report: *crash-reports*run-000?.html",
    ])
    result.stdout.fnmatch_lines([
        "*AssertionError: killpoint: 1 of 1 crash run violated an invariant (target mutant:no-fence-check, seed 0)",
        "*VIOLATED stale_writes_rejected* under A@charge.after_call:1*pause",
        "*reproduce: killpoint replay 'A@charge.after_call:1*pause' --target mutant:no-fence-check --seed 0",
    ])
    # The marked test without assertions failed on its own verdict, saying why and how to opt out.
    assert "this test is marked @pytest.mark.killpoint, so its crash run must be valid" in out
    summary = summary_of(result)
    assert "4 crash runs in 4 tests: 0 valid, 4 violated, 0 unknown" in summary
    assert re.search(r"^  stale_writes_rejected +4$", summary, re.M)
    assert f"test_broken.py::test_a_stale_commit (stale_writes_rejected, version_chain): {command}" in summary
    assert "not valid, in tests that passed and so expected it: 1 run" in summary
    index = pytester.path / "crash-reports" / "index.html"
    assert f"HTML report: {index}" in summary
    pages = sorted(p.name for p in (pytester.path / "crash-reports").glob("run-*.html"))
    assert len(pages) == 4 and all(page in index.read_text() for page in pages)
    # Each run's report is linked from the test that ran it: in pytest's JUnit XML and under its
    # failure; the index names the test.
    import xml.etree.ElementTree as ET

    case = next(c for c in ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")
                if c.get("name") == "test_a_stale_commit")
    (page,) = [p.get("value") for p in case.iter("property") if p.get("name") == "killpoint_report"]
    assert os.path.isfile(page) and os.path.basename(page) in pages
    result.stdout.fnmatch_lines(["*- killpoint reports -*", f"VIOLATED  A@charge.after_call:1*pause: {page}"])
    assert "test_broken.py::test_a_stale_commit" in index.read_text()
    # With -v, the summary counts the crash points that fired, by action and worker.
    assert "crash points over 4 runs, 4 fired:" in summary
    assert re.search(r"^  after_call +pause +4 +\d+  A x4$", summary, re.M), summary


def test_the_same_suites_pass_and_fail_alike_under_xdist_with_one_shared_index(pytester):
    pytester.makepyfile(broken_worker=BROKEN_WORKER, test_reference=REFERENCE_SUITE, test_broken=BROKEN_SUITE)
    result = runpytest(pytester, "-n", "2", "--killpoint-report-dir", "crash-reports")
    result.assert_outcomes(passed=11, failed=3)
    assert "2 workers [14 items]" in result.stdout.str()
    summary = summary_of(result)  # printed once, by the controller, over both workers' runs
    assert "19 crash runs in 13 tests: 15 valid, 4 violated, 0 unknown" in summary
    assert "killpoint replay 'A@charge.after_call:1*pause' --target broken_worker:run --seed 0" in summary
    # Each worker names its pages after itself; only the controller writes the index, over all of them.
    folder = pytester.path / "crash-reports"
    pages = sorted(p.name for p in folder.glob("*.html") if p.name != "index.html")
    assert len(pages) == 19 and all(re.fullmatch(r"gw[01]-run-\d{4}\.html", p) for p in pages), pages
    index = (folder / "index.html").read_text()
    assert all(page in index for page in pages)


# -- the marker ------------------------------------------------------------------------------------
MARKED = '''
import pytest


@pytest.mark.killpoint
def test_every_point(killpoint):
    pass


@pytest.mark.killpoint(points=["after_call", "in_call"])
def test_checkout(killpoint):
    pass


@pytest.mark.killpoint(points="after_call", steps=["reserve", "charge"])
def test_steps(killpoint):
    pass
'''


def collected(result: pytest.RunResult) -> list[str]:
    return [line.split("::", 1)[1] for line in result.stdout.lines if "::" in line]


def test_the_marker_makes_one_item_per_crash_point_narrowed_by_the_points_option(pytester):
    pytester.makepyfile(test_marked=MARKED)
    every = ["before_claim", "after_claim", "before_call", "after_call", "in_call", "before_receipt",
             "after_receipt", "before_commit", "after_commit", "heartbeat"]
    lease_held = ["after_claim", "before_call", "after_call", "in_call", "before_receipt", "after_receipt",
                  "before_commit"]
    items = collected(inprocess(pytester, "--collect-only", "-q"))
    # As killpoint matrix: a kill at every point (a hang at the heartbeat), then a pause past the
    # lease at every point where one is held.
    # lease at every point where one is held, coming back in the takeover window and after the
    # new holder's commit.
    def pauses(where):
        return [f"{where}-pause-until-after_claim", f"{where}-pause"]

    assert items == [f"test_every_point[{p}]" for p in every] + [
        f"test_every_point[{i}]" for p in lease_held for i in pauses(p)] + [
        "test_checkout[after_call]", "test_checkout[in_call]"] + [
        f"test_checkout[{i}]" for i in pauses("after_call") + pauses("in_call")] + [
        "test_steps[reserve.after_call]", "test_steps[charge.after_call]"] + [
        f"test_steps[{i}]" for i in pauses("reserve.after_call") + pauses("charge.after_call")]
    items = collected(inprocess(pytester, "--collect-only", "-q", "--killpoint-points", "after_call"))
    assert items == ["test_every_point[after_call]"] + [f"test_every_point[{i}]" for i in pauses("after_call")] + [
        "test_checkout[after_call]"] + [f"test_checkout[{i}]" for i in pauses("after_call")] + [
        "test_steps[reserve.after_call]", "test_steps[charge.after_call]"] + [
        f"test_steps[{i}]" for i in pauses("reserve.after_call") + pauses("charge.after_call")]


def test_a_marked_test_that_does_not_take_the_fixture_is_a_collection_error_saying_what_to_write(pytester):
    pytester.makepyfile(test_wrong='''
import pytest

@pytest.mark.killpoint(points=["after_call"])
def test_forgot():
    pass
''')
    result = inprocess(pytester, "--collect-only")
    assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error
    result.stdout.fnmatch_lines(["*test_forgot is marked @pytest.mark.killpoint but does not take the "
                                 "killpoint fixture*def test_forgot(killpoint)*"])


# -- options -----------------------------------------------------------------------------------------
OPTIONS_SUITE = '''
import pytest


def test_settings_reach_the_runs(killpoint):
    s = killpoint.settings
    print("SETTINGS", s.store, s.seed, ",".join(s.points), s.budget, s.shard)
    verdict = killpoint.run("A@charge.after_call:kill", workload="single")
    config = verdict.results[0].config
    assert (config.seed, config.store) == (s.seed, s.store)
    assert [r.schedule for r in killpoint.matrix(workload="single").results] == [
        f"A@charge.{p}:kill" for p in s.points] + [
        f"A@charge.{p}:1*pause{moment}" for p in s.points for moment in ("(until=after_claim)", "")]


def test_explore_draws_the_budget(killpoint):
    verdict = killpoint.explore(workload="single")  # budget: the option's
    assert 1 <= verdict.runs <= killpoint.settings.budget
    verdict.assert_valid()
'''


def test_options_come_from_ini_and_the_command_line_wins(pytester):
    pytester.makeini("[pytest]\nkillpoint_seed = 3\nkillpoint_points = after_call,in_call\n"
                     "killpoint_budget = 2\nkillpoint_store = sqlite\n")
    pytester.makepyfile(test_options=OPTIONS_SUITE)
    result = runpytest(pytester, "-s", "--killpoint-seed", "7")
    result.assert_outcomes(passed=2)
    assert "crash runs in 2 tests" in summary_of(result)
    result.stdout.fnmatch_lines(["*SETTINGS sqlite 7 after_call,in_call 2 (1, 1)*"])


def test_the_tool_killpoint_table_of_pyproject_sets_seed_and_report_dir_and_the_command_line_wins(pytester):
    pytester.makefile(".toml", pyproject='[tool.killpoint]\nseed = 5\nreport-dir = "from-table"\nstore = "sqlite"\n')
    pytester.makepyfile(test_options=OPTIONS_SUITE.split("def test_explore")[0])
    result = runpytest(pytester, "-s", "--killpoint-points", "after_call")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*SETTINGS sqlite 5 after_call 100 (1, 1)*"])
    assert (pytester.path / "from-table" / "index.html").is_file()
    result = runpytest(pytester, "-s", "--killpoint-points", "after_call", "--killpoint-seed", "2")
    result.stdout.fnmatch_lines(["*SETTINGS sqlite 2 after_call 100 (1, 1)*"])


REAL_TIME_SUITE = '''
import json

import pytest


def test_the_clock(killpoint):
    verdict = killpoint.matrix(target="mutant:no-fence-check", workload="single",
                               points=["after_claim", "after_call"])
    print("CLOCK", json.dumps({
        "real_time": killpoint.settings.real_time,
        "virtual": sorted({r.config.virtual_time for r in verdict.results}),
        "lease_ms": sorted({r.config.timing.lease_ttl_ms for r in verdict.results}),
        "verdicts": [[r.schedule, r.valid, sorted({v.invariant for v in r.verdict.violations})]
                     for r in verdict.results]}))
    verdict.assert_valid()


@pytest.mark.killpoint(points=["after_call"], action="1*pause", target="mutant:no-fence-check",
                       workload="single", check=False)
def test_marked(killpoint):
    (run,) = killpoint.verdict.results
    print("MARKED", json.dumps([run.config.virtual_time, run.valid, run.config.reproduce_command()]))
'''


def _clock_of(result: pytest.RunResult) -> tuple[dict, list]:
    """What the real-time suite printed: the matrix's clock and verdicts, the marked item's run."""
    text = result.stdout.str()
    return (json.loads(re.search(r"CLOCK (\{.*\})$", text, re.M)[1]),
            json.loads(re.search(r"MARKED (\[.*\])$", text, re.M)[1]))


def test_real_time_from_the_flag_or_the_table_runs_with_the_clock_off_and_gives_the_same_verdicts(pytester):
    """--killpoint-real-time and [tool.killpoint] real-time = true run the fixture's and the marker's
    runs off the run clock (real-time timings, --real-time in the reproduce line), with the verdicts
    the virtual clock gives; -o killpoint_real_time=false turns the table's setting off."""
    pytester.makepyfile(test_clock=REAL_TIME_SUITE)
    outcomes = {}
    for name, args in (("virtual", ()), ("flag", ("--killpoint-real-time",))):
        result = runpytest(pytester, "-s", *args)
        result.assert_outcomes(passed=1, failed=1)  # the matrix's pause is caught; the marked test judges it
        outcomes[name] = (result, *_clock_of(result))
    pytester.makefile(".toml", pyproject="[tool.killpoint]\nreal-time = true\n")
    for name, args in (("table", ()), ("table-off", ("-o", "killpoint_real_time=false"))):
        result = runpytest(pytester, "-s", *args)
        result.assert_outcomes(passed=1, failed=1)
        outcomes[name] = (result, *_clock_of(result))
    virtual = outcomes["virtual"][1]
    assert virtual["real_time"] is False and virtual["virtual"] == [True] and virtual["lease_ms"] == [30000]
    # caught: the pauses in the takeover window, and the one after the call
    assert [v for _, v, _ in virtual["verdicts"]] == [True, True, False, True, False, False]
    assert {i for _, _, names in virtual["verdicts"] for i in names} == {"stale_writes_rejected"}
    for name in ("flag", "table"):
        result, clock, marked = outcomes[name]
        assert clock["real_time"] is True and clock["virtual"] == [False] and clock["lease_ms"] == [120]
        assert clock["verdicts"] == virtual["verdicts"], name
        assert marked[:2] == [False, False] and marked[2].endswith("--real-time")
        # The summary's reproduce line of the failed matrix replays it off the clock too.
        assert re.search(r"test_the_clock .*--real-time", summary_of(result)), name
    result, clock, marked = outcomes["table-off"]
    assert clock == virtual and marked[:2] == [True, False] and "--real-time" not in summary_of(result)


def test_a_bad_real_time_value_in_the_ini_stops_the_session_naming_it(pytester):
    pytester.makeini("[pytest]\nkillpoint_real_time = sometimes\n")
    result = inprocess(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "'sometimes'" in result.stderr.str()


def test_an_unknown_key_in_the_tool_killpoint_table_stops_the_session_naming_it(pytester):
    pytester.makefile(".toml", pyproject="[tool.killpoint]\nsede = 5\n")
    result = inprocess(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "'sede'" in result.stderr.str()


@pytest.mark.parametrize("option, value, named", [
    ("--killpoint-store", "mysql://db", "mysql://db"),
    ("--killpoint-points", "after call!", "after call!"),
    ("--killpoint-seed", "seven", "seven"),
    ("--killpoint-seed", "\u0663", "\u0663"),  # an Arabic-Indic 3 ran as seed 3
    ("--killpoint-seed", "1_000", "1_000"),
    ("--killpoint-budget", "0", "0"),
    ("--killpoint-shard", "3/2", "3/2"),
    ("--killpoint-shard", "\u0661/\u0662", "\u0661/\u0662"),  # Arabic-Indic 1/2: \d matched it
    ("--killpoint-points", "after_call,", "after_call,"),  # before: ran as after_call, the comma unsaid
    ("--killpoint-points", "after_call,,in_call", "after_call,,in_call"),
])
def test_a_bad_option_value_stops_the_session_naming_it(pytester, option, value, named):
    # In process: the session ends at configure time, before any test or process starts.
    result = inprocess(pytester, option, value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert option in err and repr(named) in err


def test_a_points_option_that_leaves_a_marked_test_no_declared_point_is_a_collection_error_naming_it(pytester):
    # Any name is accepted at configure time (a target may declare points of its own), so a typo is
    # caught where it meets a target: it leaves none of the points the target declares.
    pytester.makepyfile(test_typo="""
import pytest

@pytest.mark.killpoint()
def test_checkout(killpoint):
    pass
""")
    result = inprocess(pytester, "--killpoint-points", "after_cal")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*--killpoint-points after_cal leaves none of the points this target "
                                 "declares (before_claim, after_claim, *)*"])


def test_a_points_option_that_leaves_a_marker_none_of_its_own_points_names_them_as_asked_for(pytester):
    # Before, the message called the marker's own points "the points this target declares": the
    # reference declares ten, and the two named were the ones the marker asked for.
    pytester.makepyfile(test_two="""
import pytest

@pytest.mark.killpoint(points=["after_call", "in_call"])
def test_checkout(killpoint):
    pass
""")
    result = inprocess(pytester, "--killpoint-points", "before_claim")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*--killpoint-points before_claim leaves none of the points asked for "
                                 "(after_call, in_call)"])


def test_the_store_option_runs_the_suite_on_postgresql(pytester, pg_dsn):
    pytester.makepyfile(test_reference=REFERENCE_SUITE)
    result = runpytest(pytester, "--killpoint-store", pg_dsn, "-k", "checkout")
    result.assert_outcomes(passed=6)  # two points, each killed and paused past the lease (back in the
    assert "6 crash runs in 6 tests: 6 valid" in summary_of(result)  # takeover window, and after it)


def test_sigterm_mid_run_ends_the_session_as_ctrl_c_does_and_leaves_no_schema(pytester, pg_dsn):
    """A CI job's timeout (``timeout``, a runner cancelling a job) sends SIGTERM. Before, Python's
    default ended pytest on the spot, in the middle of a run: its PostgreSQL schema (and the
    session's run folder) stayed behind. Now it ends as Ctrl-C does: the run cleaned up, exit 2."""
    import signal
    import subprocess
    import time

    import psycopg
    import psycopg.sql

    started = pytester.path / "started"
    pytester.makepyfile(test_slow=f'''
import os
import time


def blocks(ctx):
    with open({str(started)!r} + ".tmp", "w") as fh:
        fh.write(f"{{os.getpid()}}\\n{{ctx.run_dir}}")
    os.replace({str(started)!r} + ".tmp", {str(started)!r})
    while True:  # busy until the harness ends it: the run is in hand when pytest gets SIGTERM
        time.sleep(0.05)


def test_slow(killpoint):
    killpoint.run("", target=blocks, workload="single", workers=1)
''')
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                             "-q", "--killpoint-store", pg_dsn, "test_slow.py"], cwd=pytester.path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    worker = folder = None
    pattern = f"killpoint%\\_p{proc.pid}\\_%"  # the schemas the pytest process made (schema_name)
    try:
        deadline = time.monotonic() + HANG_S
        while not started.exists():  # no timing assumed: the worker says when the run is in hand
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.05)
        pid, run_dir = started.read_text().split("\n")
        worker = int(pid)
        # the session's own folder (in memory, /dev/shm), else pytest's temporary one, kept as pytest keeps it
        own = os.path.basename(os.path.dirname(run_dir)).startswith("killpoint-")
        folder = os.path.dirname(run_dir) if own else None
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=HANG_S)
        assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            left = conn.execute("select nspname from pg_namespace where nspname like %s", (pattern,)).fetchall()
        assert left == [], out
        assert _comm(worker) != "kp-worker", "the run's worker outlived the session"
        assert folder is None or not os.path.exists(folder), f"{folder} left behind"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=HANG_S)
        if worker is not None and _comm(worker) == "kp-worker":  # never a PID reused since
            os.kill(worker, signal.SIGKILL)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:  # what a failure here left behind
            for (name,) in conn.execute("select nspname from pg_namespace where nspname like %s",
                                        (pattern,)).fetchall():
                conn.execute(psycopg.sql.SQL("drop schema {} cascade").format(psycopg.sql.Identifier(name)))


def _comm(pid: int) -> str | None:
    """The name of a live process (killpoint's workers name themselves kp-worker), else None."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError:
        return None


SHARDED = '''
import pytest

POINTS = ["before_claim", "after_claim", "before_call", "after_call", "in_call"]


def test_matrix(killpoint):
    verdict = killpoint.matrix(workload="single", points=POINTS)
    print("MATRIX", [r.schedule for r in verdict.results])
    verdict.assert_valid()


@pytest.mark.killpoint(points=POINTS, workload="single")
def test_marked(killpoint):
    pass
'''


def test_shards_split_matrices_and_marked_items_deterministically_and_together_run_everything(pytester):
    pytester.makepyfile(test_sharded=SHARDED)
    matrices, items = [], []
    for k in (1, 2):
        result = runpytest(pytester, "-s", "-v", "--killpoint-shard", f"{k}/2")
        out = result.stdout.str()
        matrices.append(json.loads(re.search(r"MATRIX (\[.*\])", out)[1].replace("'", '"')))
        items.append(re.findall(r"test_marked\[([\w-]+)\] PASSED", out))
        assert f"(shard {k}/2)" in summary_of(result)
    points = ("before_claim", "after_claim", "before_call", "after_call", "in_call")
    everything = [f"A@charge.{p}:kill" for p in points] + [
        f"A@charge.{p}:1*pause{moment}" for p in points[1:] for moment in ("(until=after_claim)", "")]
    assert matrices == [everything[0::2], everything[1::2]]
    assert sorted(items[0] + items[1]) == sorted(
        list(points) + [f"{p}-pause{moment}" for p in points[1:] for moment in ("-until-after_claim", "")])
    assert not set(items[0]) & set(items[1]) and abs(len(items[0]) - len(items[1])) <= 1


# -- the documented example and the worked example -----------------------------------------------------
def test_the_example_test_in_the_readme_runs_and_passes(pytester):
    with open(os.path.join(ROOT, "README.md")) as fh:
        doc = fh.read()
    marker = doc.index("<!-- the test suite runs this block")
    example = re.search(r"```python\n(.*?)```", doc[marker:], re.S)[1]
    pytester.makepyfile(test_crashes=example)
    result = runpytest(pytester, "-v")
    result.assert_outcomes(passed=9)
    result.stdout.fnmatch_lines(["*test_checkout?after_call? PASSED*",
                                 "*test_checkout?after_call-pause-until-after_claim? PASSED*",
                                 "*test_checkout?after_call-pause? PASSED*"])


def test_the_worked_user_worker_example_passes_at_every_crash_point(pytester):
    folder = os.path.join(ROOT, "examples", "user_worker")
    for name in ("shop_worker.py", "test_shop_worker.py"):
        shutil.copy(os.path.join(folder, name), pytester.path / name)
    result = runpytest(pytester, "-v")
    result.assert_outcomes(passed=26)  # 10 crash points killed, 7 paused past the lease at two
    # resume moments (the takeover window and after it), 2 more tests
    result.stdout.fnmatch_lines(["*test_every_crash_point_is_recovered_without_a_second_charge?in_call? PASSED*",
                                 "*test_killpoint_catches_a_commit_without_fencing?after_call? PASSED*"])


# -- the verdict and the shard arithmetic, without processes ---------------------------------------------
def test_a_verdict_has_no_truth_value_so_assert_verdict_cannot_pass_by_mistake():
    from killpoint._plugin.verdict import _verdict

    verdict = _verdict([], (), "reference", 0)
    with pytest.raises(TypeError, match="assert_valid"):
        bool(verdict)
    assert verdict.valid is None  # no runs judged: unknown, never valid
    with pytest.raises(AssertionError):
        verdict.assert_valid()


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_shards_cover_each_position_exactly_once(n):
    from killpoint.plugin import Settings

    owners = [[k for k in range(1, n + 1) if Settings(shard=(k, n)).in_shard(i)] for i in range(23)]
    assert all(len(o) == 1 for o in owners)


# -- the fixture and the marker run what the command line runs -----------------------------------------
def test_the_fixture_and_the_marker_schedule_the_same_list_as_killpoint_matrix(capsys):
    """A worker that passes the fixture's matrix must pass the CLI's: same schedules, same order,
    kills and pauses past the lease, for the same points, steps, actions and depth."""
    from killpoint._plugin.fixture import _plans
    from killpoint._plugin.marker import _cases
    from killpoint.chaos.points import DEFAULT_POINTS
    from killpoint.harness.cli import main

    def cli(*argv: str) -> list[str]:
        assert main(["matrix", *argv, "--json"]) == 0
        return [r["schedule"] for r in json.loads(capsys.readouterr().out)["results"]]

    def marker(points, steps, actions):
        return [f"A@{c.step}.{c.point}:{c.action}" for c in _cases(points, steps, actions, None)]

    default = cli("--steps", "charge")  # default points and actions: kill and pause
    assert len(default) == 24 and "A@charge.after_call:1*pause" in default
    assert "A@charge.after_call:1*pause(until=after_claim)" in default
    assert [str(p.schedule) for p in _plans(("charge",), DEFAULT_POINTS, 1)] == default
    assert marker(DEFAULT_POINTS, ("charge",), ("kill", "pause")) == default
    kills = cli("--steps", "charge", "--points", "after_call,in_call", "--actions", "kill")
    assert [str(p.schedule) for p in _plans(("charge",), ("after_call", "in_call"), 1, "kill")] == kills
    assert marker(("after_call", "in_call"), ("charge",), ("kill",)) == kills
    pairs = cli("--steps", "charge", "--points", "after_call,before_commit", "--depth", "2")
    assert [str(p.schedule) for p in _plans(("charge",), ("after_call", "before_commit"), 2)] == pairs


def test_the_fixture_warns_about_a_stall_that_races_the_stuck_monitor(killpoint):
    """The same warning as the command line's, as a KillpointWarning pytest shows (or, with
    -W error, fails the test on); the run still happens."""
    from killpoint import KillpointWarning

    with pytest.warns(KillpointWarning, match=r"sleep\(60000\).*57000 to 78000 ms"):
        verdict = killpoint.run("A@charge.after_call:1*sleep(60000)")
    assert verdict.runs == 1


def test_the_fixtures_crash_pairs_on_a_target_with_its_own_points_run_in_its_declared_order(killpoint,
                                                                                             monkeypatch):
    # killpoint.matrix(depth=2) on a target whose points are its own raised ValueError before its
    # first run (the built-in hit order does not know them). Points named out of order here: the
    # second fault still waits for hit #2 only where the target's declared order puts it first.
    monkeypatch.syspath_prepend(os.path.join(ROOT, "examples", "sqlite_outbox"))
    monkeypatch.chdir(os.path.join(ROOT, "examples", "sqlite_outbox"))
    import outbox_worker

    verdict = killpoint.matrix(target=outbox_worker.worker, steps=["charge"],
                               points=["before_deliver", "after_accept"], depth=2)
    verdict.assert_valid()
    hits = sorted(r.schedule for r in verdict.results if r.schedule.count("A@") == 2)
    assert hits == ["A@charge.after_accept:kill,A@charge.after_accept#2:kill",
                    "A@charge.after_accept:kill,A@charge.before_deliver:kill",
                    "A@charge.before_deliver:kill,A@charge.after_accept#2:kill",
                    "A@charge.before_deliver:kill,A@charge.before_deliver#2:kill"]
    assert verdict.runs == 8 and all(not r.unfired for r in verdict.results)


def test_a_target_whose_setup_refuses_the_run_fails_the_test_in_one_line(killpoint):
    # InvalidTarget from its setup() (a store it cannot use) fails the test naming why, without a
    # traceback through the harness: what the command line says as exit 2.
    import killpoint as kp

    def refuse(run):
        raise kp.InvalidTarget(f"this target needs PostgreSQL, not --store {run.store}")

    target = kp.target(lambda ctx: None, points=("before_pay",), owns_state=True, setup=refuse)
    with pytest.raises(pytest.fail.Exception, match=r"killpoint: this target needs PostgreSQL, not --store sqlite"):
        killpoint.run("", target=target, workload="single")


def test_a_terminate_on_a_target_that_owns_its_state_fails_the_test_in_one_line(killpoint):
    # It acts on killpoint's store, which such a target's workers never use: it did nothing and
    # counted as fired (a buggy worker came out valid). Refused before any run, in one line.
    import killpoint as kp

    target = kp.target(lambda ctx: None, points=("before_ack",), owns_state=True)
    with pytest.raises(pytest.fail.Exception, match=r"^killpoint: schedule .*store of its own"):
        killpoint.run("A@before_ack:terminate", target=target, workload="single")


@pytest.mark.parametrize("config, named", [
    ({"workers": 0}, "workers=0"),
    ({"same_identity": 2}, "same_identity=2"),
    ({"timing": {"lease_ttl_ms": 200}}, "timing="),
])
def test_a_run_field_no_run_can_have_fails_the_test_in_one_line(killpoint, config, named):
    # Before, workers=0 came back as an unknown verdict blaming the infrastructure.
    with pytest.raises(pytest.fail.Exception, match=r"^killpoint: RunConfig\(" + named.replace("(", "\\(")):
        killpoint.run("A@charge.after_call:kill", workload="single", **config)


BAD_CALLS = '''
import pytest


@pytest.mark.parametrize("call", [
    "run('A@nostep.after_call:kill')",            # a step the workload lacks: before, unknown
    "run('Z@charge.after_call:kill')",            # a worker no run starts: before, unknown
    "run('A@charge.nope:kill')",
    "run('A@charge.after_call:kill', target=123)",   # before: AttributeError
    "run('A@charge.after_call:kill', bogus=1)",      # before: TypeError
    "matrix(depth=3)",
    "matrix(depth=True)",                         # before: ran as depth=1 (True == 1)
    "matrix(actions='nope')",
    "matrix(actions='kill,')",                    # before: ran as actions='kill'
    "matrix(steps=['nope'])",
    "matrix(points=[])",                          # before: every point ran
    "matrix(steps=[])",                           # before: no run, "target none"
    "matrix(points='before_claim', actions='pause')",   # before: no run
    "explore(budget=0)",                          # before: ValueError with a traceback
])
def test_call(killpoint, call):
    eval("killpoint." + call)
'''


def test_bad_arguments_to_the_fixture_fail_the_test_with_one_line_naming_them(pytester):
    """What `killpoint replay` and `killpoint matrix` refuse as exit 2 fails the test with one
    line naming the value: no traceback through the plugin, no chained exception, no run."""
    pytester.makepyfile(test_bad=BAD_CALLS)
    result = runpytest(pytester)
    result.assert_outcomes(failed=14)
    text = result.stdout.str()
    for named in ("unknown step 'nostep'", "worker 'Z' in 'Z@charge.after_call:kill' is never started",
                  "unknown crash point 'nope'", "target 123", "unknown keyword 'bogus'",
                  "killpoint.matrix(depth=3)", "killpoint.matrix(depth=True)", "actions='nope'", "actions='kill,'",
                  "killpoint.matrix(steps=['nope']): unknown step 'nope'",
                  "killpoint.matrix(points=[]): name at least one", "killpoint.matrix(steps=[]): name at least one",
                  "no run to make", "killpoint.explore(budget=0)"):
        assert named in text, named
    assert "During handling" not in text and "Traceback" not in text
    assert "crash runs" not in text  # no run was made


def test_the_comma_separated_points_string_reads_as_the_command_line_reads_it(killpoint):
    verdict = killpoint.matrix(points="after_call, in_call", steps="charge", actions="kill", workload="single")
    assert [r.schedule for r in verdict.results] == ["A@charge.after_call:kill", "A@charge.in_call:kill"]


@pytest.mark.parametrize("marker, named", [
    ("steps=['nope']", "unknown step 'nope'"),   # before: 18 items, each unknown
    ("points=['before_claim'], actions=['pause']", "makes no run"),   # before: silently skipped
    ("actions='kill,'", "actions='kill,'"),   # before: ran as actions='kill', the stray comma unsaid
    ("actions=['kill', '']", "actions=['kill', '']"),
])
def test_a_marker_that_can_make_no_valid_run_is_a_collection_error_naming_why(pytester, marker, named):
    pytester.makepyfile(test_marked=f'''
import pytest

@pytest.mark.killpoint({marker})
def test_checkout(killpoint):
    pass
''')
    result = inprocess(pytester)
    assert result.ret != 0
    assert named in result.stdout.str()


def test_the_report_dir_option_is_checked_before_any_run_as_the_command_line_checks_it(pytester):
    """A user's own index.html is never replaced, a file is not a folder (before: overwritten
    without a word; FileExistsError in every test); a folder killpoint wrote to takes the next
    session's pages."""
    pytester.makepyfile(test_one='''
def test_one(killpoint):
    killpoint.run("A@charge.after_call:kill", workload="single").assert_valid()
''')
    own = pytester.mkdir("own")
    (own / "index.html").write_text("<p>mine</p>")
    pytester.makefile(".txt", afile="x")
    for value, named in (("own", "holds an index.html that killpoint did not write"), ("afile.txt", "is a file")):
        result = inprocess(pytester, f"--killpoint-report-dir={value}")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        assert "--killpoint-report-dir" in result.stderr.str() and named in result.stderr.str()
    assert (own / "index.html").read_text() == "<p>mine</p>"
    for _ in range(2):  # the second session replaces what the first wrote
        result = runpytest(pytester, "--killpoint-report-dir=reports")
        result.assert_outcomes(passed=1)
        assert (pytester.path / "reports" / "index.html").exists()


def test_a_session_removes_the_pages_an_earlier_session_or_its_xdist_workers_left(pytester):
    """Before, a session never removed an earlier one's pages: after a ``-n 2`` session every
    gwN-run-NNNN.html stayed beside the next session's pages (and ``killpoint --report-dir`` on the
    same folder left them too), reports of runs that no index listed any more."""
    pytester.makepyfile(test_three='''
import pytest


@pytest.mark.parametrize("point", ["after_call", "in_call", "after_claim"])
def test_run(killpoint, point):
    killpoint.run(f"A@charge.{point}:kill", workload="single").assert_valid()
''')
    folder = pytester.path / "reports"
    result = runpytest(pytester, "-n", "2", "--killpoint-report-dir", "reports")
    result.assert_outcomes(passed=3)
    first = sorted(p.name for p in folder.glob("*.html") if p.name != "index.html")
    assert len(first) == 3 and all(re.fullmatch(r"gw[01]-run-\d{4}\.html", p) for p in first), first
    (folder / "notes.html").write_text("<p>mine</p>")  # not killpoint's: never removed
    result = runpytest(pytester, "--killpoint-report-dir", "reports", "-k", "after_call")
    result.assert_outcomes(passed=1, deselected=2)
    assert sorted(p.name for p in folder.glob("*.html")) == ["index.html", "notes.html", "run-0001.html"]
    assert "run-0001.html" in (folder / "index.html").read_text()
    # A command clears a session's pages as it clears its own.
    (folder / "gw1-run-0004.html").write_text("<p>a page an xdist session wrote</p>")
    from killpoint.harness.cli import main

    code = main(["replay", "A@charge.after_call:kill", "--workload", "single", "--report-dir",
                 str(folder), "--report", "always", "-q"])
    assert code == 0
    left = sorted(p.name for p in folder.glob("*.html"))  # the command's page is named after its run
    assert len(left) == 3 and left[:2] == ["index.html", "notes.html"], left
    assert re.fullmatch(r"run0001-s0-[0-9a-f]{8}\.html", left[2]), left
    assert (folder / "notes.html").read_text() == "<p>mine</p>"


def test_an_index_that_cannot_be_written_is_a_line_of_the_summary_never_an_internal_error(pytester):
    """Before, an OSError writing index.html at the session's end escaped pytest_sessionfinish: a
    traceback instead of the summary, and exit 1 for a session whose every test passed."""
    pytester.makepyfile(test_one='''
import os


def test_one(killpoint):
    killpoint.run("A@charge.after_call:kill", workload="single").assert_valid()
    # what a full disk or a folder gone read-only does to the index at the end: it cannot be written
    os.mkdir(os.path.join(killpoint.settings.report_dir, "index.html"))
''')
    result = runpytest(pytester, "--killpoint-report-dir", "reports")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=1)
    summary = summary_of(result)
    assert "1 crash run in 1 test: 1 valid, 0 violated, 0 unknown" in summary
    assert re.search(r"^HTML report: index .*index\.html not written: ", summary, re.M), summary
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_a_negative_seed_is_a_seed_in_the_plugin_as_on_the_command_line(pytester):
    # Before, --killpoint-seed -3 (and seed = -3 in [tool.killpoint]) stopped the session while
    # killpoint --seed -3 ran.
    pytester.makepyfile(test_seed="""
def test_seed(killpoint):
    assert killpoint.settings.seed == -3
""")
    result = inprocess(pytester, "--killpoint-seed=-3")
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_a_signal_ends_the_session_with_its_summary_line_and_no_worker_left(pytester, sig, xdist):
    """Protects: under pytest-xdist, SIGTERM or SIGHUP killed the controller with no killpoint
    summary (10 of 10 trials), its workers' runs left to end on their own; without xdist a signal
    whose exception was swallowed where it landed was lost, and pytest went on to the next test.
    Now the session ends as the command line does: the signal raised as Ctrl-C and remembered,
    passed on to the xdist workers, the summary's line printed, exit code interrupted (2), and no
    worker process of any run left."""
    import glob
    import signal
    import subprocess
    import time

    if xdist:
        pytest.importorskip("xdist")
    started = pytester.path / "started"
    pytester.makepyfile(test_slow=f'''
import os
import time


def blocks(ctx):
    open({str(started)!r} + f".{{os.getpid()}}", "w").close()
    while True:  # busy until the harness ends it: the run is in hand when pytest gets the signal
        time.sleep(0.05)


def test_slow(killpoint):
    killpoint.run("", target=blocks, workload="single", workers=1)


def test_slow_too(killpoint):
    killpoint.run("", target=blocks, workload="single", workers=1)
''')
    # Each xdist worker says which signal ended its session: the one passed on to it, or none (xdist's
    # teardown interrupts a worker it waited 10 s for, with no signal).
    pytester.makeconftest(f'''
import os


def pytest_keyboard_interrupt(excinfo):
    from killpoint.harness import signals

    if os.environ.get("PYTEST_XDIST_WORKER"):
        with open({str(pytester.path)!r} + "/interrupted." + os.environ["PYTEST_XDIST_WORKER"], "w") as fh:
            fh.write(str(signals.received()))
''')
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                             "-q", *xdist, "test_slow.py"], cwd=pytester.path, env=not_an_xdist_worker(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + HANG_S
        while len(glob.glob(f"{started}.*")) < (2 if xdist else 1):  # every run in hand
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.05)
        workers = [int(p.rsplit(".", 1)[1]) for p in glob.glob(f"{started}.*")]
        proc.send_signal(getattr(signal, sig))
        out, _ = proc.communicate(timeout=HANG_S)
        assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
        said = {"SIGTERM": "terminated (SIGTERM)", "SIGHUP": "hung up (SIGHUP)"}[sig]
        assert f"killpoint: {said}; every process it started has been ended" in out, out
        assert "Traceback" not in out, out
        if xdist:  # the signal was passed on to each xdist worker, which ended its own session
            said = {p.name: p.read_text() for p in pytester.path.glob("interrupted.*")}
            assert said == {f"interrupted.gw{n}": str(int(getattr(signal, sig))) for n in (0, 1)}, (said, out)
        for _ in range(100):  # a worker is reaped by its own session as it ends
            if all(_comm(w) != "kp-worker" for w in workers):
                break
            time.sleep(0.05)
        assert [w for w in workers if _comm(w) == "kp-worker"] == [], "a run's worker outlived the session"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=HANG_S)
        for w in workers:
            if _comm(w) == "kp-worker":  # never a PID reused since
                os.kill(w, signal.SIGKILL)


def _signalled_pytest(pytester, args: list[str], ready, signum) -> tuple:
    """``pytest -q ARGS`` in pytester's folder, in a session of its own (a controller, even when this
    suite runs under xdist); once ``ready()`` holds it gets ``signum``, and its output is read to its
    end. The process is killed if a check fails first. Returns the process and its output."""
    import subprocess
    import time

    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                            cwd=pytester.path, env=not_an_xdist_worker(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        while not ready():
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.02)
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc, out


def test_ctrl_c_while_pytest_is_starting_ends_it_with_one_line_and_no_traceback(pytester):
    """Protects: a SIGINT that landed while pytest loaded its plugins and first conftest files (a CI
    cancel in the first second) printed pytest's KeyboardInterrupt traceback and exit 1 (2 of 40
    trials of benchmarks/signal_stress.py --plugin). From the plugin's import to pytest_configure,
    Ctrl-C now ends pytest with one line and the interrupted code; after it, pytest's own handling
    (the session's summary) is unchanged."""
    import signal

    ready = pytester.path / "conftest-loading"
    pytester.makeconftest(f'''
import time

open({str(ready)!r}, "w").close()
time.sleep(600)  # a slow conftest import: the signal lands in it
''')
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    proc, out = _signalled_pytest(pytester, ["test_x.py"], ready.exists, signal.SIGINT)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    assert out.strip().splitlines() == ["killpoint: interrupted while pytest was starting; no test ran"], out


def test_ctrl_c_once_pytest_has_started_is_pytest_s_own(pytester):
    """The startup guard ends at pytest_configure: a Ctrl-C in a test is pytest's KeyboardInterrupt
    (its summary, exit 2), not the startup line."""
    import signal

    ready = pytester.path / "in-test"
    pytester.makepyfile(test_x=f'''
import time


def test_x():
    open({str(ready)!r}, "w").close()
    time.sleep(600)
''')
    proc, out = _signalled_pytest(pytester, ["test_x.py"], ready.exists, signal.SIGINT)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "KeyboardInterrupt" in out and "while pytest was starting" not in out, out


def test_traceback_entries_with_no_line_number_are_left_out_before_pytest_draws_an_interrupt():
    """Protects: a SIGHUP that landed on an instruction with no line number (CPython 3.11 gives such
    a traceback entry ``tb_lineno`` None) made pytest fail drawing the KeyboardInterrupt (a
    TypeError, INTERNALERROR, exit 1 instead of 2): 1 of 131 plugin stress trials. The entries go;
    the others, in order, stay."""
    from types import SimpleNamespace

    from killpoint._plugin.interrupt import drop_unlocated_frames

    inner = SimpleNamespace(tb_lineno=None, tb_next=None)
    located = SimpleNamespace(tb_lineno=12, tb_next=inner)
    unlocated = SimpleNamespace(tb_lineno=None, tb_next=located)
    outer = SimpleNamespace(tb_lineno=3, tb_next=unlocated)
    drop_unlocated_frames(outer)
    chain, tb = [], outer
    while tb is not None:
        chain.append(tb.tb_lineno)
        tb = tb.tb_next
    assert chain == [3, 12]
    drop_unlocated_frames(None)  # nothing to do


def test_a_signal_reaches_xdist_workers_that_are_still_starting(pytester):
    """Protects: the controller passed a signal on only to workers that had said they were ready; a
    worker still importing or collecting missed it, and the session waited out xdist's 10 s
    teardown for it (6.8 s from a SIGTERM during "bringing up nodes" to the exit, under load). Now
    each worker is told from the moment its process starts. Each worker here is held in its
    conftest's import and says which signal reached it: SIGHUP only ever comes from the controller
    passing it on (xdist's own teardown would end it otherwise)."""
    import signal

    pytest.importorskip("xdist")
    pytester.makeconftest(f'''
import os
import signal
import time

if os.environ.get("PYTEST_XDIST_WORKER"):
    def said(signum, frame):
        with open({str(pytester.path)!r} + "/got." + os.environ["PYTEST_XDIST_WORKER"], "w") as fh:
            fh.write(signal.Signals(signum).name)
        os._exit(0)

    signal.signal(signal.SIGHUP, said)
    open({str(pytester.path)!r} + "/starting." + os.environ["PYTEST_XDIST_WORKER"], "w").close()
    time.sleep(600)  # still starting when the signal comes
''')
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    proc, out = _signalled_pytest(pytester, ["-n", "2", "test_x.py"],
                                  lambda: len(list(pytester.path.glob("starting.*"))) >= 2, signal.SIGHUP)
    said = {p.name: p.read_text() for p in pytester.path.glob("got.*")}
    assert said == {"got.gw0": "SIGHUP", "got.gw1": "SIGHUP"}, out
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
