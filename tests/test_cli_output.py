"""What the command line prints around the result, and the files it writes for CI.

Colour policy (NO_COLOR / FORCE_COLOR / terminals), progress lines, the ``[tool.killpoint]``
table, JUnit XML and crash-point statistics, each on small hand-made inputs; the commands that use
them are run end to end in ``test_cli.py``.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from killpoint import chaos
from killpoint.harness.checkers.base import Result, Verdict, Violation
from killpoint.harness.colour import Colour, wanted
from killpoint.harness.history import History, build
from killpoint.harness.progress import Progress, seconds
from killpoint.harness.run import RunConfig, RunResult
from killpoint.harness.settings import InvalidSettings, find, load, parse, parse_timing
from killpoint.harness.stats import PointStats, brief, total
from killpoint.errors import BadInput
from killpoint.reports import junit
from hang import HANG_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MS = 1_000_000


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


# -- colour -------------------------------------------------------------------------------------------
def test_colour_is_on_for_a_terminal_and_off_for_a_pipe():
    assert wanted(_Tty(), {}) and not wanted(io.StringIO(), {})
    assert not wanted(_Tty(), {"TERM": "dumb"})


def test_no_color_turns_colour_off_even_when_forced_and_force_color_turns_it_on_for_a_pipe():
    assert not wanted(_Tty(), {"NO_COLOR": "1"})
    assert not wanted(io.StringIO(), {"NO_COLOR": "1", "FORCE_COLOR": "1"})
    assert wanted(io.StringIO(), {"FORCE_COLOR": "1"})
    assert not wanted(io.StringIO(), {"FORCE_COLOR": "0"})
    assert wanted(_Tty(), {"NO_COLOR": ""})  # empty means unset, as the convention says


def test_colour_paints_verdict_words_only_when_on():
    assert Colour(True).verdict("VIOLATED") == "\x1b[1;31mVIOLATED\x1b[0m"
    assert Colour(False).verdict("VIOLATED") == "VIOLATED"
    assert Colour(True).verdict("something else") == "something else"


# -- progress -----------------------------------------------------------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _R:
    def __init__(self, valid):
        self.valid = valid


def test_progress_on_a_pipe_writes_a_line_at_the_first_run_then_every_interval_with_eta():
    out, clock = io.StringIO(), _Clock()
    p = Progress(10, title="killpoint matrix", stream=out, clock=clock, interval=3.0)
    clock.now += 1
    p.started("A@x.y:kill")
    p.finished(_R(True))
    assert out.getvalue().splitlines() == ["killpoint matrix: 0/10 runs, 1.0 s elapsed",
                                           "killpoint matrix: 1/10 runs, 1.0 s elapsed, ETA 9.0 s"]
    clock.now += 1
    p.finished(_R(False))  # within the interval: no line
    assert len(out.getvalue().splitlines()) == 2
    clock.now += 3
    p.finished(_R(None))
    assert out.getvalue().splitlines()[-1] == (
        "killpoint matrix: 3/10 runs, 1 violated, 1 unknown, 5.0 s elapsed, ETA 12 s")
    p.close()
    assert out.getvalue().splitlines()[-1] == "killpoint matrix: 3 runs in 5.0 s (1 valid, 1 violated, 1 unknown)"
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()


def test_progress_on_a_terminal_redraws_one_bar_and_clears_it_before_the_closing_line():
    out = _Tty()
    p = Progress(2, title="t", stream=out, clock=_Clock(), colour=Colour(False))
    p.started("a")
    p.finished(_R(True))
    assert out.getvalue().count("\r") == 2 and "\n" not in out.getvalue() and "[############" in out.getvalue()
    p.close()
    assert out.getvalue().endswith("\r\x1b[2Kt: 1 run in 0.0 s (1 valid)\n")


def test_quiet_progress_writes_nothing_at_all():
    out = io.StringIO()
    p = Progress(3, title="t", stream=out, quiet=True)
    p.started()
    p.finished(_R(False))
    p.close()
    assert out.getvalue() == ""


def test_durations_read_as_people_say_them():
    assert [seconds(0.84), seconds(41.2), seconds(125)] == ["0.8 s", "41 s", "2 min 05 s"]


# -- [tool.killpoint] -----------------------------------------------------------------------------------
def test_table_is_found_walking_up_and_sets_the_options_it_names(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.killpoint]\nseed = 7\nstore = "sqlite"\nreport_dir = "out"\nworkers = 3\n'
        '[tool.killpoint.timing]\nlease-ttl-ms = 250\n', encoding="utf-8")
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert find(str(deep)) == str(tmp_path / "pyproject.toml")
    s = load(str(deep))
    # a path is relative to the pyproject.toml, not to where the command runs
    assert dict(s.values) == {"seed": 7, "store": "sqlite", "report_dir": str(tmp_path / "out"), "workers": 3}
    assert dict(s.timing) == {"lease_ttl_ms": 250.0}
    assert s.defaults_for({"seed", "timing"}) == {"seed": 7, "timing": {"lease_ttl_ms": 250.0}}


def test_real_time_in_the_table_is_the_default_of_real_time_and_no_real_time_wins(tmp_path):
    """[tool.killpoint] real-time = true turns the clock off for every command; --no-real-time wins."""
    from killpoint.harness.cli import build_parser

    settings = parse({"real_time": True})
    assert dict(settings.values) == {"real_time": True}
    parser = build_parser(settings)
    for command in ("matrix", "explore", "replay", "scenario", "selftest"):
        extra = ["lease_takeover"] if command == "scenario" else ["A@charge.after_call:kill"] \
            if command == "replay" else []
        assert parser.parse_args([command, *extra]).real_time is True, command
        assert parser.parse_args([command, *extra, "--no-real-time"]).real_time is False, command
    assert build_parser(parse({})).parse_args(["matrix"]).real_time is None  # the clock on


def test_no_table_or_no_pyproject_gives_no_settings(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n', encoding="utf-8")
    assert load(str(tmp_path)).values == {}


@pytest.mark.parametrize("table, named", [
    ({"sed": 7}, "'sed'"),
    ({"seed": "7"}, "seed = '7'"),
    ({"workers": 0}, "workers = 0"),
    ({"seed": True}, "seed = True"),
    ({"report": "sometimes"}, "report = 'sometimes'"),
    ({"real-time": 1}, "real-time = 1"),
    ({"real_time": "yes"}, "real_time = 'yes'"),
    ({"timing": {"lease": 3}}, "'lease'"),
    ({"timing": {"lease-ttl-ms": -1}}, "lease-ttl-ms = -1"),
])
def test_unknown_keys_and_bad_values_are_refused_naming_them(table, named):
    with pytest.raises(InvalidSettings, match=None) as err:
        parse(table)
    assert named in str(err.value) and isinstance(err.value, BadInput)


def test_a_broken_pyproject_is_refused_naming_the_file(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.killpoint\n", encoding="utf-8")
    with pytest.raises(InvalidSettings, match="not valid TOML"):
        load(str(tmp_path))


def test_timing_flag_takes_the_table_names():
    assert parse_timing("lease-ttl-ms=200, heartbeat-ms=40") == {"lease_ttl_ms": 200.0, "heartbeat_ms": 40.0}
    with pytest.raises(BadInput, match="NAME=MILLISECONDS"):
        parse_timing("lease-ttl-ms")


# -- statistics ---------------------------------------------------------------------------------------
def _points_history() -> History:
    ev = lambda t, p, **d: (t * MS, p, "point", "event", d)  # noqa: E731
    return build([ev(0, "A", point="before_call", action=None),
                  ev(1, "A", point="after_call", action="kill"),
                  ev(2, "A.2", point="before_call", action=None),
                  ev(3, "A.2", point="after_call", action="kill"),
                  ev(4, "B", point="heartbeat", action="hang")])


def test_statistics_count_points_reached_and_fired_by_worker_identity_and_action():
    s = PointStats.of(_points_history())
    assert s.reached == {"before_call": 2, "after_call": 2, "heartbeat": 1}
    assert s.fired == {("after_call", "A", "kill"): 2, ("heartbeat", "B", "hang"): 1}
    assert s.to_json()["fired"] == {"after_call": {"A": {"kill": 2}}, "heartbeat": {"B": {"hang": 1}}}
    assert brief(s) == "after_call A kill x2, heartbeat B hang x1"
    both = total([s, s])
    assert both.runs == 2 and both.total_fired == 6
    assert any(line.startswith("after_call") and "A x4" in line for line in both.lines())
    assert both.lines()[-1] == "reached, never fired: before_call"


# -- JUnit XML ----------------------------------------------------------------------------------------
def _result(valid, *, schedule="A@charge.after_call:kill", detail="stale", reasons=()) -> RunResult:
    violations = (Violation("stale_writes_rejected", "order-1", "charge", detail),) if valid is False else ()
    verdict = Verdict(valid, (Result("stale_writes_rejected", valid, True, violations, ""),), tuple(reasons))
    return RunResult(RunConfig(schedule=chaos.parse(schedule)), "run1", History(()), verdict, {}, (), 2, 0.25, "")


def test_junit_has_one_case_per_run_a_failure_per_violated_run_and_an_error_per_unknown(tmp_path):
    results = [_result(True), _result(False, detail="a <stale> \x00 write & more"),
               _result(None, reasons=("a scheduled fault never fired",)), _result(False)]
    path = junit.write(str(tmp_path / "out" / "k.xml"), results, suite="killpoint matrix",
                       reproduce=lambda r: f"killpoint replay '{r.config.schedule}'",
                       reports=[None, "r/run-0002.html", None, None])
    root = ET.parse(path).getroot()
    (suite,) = root.findall("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("4", "2", "1")
    cases = suite.findall("testcase")
    assert len(cases) == 4 and [len(c.findall("failure")) for c in cases] == [0, 1, 0, 1]
    failure = cases[1].find("failure")
    assert failure.get("message").startswith("stale_writes_rejected at order-1:charge: a <stale> \ufffd write")
    assert "reproduce: killpoint replay 'A@charge.after_call:kill'" in failure.text
    assert "report: r/run-0002.html" in failure.text
    assert cases[2].find("error").get("message") == "unknown: a scheduled fault never fired"
    props = {p.get("name"): p.get("value") for p in cases[1].iter("property")}
    assert props["seed"] == "0" and props["report"] == "r/run-0002.html"


def test_the_documented_tool_killpoint_example_is_a_valid_table():
    """Protects the [tool.killpoint] example of the configuration page (it was the README's)."""
    import os
    import re

    from killpoint.harness.settings import tomllib

    readme = open(os.path.join(os.path.dirname(__file__), os.pardir, "docs", "reference", "configuration.md"),
                  encoding="utf-8").read()
    (block,) = re.findall(r"```toml\n(\[tool\.killpoint\].*?)```", readme, re.S)
    s = parse(tomllib.loads(block)["tool"]["killpoint"])
    assert s.values["seed"] == 7 and s.timing == {"lease_ttl_ms": 200.0, "heartbeat_ms": 50.0}


def test_junit_of_a_selftest_passes_a_mutant_its_invariant_caught_and_fails_one_that_got_away(tmp_path):
    results = [_result(False), _result(True), _result(True)]
    root = junit.build(results, suite="killpoint selftest", reproduce=lambda r: "killpoint replay x",
                       expect=["stale_writes_rejected", "stale_writes_rejected", None]).getroot()
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "0")
    cases = suite.findall("testcase")
    assert cases[0].find("failure") is None and cases[2].find("failure") is None
    assert cases[1].find("failure").get("message") == "not caught: stale_writes_rejected must be violated, got valid"


def test_a_summary_lets_a_valid_runs_events_go_only_when_nothing_will_draw_them():
    """Protects the matrix's memory (its heap is what every forked worker copies) without losing
    anything it prints: a valid run added with ``keep_events=False`` keeps its verdict, faults and
    the crash points it reached (the JSON's ``points``), only its events go; a run that is not
    valid always keeps them, for its report and its replay."""
    from killpoint.harness.commands.summary import Summary

    history = build([(1 * MS, "A", "point", "event", {"point": "before_claim", "step": "charge", "action": None}),
                     (2 * MS, "A", "point", "event", {"point": "after_call", "step": "charge", "action": "kill"}),
                     (3 * MS, "harness", "exit", "event", {"worker": "A", "code": -9})])
    valid, broken = _result(True), _result(False)
    valid = RunResult(valid.config, "run1", history, valid.verdict, {"A@charge.after_call:kill": 1}, (), 2, 0.25, "")
    broken = RunResult(broken.config, "run2", history, broken.verdict, {}, (), 2, 0.25, "")
    summary = Summary()
    summary.add(valid, keep_events=False)
    summary.add(broken, keep_events=False)
    kept = Summary()
    kept.add(valid)
    kept.add(broken)
    assert summary.results[0].history.events == () and summary.results[1].history.events == history.events
    assert summary.results[0].verdict == valid.verdict and summary.results[0].fired == valid.fired
    assert [p.to_json() for p in summary.point_stats()] == [p.to_json() for p in kept.point_stats()]
    assert summary.point_stats()[0].to_json()["fired"] == {"after_call": {"A": {"kill": 1}}}
    assert kept.results[0].history.events == history.events


@pytest.mark.parametrize("argv, own", [
    (["matrix", "--steps", "charge", "--points", "after_call", "--actions", "kill"], set()),
    (["replay", "A@charge.after_call:kill", "--workload", "single"], {"reproduce", "agree", "verdicts"}),
    (["report", "--schedule", "A@charge.after_call:kill", "--workload", "single"], set()),
    (["scenario", "lease_takeover"], {"story_held", "checks"}),
    (["explore", "--budget", "2", "--workload", "single"], {"minimal", "budget", "seed"}),
    (["selftest", "--mutants", "random-request-id"], {"score", "mutants", "reference"}),
])
def test_every_command_json_has_the_fields_the_readme_lists(argv, own, tmp_path):
    """Protects: the JSON page's paragraph on the JSON object (the fields every command has, those the
    run-by-run commands add, and each command's own), which a user's CI script reads."""
    everywhere = {"valid", "runs", "violations", "invariants", "points", "report"}
    by_run = {"unknown", "unknown_reasons", "judged", "results"}
    if argv[0] == "report":
        argv = [*argv, "--report-dir", str(tmp_path / "pages")]
    done = subprocess.run([sys.executable, "-m", "killpoint.harness.cli", *argv, "--json"], capture_output=True,
                          text=True, timeout=HANG_S, cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-2000:]
    fields = set(json.loads(done.stdout))
    assert everywhere | own <= fields, (everywhere | own) - fields
    if argv[0] in ("matrix", "replay", "report", "scenario"):
        assert by_run <= fields, by_run - fields
    page = open(os.path.join(ROOT, "docs", "reference", "json.md"), encoding="utf-8").read()
    assert all(f"`{name}`" in page for name in everywhere | by_run | own)
