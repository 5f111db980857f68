"""The command line contract of DESIGN section 10: exit codes, one-line errors, the JSON shape."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

from killpoint.chaos.points import DEFAULT_POINTS, POINTS
from killpoint.harness.checkers import ALL
from killpoint.harness.cli import main
from killpoint.harness.redact import redact
from hang import HANG_S


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_unknown_point_exits_2_with_one_line_naming_it_and_the_valid_names(capsys):
    code, out, err = run_cli(capsys, "matrix", "--points", "nonsense")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "nonsense" in lines[0]
    assert all(p in lines[0] for p in POINTS)


def test_no_command_is_one_line_on_stderr_naming_the_commands(capsys):
    """Protects: ``killpoint`` alone printed the whole help (30 lines) on stdout with exit 2, where
    every other usage error is one line on stderr and stdout stays empty for a script to read."""
    code, out, err = run_cli(capsys)
    assert code == 2 and out == ""
    [line] = err.strip().splitlines()
    assert line.startswith("killpoint: error: give a command") and "matrix" in line and "--help" in line


@pytest.mark.parametrize("argv, named", [
    (["matrix", "--store", "mysql://x"], "mysql://x"),
    (["matrix", "--target", "mutant:nope"], "nope"),
    (["matrix", "--target", "no_such_module:fn"], "no_such_module"),
    (["matrix", "--workers", "0"], "0"),
    (["matrix", "--steps", "ship"], "ship"),
    (["matrix", "--workload", "bogus"], "bogus"),
    (["matrix", "--actions", "explode"], "explode"),
    (["nosuchcommand"], "nosuchcommand"),
    # Timings no run can have: before, infinity or 1e308 ran and came out unknown ("checker raised:
    # OverflowError"), as if the run had gone wrong rather than the input.
    (["matrix", "--timing", "poll-ms=inf"], "'poll-ms=inf'"),
    (["replay", "A@charge.after_call:kill", "--timing", "lease-ttl-ms=1e308"], "'lease-ttl-ms=1e308'"),
    (["matrix", "--timing", "heartbeat-ms=nan"], "'heartbeat-ms=nan'"),
    (["matrix", "--timing", "stuck-bound-ms=31536000001"], "stuck-bound-ms = 31536000001"),
    (["matrix", "--timing", "poll-ms=0"], "poll-ms = 0"),
    (["replay", "A@charge.after_call:sleep(\u00b2)"], "sleep(\u00b2)"),  # before: exit 3, "ValueError"
    (["replay", "A@charge.after_call:kill,A@charge.after_call:pause"], "A@charge.after_call:pause"),
    (["matrix", "--points", "before_claim", "--actions", "pause"], "before_claim"),  # before: 0 runs, exit 3
])
def test_bad_input_exits_2_naming_the_bad_value(capsys, argv, named):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert named in err and len(err.strip().splitlines()) == 1


def test_full_single_fault_matrix_is_valid_judges_every_invariant_and_fires_every_point(capsys):
    code, out, err = run_cli(capsys, "matrix", "--json")
    report = json.loads(out)
    assert code == 0 and report["valid"] is True
    assert report["runs"] >= 27 and report["violations"] == []
    schedules = {r["schedule"] for r in report["results"]}
    assert "A@charge.after_call:kill" in schedules and "A@charge.after_call:1*pause" in schedules
    assert set(report["invariants"]) == set(ALL)
    assert all(c["checked"] >= 1 and c["violated"] == 0 for c in report["invariants"].values()), \
        report["invariants"]
    assert all(r["unfired"] == [] and all(n >= 1 for n in r["fired"].values()) for r in report["results"])
    fired_points = {s.split(".")[1].split(":")[0].split("#")[0] for r in report["results"] for s in r["fired"]}
    assert fired_points == set(DEFAULT_POINTS)  # the PostgreSQL store's own points only when asked


def test_json_mode_prints_exactly_one_object_on_stdout_progress_on_stderr_and_quiet_silences_it(capsys):
    code, out, err = run_cli(capsys, "matrix", "--json", "--points", "after_call", "--steps", "charge")
    assert code == 0
    report = json.loads(out)  # the whole of stdout is one object
    assert [r["schedule"] for r in report["results"]] == ["A@charge.after_call:kill",
                                                          "A@charge.after_call:1*pause(until=after_claim)",
                                                          "A@charge.after_call:1*pause"]
    lines = err.splitlines()
    assert lines[-2] == "killpoint matrix: 3/3 runs, " + lines[-2].split(", ", 1)[1]
    assert lines[-1].startswith("killpoint matrix: 3 runs in ") and lines[-1].endswith("(3 valid)")
    # statistics are always in the JSON: per run and in total
    assert report["points"]["fired"] == {"after_call": {"A": {"kill": 1, "pause": 2}}}
    assert [r["points"]["fired_total"] for r in report["results"]] == [1, 1, 1]
    code, out, err = run_cli(capsys, "matrix", "--json", "--quiet", "--points", "after_call", "--steps", "charge")
    assert code == 0 and json.loads(out)["runs"] == 3 and err == ""


def test_demo_tells_the_story_ends_with_one_caught_bug_and_exits_0(capsys):
    """Protects the first screen a new user sees: the five valid runs, then one violation (a mutant
    under the lease takeover) with its reproduce line; the exit code is the reference's verdict."""
    code, out, err = run_cli(capsys, "demo")
    assert code == 0
    assert "REFUSED A's commit with fence 1" in out
    assert "manual_intervention" in out and "flagged A stuck" in out
    assert out.strip().splitlines()[-1].endswith("valid")
    shown = out.split("6. A@charge.after_call:1*pause on mutant:no-fence-check")[1]
    assert "VIOLATED stale_writes_rejected at order-1:charge" in shown
    assert "reproduce: killpoint replay 'A@charge.after_call:1*pause' --target mutant:no-fence-check" in shown
    assert "=> caught" in shown
    # One vocabulary: one verdict word, no empty field printed as None, what the times are said once.
    assert "INVALID" not in out and "None" not in out
    assert out.count("run time on the virtual clock") == 1
    assert "had something to judge" not in out and "invariants judged;" in out


def test_demo_fails_when_the_bug_it_shows_is_not_caught(capsys, monkeypatch):
    """Protects the demo's promise: the mutant it shows must be caught. Shown under a schedule where
    its invariant has nothing to catch (a kill, where no stale commit happens), the demo exits 1."""
    from killpoint.harness.commands import demo

    monkeypatch.setattr(demo, "MUTANT", ("mutant:no-fence-check", "A@charge.after_call:kill",
                                         "stale_writes_rejected", "a bug under a schedule that cannot show it"))
    code, out, err = run_cli(capsys, "demo")
    assert code == 1
    assert "=> NOT caught" in out and "was NOT caught by stale_writes_rejected" in out


def test_the_same_seed_fires_the_same_probabilistic_faults_in_every_process():
    """Each run is a fresh interpreter with its own string-hash salt: a worker seed derived with
    the salted built-in ``hash()`` drew differently in each (6, 8, 9 and 8 firings of four identical
    replays). One worker, so which hits it sees does not depend on the OS scheduler either."""
    import os
    import subprocess
    import sys

    counts = []
    for salt in ("1", "2", "3", "4"):
        proc = subprocess.run(
            [sys.executable, "-m", "killpoint.harness.cli", "replay", "A@before_claim:50%sleep(1)",
             "--workers", "1", "--seed", "7", "--json"],
            capture_output=True, text=True, timeout=HANG_S, env={**os.environ, "PYTHONHASHSEED": salt})
        assert proc.returncode == 0, proc.stderr
        counts.append(json.loads(proc.stdout)["results"][0]["fired"]["A@before_claim:50%sleep(1)"])
    assert len(set(counts)) == 1 and 0 < counts[0], counts


# -- your own target and workload ---------------------------------------------------------------
DECLARED_TARGET = '''
import killpoint
from killpoint import InstanceSpec, StepSpec, Workload
from killpoint.harness.worker import reference

POINTS = ("before_call", "after_call", "after_commit")


def two_charges(seed=0):
    return Workload("two", tuple(InstanceSpec(f"order-{n}", (StepSpec("charge", resource="payment",
                                                                        params={"amount": n}),))
                                 for n in (1, 2)))


@killpoint.target(points=POINTS, workload="mytarget:two_charges")
def worker(ctx):
    reference(ctx)


def not_a_workload(seed=0):
    return {"instances": []}


def broken_workload(seed=0):
    raise ValueError("no such region: mars")


def needs_two(a, b):
    return two_charges()
'''


@pytest.fixture
def user_project(tmp_path, monkeypatch):
    (tmp_path / "mytarget.py").write_text(DECLARED_TARGET)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path


def test_a_declared_target_runs_its_own_workload_and_only_its_declared_points(capsys, user_project):
    code, out, err = run_cli(capsys, "matrix", "--target", "mytarget:worker", "--actions", "kill", "--json")
    report = json.loads(out)
    assert code == 0 and report["valid"] is True and report["runs"] == 3  # one step x three points
    assert {r["schedule"] for r in report["results"]} == {
        "A@charge.before_call:kill", "A@charge.after_call:kill", "A@charge.after_commit:kill"}
    assert "judged" in report and report["judged"] >= 1


def test_a_schedule_naming_a_point_the_target_does_not_declare_exits_2_listing_the_declared(capsys, user_project):
    code, out, err = run_cli(capsys, "replay", "A@charge.before_claim:kill", "--target", "mytarget:worker")
    assert code == 2 and "before_claim" in err and "after_commit" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("workload, named", [("mytarget:not_a_workload", "dict"),
                                             ("mytarget:nothing_here", "nothing_here"),
                                             ("no_such_pkg:jobs", "no_such_pkg"),
                                             # A workload function that raises, or takes what a
                                             # target takes, is bad input (it was exit 3, an
                                             # "infrastructure failure" that named no workload).
                                             ("mytarget:broken_workload", "ValueError: no such region: mars"),
                                             ("mytarget:needs_two", "TypeError"),
                                             ("mytarget:worker", "mytarget:worker")])
def test_a_bad_user_workload_exits_2_naming_it(capsys, user_project, workload, named):
    code, out, err = run_cli(capsys, "replay", "", "--workload", workload)
    assert code == 2 and named in err and len(err.strip().splitlines()) == 1
    assert workload in err


def test_matrix_terminate_on_a_target_of_killpoints_store_runs_its_declared_points_and_the_db_ones(
        capsys, user_project, pg_dsn):
    """Protects: --actions terminate scheduled every protocol point for a target declaring a few of
    them (the matrix then refused its own schedule as naming undeclared points, exit 2)."""
    code, out, err = run_cli(capsys, "matrix", "--target", "mytarget:worker", "--actions", "terminate",
                             "--store", pg_dsn, "--json", "--quiet")
    report = json.loads(out)
    points = {r["schedule"].split(".", 1)[1].split(":", 1)[0].split("#")[0] for r in report["results"]}
    assert code == 0 and points == {"before_call", "after_call", "after_commit", "before_db_commit",
                                    "in_db_commit"}, (code, err, points)


OWNED_TARGET = '''
import killpoint


@killpoint.target(points=("before_ack", "after_ack"), owns_state=True, workload="plain")
def owned(ctx):
    pass
'''


def test_terminate_and_db_points_on_a_target_that_owns_its_state_are_refused(capsys, user_project, pg_dsn):
    """Protects: a terminate at an owned-state target's point ended a session of killpoint's own
    store, which that target's workers never use, and still counted as fired: a buggy queue
    worker came out valid on a fault that did nothing. Refused, as a db point is, before any run."""
    (user_project / "ownedtarget.py").write_text(OWNED_TARGET)
    for argv in (["replay", "A@before_ack:terminate"], ["replay", "A@in_db_commit:kill"],
                 ["matrix", "--actions", "terminate"]):
        code, out, err = run_cli(capsys, *argv, "--target", "ownedtarget:owned", "--store", pg_dsn)
        assert code == 2 and len(err.strip().splitlines()) == 1, (argv, err)
        assert "store of its own" in err
    from killpoint import chaos
    from killpoint.errors import InvalidTarget
    from killpoint.harness.run import RunConfig, Session

    import ownedtarget

    with Session() as session, pytest.raises(InvalidTarget, match="store of its own"):
        session.run(RunConfig(schedule=chaos.parse("A@before_ack:terminate", points=frozenset({"before_ack"})),
                              target=ownedtarget.owned, store=pg_dsn))


def test_a_user_workload_by_pkg_module_function_on_the_reference(capsys, user_project):
    code, out, err = run_cli(capsys, "replay", "A@charge.after_call:kill", "--workload", "mytarget:two_charges",
                             "--json")
    assert code == 0 and json.loads(out)["valid"] is True


def test_a_target_that_raises_on_start_exits_3_naming_the_exception_not_at_its_bound(capsys):
    code, out, err = run_cli(capsys, "replay", "", "--target", "os:getcwd", "--json")
    report = json.loads(out)
    assert code == 3 and report["valid"] is None
    reasons = " ".join(r for u in report["unknown"] for r in u["reasons"])
    assert "TypeError" in reasons and "replacements stopped" in reasons and "bound" not in reasons
    assert report["results"][0]["workers_spawned"] <= 3


BIG = "x" * 10_000


@pytest.mark.parametrize("argv, named", [
    (["matrix", "--points", ""], "--points ''"),
    (["matrix", "--steps", ""], "--steps ''"),
    (["matrix", "--points", " , "], "--points"),
    (["explore", "--steps", ""], "--steps ''"),
    (["replay", "A@nope.after_call:kill"], "'nope'"),
    (["replay", "Z@charge.after_call:kill"], "'Z'"),
    (["replay", "A@charge.after_call:kill", "--workers", "1", "--target", "mutant:" + BIG], "xxx"),
    (["matrix", "--points", BIG], "xxx"),
    (["matrix", "--steps", BIG], "xxx"),
    (["matrix", "--store", BIG], "xxx"),
    (["matrix", "--actions", BIG], "xxx"),
    (["matrix", "--workload", BIG], "xxx"),
    (["matrix", "--workers", BIG], "xxx"),
    (["replay", BIG], "xxx"),
    (["replay", "A@" + BIG + ".after_call:kill"], "xxx"),
    (["replay", BIG + "@charge.after_call:kill"], "xxx"),
])
def test_bad_input_is_exit_2_with_one_line_naming_the_value_clipped_to_200_characters(capsys, argv, named):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == "", (code, out[:300])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], lines
    assert len(lines[0]) < 1000, len(lines[0])
    assert "x" * 201 not in lines[0]  # the value is named, clipped, never echoed whole


@pytest.mark.parametrize("argv, value", [
    (["replay", "A@charge.after_call:kill" + "x" * 5000], "A@charge.after_call:kill" + "x" * 5000),
    (["matrix", "--steps", "y" * 3000], "y" * 3000),
    (["replay", "A@charge.after_call:" + "k" * 3000], "A@charge.after_call:" + "k" * 3000),
    (["replay", "A@charge." + "p" * 3000 + ":kill"], "A@charge." + "p" * 3000 + ":kill"),
])
def test_a_long_bad_value_is_named_once_clipped_once_in_a_sensible_line(capsys, argv, value):
    """Protects the error line of a long value: it names the value as shown() clips it, once,
    and no clipping is applied to a clipped value again. Before, one_line clipped shown()'s
    output a second time ("...(203 characters) (3000 characters)") and the schedule's parts were
    repeated whole and clipped mid-word ("...(208 characters) characters)"), and a line that
    grew too long lost its tail."""
    from killpoint.errors import shown

    code, out, err = run_cli(capsys, *argv)
    (line,) = err.strip().splitlines()
    assert code == 2 and out == ""
    assert shown(value) in line, line
    assert re.findall(r"\((\d+) characters\)", line)[0] == str(len(value))
    assert not re.search(r"characters\) (\(|characters)", line) and "...(" not in line, line
    assert len(line) < 800 and not line.endswith("..."), line  # whole: no truncated tail


@pytest.mark.parametrize("argv, named", [
    (["replay", "A@charge.after_call:kill", "--store", ""], "--store ''"),
    (["replay", "A@charge.after_call:kill", "--store", "  "], "--store ' '"),  # one line: spaces run together
    (["selftest", "--quick", "--store", ""], "--store ''"),
    (["scenario", "lease_takeover", "--store", ""], "--store ''"),
    (["replay", "A@charge.after_call:kill", "--timing", ""], "--timing: ''"),
    (["matrix", "--timing", " , "], "--timing: ' , '"),
    (["replay", "A@charge.after_call:kill", "--junit-xml", ""], "--junit-xml ''"),
    (["selftest", "--quick", "--junit-xml", ""], "--junit-xml ''"),
    (["selftest", "--mutants", ""], "--mutants ''"),
    (["selftest", "--mutants", " , "], "--mutants ' , '"),
    # before: --workload '' ran the target's own workload, explore --database '' kept Hypothesis's
    # folders (constants/, examples/) in the working directory itself
    (["replay", "A@charge.after_call:kill", "--workload", ""], "--workload ''"),
    (["matrix", "--workload", " "], "--workload ' '"),
    (["explore", "--database", ""], "--database ''"),
])
def test_an_empty_value_is_refused_naming_the_option_never_a_quiet_default(capsys, argv, named):
    """Protects: an option given with an empty value (a CI variable that was never set) is exit 2
    naming it, as an empty --points is. Before, --store '' ran on SQLite (and the reproduce line
    carried --store ''), --timing '' kept the defaults, --junit-xml '' wrote no file, and selftest
    --mutants '' ran all 15 mutants."""
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == "", (code, out[:300])
    (line,) = err.strip().splitlines()
    assert line.startswith("killpoint: error: ") and named in line, line


@pytest.mark.parametrize("argv, named", [
    (["matrix", "--forms", "hits"], "--forms 'hits'"),
    (["matrix", "--depth", "1", "--forms", "workers,hits"], "--forms 'workers,hits'"),
    (["matrix", "--cross-steps"], "--cross-steps"),
])
def test_depth_2_options_without_depth_2_are_refused_not_ignored(capsys, argv, named):
    """Protects: --forms and --cross-steps shape pairs of crashes; at depth 1 they were ignored
    without a word (exit 0 on the single-crash matrix), so a user who forgot --depth 2 believed the
    pairs had been run. Now exit 2 naming the option, before any run."""
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert named in line and "--depth 2" in line, line


def test_report_takes_same_identity_as_the_reproduce_lines_it_is_given(capsys, tmp_path):
    """Protects: a depth-2 or exploration counterexample's reproduce line carries --same-identity;
    `killpoint report` refused it ("unrecognized arguments"), so that run's page could not be had.
    It runs as replay does (the page's own reproduce line says it), and a bad value is one line."""
    where = tmp_path / "rep"
    code, out, err = run_cli(capsys, "report", "--schedule", "A@charge.after_call:kill", "--workload", "single",
                             "--same-identity", "1", "--report-dir", str(where), "--json", "-q")
    assert code == 0, err
    page = (where / f"{json.loads(out)['results'][0]['run_id']}.html").read_text(encoding="utf-8")
    assert "--same-identity 1" in page
    code, out, err = run_cli(capsys, "report", "--schedule", "A@charge.after_call:kill", "--same-identity", "2")
    assert code == 2 and out == "" and "--same-identity 2" in err.strip()


def test_report_never_is_refused_by_the_report_command_and_the_table_default_is_not(
        capsys, tmp_path, monkeypatch):
    """Protects: `killpoint report --report never` wrote the report all the same (exit 0, the flag
    ignored); it is exit 2 naming it, with no run and no report. A project's [tool.killpoint]
    report = "never", meant for the other commands, does not stop the one that writes reports."""
    where = tmp_path / "rep"
    code, out, err = run_cli(capsys, "report", "--schedule", "", "--workload", "single",
                             "--report", "never", "--report-dir", str(where))
    assert code == 2 and out == "" and not where.exists()
    (line,) = err.strip().splitlines()
    assert "--report 'never'" in line and "killpoint replay" in line, line
    monkeypatch.chdir(_pyproject(tmp_path, '[tool.killpoint]\nreport = "never"\n'))
    code, out, err = run_cli(capsys, "report", "--schedule", "", "--workload", "single", "-q",
                             "--report-dir", str(where), "--json")
    assert code == 0 and json.loads(out)["report"] == str(where / "index.html")
    code, out, err = run_cli(capsys, "report", "--schedule", "", "--workload", "single", "-q",
                             "--report", "on-failure", "--report-dir", str(where), "--json")
    assert code == 0 and json.loads(out)["report"]  # on-failure: accepted, written all the same


@pytest.mark.parametrize("command", [["replay", "A@charge.after_call:kill"], ["matrix"], ["selftest"],
                                     ["scenario", "lease_takeover"], ["explore"]])
@pytest.mark.parametrize("seed", ["\u0663", "1_000", " 3", "", "-"])
def test_a_seed_is_ascii_digits_with_an_optional_minus(capsys, command, seed):
    """Protects the seed's one text: --seed \u0663 (an Arabic-Indic 3) ran as seed 3, and 1_000 as
    1000, while the reproduce line said --seed 3; seeds are read as schedule numbers are, ASCII
    digits (a leading minus allowed: negative seeds are seeds), in every command taking one."""
    code, out, err = run_cli(capsys, *command, "--seed", seed)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert f"--seed: {seed!r}" in line and "ASCII digits" in line, line


# Every integer option of every command, with values int() read as another number than the one typed.
_INTEGER_OPTIONS = [(["matrix"], "--workers"), (["matrix"], "--jobs"), (["matrix"], "--depth"),
                    (["explore"], "--budget"), (["explore"], "--max-faults"), (["explore"], "--workers"),
                    (["replay", "A@charge.after_call:kill"], "--repeat"),
                    (["replay", "A@charge.after_call:kill"], "--workers"),
                    (["report", "--schedule", ""], "--workers"), (["demo"], "--workers"),
                    (["scenario", "lease_takeover"], "--repeat"), (["selftest"], "--jobs")]


@pytest.mark.parametrize("command, option", _INTEGER_OPTIONS)
@pytest.mark.parametrize("value", ["\u0662", "\uff12", "+2", "2_0", " 2", "0x10", "2.0"])
def test_an_integer_option_is_ascii_digits_as_a_seed_is(capsys, command, option, value):
    """Protects: --workers \u0663 (an Arabic-Indic 3), a fullwidth \uff12, +2, 2_0 (20 workers) or
    ' 2' ran, read by int() as another text than the reproduce line gives back; every integer
    option is read as --seed is, in ASCII digits (a leading minus reaches the option's own range
    check), and anything else is exit 2 naming the option and the value, before any run."""
    code, out, err = run_cli(capsys, *command, option, value)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert f"argument {option}: " in line and repr(value) in line and "ASCII digits" in line, line


@pytest.mark.parametrize("argv, named", [
    (["replay", "A@charge.after_call:kill", "--same-identity", "\u0660.\u0665"], "--same-identity: '\u0660.\u0665'"),
    (["replay", "A@charge.after_call:kill", "--same-identity", "0.0_5"], "--same-identity: '0.0_5'"),
    (["matrix", "--timing", "lease-ttl-ms=\uff12\uff10\uff10"], "'lease-ttl-ms=\uff12\uff10\uff10'"),
    (["matrix", "--timing", "poll-ms=1_0"], "'poll-ms=1_0'"),
])
def test_a_fractional_option_is_ascii_too(capsys, argv, named):
    """Protects: float() read --same-identity \u0660.\u0665 (Arabic-Indic 0.5) as 0.5 and
    --timing lease-ttl-ms=\uff12\uff10\uff10 (fullwidth) as 200 ms; both are exit 2 naming them."""
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert named in line and "ASCII digits" in line, line


def test_integer_options_still_read_plain_digits(capsys):
    code, out, err = run_cli(capsys, "matrix", "--workload", "single", "--points", "after_call",
                             "--actions", "kill", "--workers", "03", "--jobs", "1", "--depth", "1", "--json", "-q")
    assert code == 0 and json.loads(out)["runs"] == 1
    code, out, err = run_cli(capsys, "matrix", "--workers", "-1")  # the range, as --workers 0
    assert code == 2 and "--workers -1: use a number of workers from 1 to 26" in err


@pytest.mark.parametrize("argv, named", [
    (["matrix", "--points", "after_call,"], "--points 'after_call,'"),
    (["matrix", "--points", "after_call,,in_call"], "--points 'after_call,,in_call'"),
    (["explore", "--points", ",after_call"], "--points ',after_call'"),
    (["matrix", "--steps", "charge, ,reserve"], "--steps 'charge, ,reserve'"),
    (["explore", "--steps", "charge,"], "--steps 'charge,'"),
    (["matrix", "--actions", "kill,"], "--actions 'kill,'"),
    (["matrix", "--depth", "2", "--forms", "hits,"], "--forms 'hits,'"),
    (["selftest", "--mutants", "no-cas,"], "--mutants 'no-cas,'"),
    (["matrix", "--timing", "lease-ttl-ms=200,"], "--timing: 'lease-ttl-ms=200,'"),
])
def test_an_empty_item_in_a_list_is_refused_naming_the_value(capsys, argv, named):
    """Protects: --points after_call, (a trailing comma, or a,,b) ran as if the stray comma were not
    there, though a name was likely lost from the list; every comma-separated option refuses an
    empty item, exit 2 naming the value, as it refuses an empty list."""
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert named in line and "stray comma" in line, line


def test_with_json_the_report_hint_goes_to_stderr_and_stdout_stays_json(capsys):
    """Protects: with --json, a failure without --report-dir said nothing about how to get a report
    (the hint was printed only in the text output, on stdout); now it is a line on stderr, beside
    the progress, stdout stays one JSON object, and --quiet silences it there."""
    for argv in (["replay", "A@charge.after_call:1*pause"],
                 ["matrix", "--points", "after_call", "--steps", "charge", "--actions", "pause"]):
        code, out, err = run_cli(capsys, *argv, "--target", "mutant:no-fence-check", "--json")
        assert code == 1 and json.loads(out)["valid"] is False and json.loads(out)["report"] is None
        assert "killpoint: no HTML report written: add --report-dir DIR" in err, err
        code, out, err = run_cli(capsys, *argv, "--target", "mutant:no-fence-check", "--json", "-q")
        assert code == 1 and json.loads(out)["valid"] is False and err == ""


def test_a_negative_seed_is_still_a_seed(capsys):
    code, out, err = run_cli(capsys, "replay", "A@charge.after_call:kill", "--seed", "-3", "--json", "-q")
    assert code == 0 and json.loads(out)["results"][0]["seed"] == -3


def test_a_schedule_may_name_a_replacement_a_run_can_start():
    # With one worker, the first replacement is a fresh identity B: depth 2's workers form uses it.
    from killpoint import chaos
    from killpoint.errors import BadInput
    from killpoint.harness.identities import check_schedule

    check_schedule(chaos.parse("A@charge.after_call:kill,B@charge.after_call:kill"),
                   steps=("charge",), workers=1)
    with pytest.raises(BadInput, match="'Z'"):
        check_schedule(chaos.parse("Z@charge.after_call:kill"), steps=("charge",), workers=2)


# -- around the result: progress, colour, version, settings, JUnit, statistics, narration ---------------
def _killpoint(*argv: str, env: dict[str, str] | None = None, cwd: str | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "killpoint.harness.cli", *argv], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def test_matrix_into_a_pipe_shows_progress_lines_on_stderr_while_it_runs_and_a_closing_line():
    started = time.monotonic()
    proc = _killpoint("matrix", "--steps", "charge", env={"NO_COLOR": "1"})
    try:
        first = proc.stderr.readline()
        waited = time.monotonic() - started
        assert proc.poll() is None, "the first progress line came only at the end"
        assert first.startswith("killpoint matrix: 0/24 runs"), (first, waited)
        out, err = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    lines = [first.rstrip("\n")] + err.splitlines()
    assert any(line.startswith("killpoint matrix: 24/24 runs") for line in lines)
    assert lines[-1].startswith("killpoint matrix: 24 runs in ") and lines[-1].endswith("(24 valid)")
    assert "killpoint matrix:" not in out and "\x1b" not in out + err  # NO_COLOR: no escape codes
    assert out.rstrip().endswith(": valid")


def test_no_color_output_has_no_escape_codes_and_force_color_colours_a_pipe():
    plain = _killpoint("replay", "A@charge.after_call:1*pause", "--target", "mutant:no-fence-check",
                       env={"NO_COLOR": "1", "FORCE_COLOR": "1"})
    out, err = plain.communicate(timeout=HANG_S)
    assert plain.returncode == 1 and "VIOLATED stale_writes_rejected" in out and "\x1b" not in out + err
    forced = _killpoint("replay", "A@charge.after_call:1*pause", "--target", "mutant:no-fence-check",
                        env={"NO_COLOR": "", "FORCE_COLOR": "1"})
    out, err = forced.communicate(timeout=HANG_S)
    assert forced.returncode == 1 and "\x1b[1;31mVIOLATED\x1b[0m stale_writes_rejected" in out
    assert "\x1b[1;31m1 violated\x1b[0m" in err


def test_version_prints_the_installed_version(capsys):
    from importlib.metadata import version

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"killpoint {version('killpoint')}"


def _pyproject(tmp_path, text: str):
    (tmp_path / "pyproject.toml").write_text(text, encoding="utf-8")
    deeper = tmp_path / "src" / "pkg"
    deeper.mkdir(parents=True)
    return deeper


def test_tool_killpoint_table_sets_seed_and_store_of_matrix_and_flags_win(capsys, tmp_path, monkeypatch, pg_dsn):
    monkeypatch.chdir(_pyproject(tmp_path, f'[tool.killpoint]\nseed = 7\nstore = "{pg_dsn}"\n'
                                           '[tool.killpoint.timing]\nlease-ttl-ms = 150\n'))
    argv = ["matrix", "--json", "--quiet", "--points", "after_call", "--steps", "charge", "--actions", "kill"]
    code, out, err = run_cli(capsys, *argv)
    (run,) = json.loads(out)["results"]
    assert code == 0 and (run["seed"], run["store"]) == (7, redact(pg_dsn))
    code, out, err = run_cli(capsys, *argv, "--seed", "3", "--store", "sqlite")
    (run,) = json.loads(out)["results"]
    assert code == 0 and (run["seed"], run["store"]) == (3, "sqlite")


def test_a_reproduce_line_names_what_the_table_would_otherwise_change(capsys, tmp_path, monkeypatch):
    """Protects: flags given over the [tool.killpoint] table were left out of the reproduce line
    when they were killpoint's defaults (two workers, the run clock on, SQLite, the orders
    workload), so the line, run in the same project, ran the table's settings instead: another
    run, another verdict."""
    monkeypatch.chdir(_pyproject(tmp_path, '[tool.killpoint]\nreal-time = true\nworkers = 3\nseed = 7\n'
                                           'workload = "plain"\nstore = "sqlite"\n'
                                           '[tool.killpoint.timing]\nlease-ttl-ms = 5000\n'))
    argv = ["replay", "A@charge.after_call:kill", "--workers", "2", "--no-real-time", "--workload", "orders",
            "--store", "sqlite", "--json"]
    code, out, err = run_cli(capsys, *argv)
    first = json.loads(out)
    line = first["reproduce"]
    for named in ("--workers 2", "--no-real-time", "--workload orders", "--store sqlite",
                  "--timing lease-ttl-ms=5000", "--seed 7"):
        assert named in line, line
    # The line, run in the same project, makes the same run.
    code2, out2, _ = run_cli(capsys, *shlex.split(line)[1:], "--json")
    again = json.loads(out2)
    assert (code2, again["reproduce"], again["results"][0]["schedule"]) == (code, line, "A@charge.after_call:kill")
    assert again["results"][0]["workers_spawned"] == first["results"][0]["workers_spawned"]


@pytest.mark.parametrize("table, named", [("sed = 7", "'sed'"), ("workers = \"two\"", "workers = 'two'"),
                                          ("[tool.killpoint.timing]\nlease = 5", "'lease'")])
def test_tool_killpoint_table_with_an_unknown_key_or_bad_value_exits_2_naming_it(
        capsys, tmp_path, monkeypatch, table, named):
    monkeypatch.chdir(_pyproject(tmp_path, "[tool.killpoint]\n" + table + "\n"))
    code, out, err = run_cli(capsys, "matrix")
    assert code == 2 and out == "" and named in err and len(err.strip().splitlines()) == 1
    assert str(tmp_path / "pyproject.toml") in err


def test_junit_of_a_failing_matrix_parses_with_one_failure_per_violated_run(capsys, tmp_path):
    path = tmp_path / "ci" / "killpoint.xml"
    code, out, err = run_cli(capsys, "matrix", "--target", "mutant:no-fence-check", "--steps", "charge",
                             "--points", "after_call,before_commit", "--json", "--junit-xml", str(path))
    report = json.loads(out)
    violated = [r for r in report["results"] if r["valid"] is False]
    assert code == 1 and violated
    suite = ET.parse(path).getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == report["runs"] and int(suite.get("failures")) == len(violated)
    failed = [c for c in cases if c.find("failure") is not None]
    assert [c.find("properties/property[@name='schedule']").get("value") for c in failed] == \
        [r["schedule"] for r in violated]
    assert all("reproduce: killpoint replay " in c.find("failure").text for c in failed)


def test_stats_show_the_points_that_fired_per_run_and_in_total(capsys):
    code, out, err = run_cli(capsys, "matrix", "--points", "after_call", "--steps", "charge", "--stats")
    assert code == 0
    assert "A@charge.after_call:kill: after_call A kill x1" in out
    assert "A@charge.after_call:1*pause: after_call A pause x1" in out
    assert "A@charge.after_call:1*pause(until=after_claim): after_call A pause x1" in out
    table = out.split("crash points over 3 run(s), 3 fired:")[1].splitlines()
    rows = {tuple(line.split()[:3]) for line in table if line.strip().startswith("after_call")}
    assert rows == {("after_call", "kill", "1"), ("after_call", "pause", "2")}


def test_replay_narrates_the_run_and_a_failure_without_report_dir_says_how_to_get_the_report(capsys):
    code, out, err = run_cli(capsys, "replay", "A@charge.after_call:1*pause", "--target",
                             "mutant:no-fence-check", "--narrate")
    assert code == 1
    assert "SIGSTOP to A" in out and "B claimed order-1:charge with fence 2" in out
    assert "accepted A's commit with fence 1" in out  # the stale write, told as it happened
    # The 30 s lease, skipped by the virtual clock, is told as run time that passed, not wall time.
    assert re.search(r"\u22ee \+(29|30)\.\d s of run time\n.*B claimed order-1:charge", out)
    assert out.count("Times are run time on the virtual clock") == 1 and "of run time in" in out
    assert "add --report-dir DIR" in out


def test_an_unusable_report_dir_is_refused_before_the_first_run(capsys, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    foreign = tmp_path / "site"
    foreign.mkdir()
    (foreign / "index.html").write_text("<p>my own page</p>")
    for where, why in ((a_file, "is a file"), (foreign, "did not write"),
                       (a_file / "below", "cannot write")):
        # --report on-failure and a run that would be valid: still refused, and before any run
        code, out, err = run_cli(capsys, "replay", "", "--workload", "single", "--report-dir", str(where))
        assert code == 2 and out == "" and why in err and len(err.strip().splitlines()) == 1, err
    assert (foreign / "index.html").read_text() == "<p>my own page</p>"


def test_a_command_refused_for_bad_input_leaves_the_report_dir_as_it_was(capsys, tmp_path):
    """Protects: nothing is lost to a typo. The report directory is made, and an earlier command's
    pages cleared, only as the runs start: a command refused for another bad value (a schedule, a
    step) neither creates the directory nor deletes the reports already in it."""
    import os

    fresh = tmp_path / "fresh"
    code, out, err = run_cli(capsys, "report", "--schedule", "A@@nonsense", "--report-dir", str(fresh))
    assert code == 2 and "A@@nonsense" in err and not fresh.exists()
    where = tmp_path / "rep"
    code, out, _ = run_cli(capsys, "replay", "A@charge.after_call:1*pause", "--target", "mutant:no-fence-check",
                           "--report-dir", str(where), "--json")
    assert code == 1
    before = sorted(os.listdir(where))
    assert f"{json.loads(out)['results'][0]['run_id']}.html" in before
    for argv in (["replay", "A@@nonsense"], ["matrix", "--steps", "no-such-step"],
                 ["report", "--schedule", "A@nowhere.after_call:kill"]):
        code, out, err = run_cli(capsys, *argv, "--report-dir", str(where))
        assert code == 2 and len(err.strip().splitlines()) == 1, (argv, err)
        assert sorted(os.listdir(where)) == before, argv


def test_a_report_that_cannot_be_written_never_hides_the_verdict(capsys, tmp_path):
    import os

    where = tmp_path / "rep"
    code, out, err = run_cli(capsys, "replay", "A@charge.after_call:1*pause", "--target",
                             "mutant:no-fence-check", "--report-dir", str(where), "--json")
    assert code == 1 and json.loads(out)["report"]  # the first time, it is written
    os.chmod(where, 0o500)  # then the directory goes read-only (as root, make it a file instead)
    if os.access(where, os.W_OK):
        os.chmod(where, 0o700)
        for name in os.listdir(where):
            os.unlink(where / name)
        os.rmdir(where)
        where.mkdir()
        (where / "killpoint.css").mkdir()  # a file killpoint cannot write
    try:
        code, out, err = run_cli(capsys, "replay", "A@charge.after_call:1*pause", "--target",
                                 "mutant:no-fence-check", "--report-dir", str(where), "--json")
    finally:
        os.chmod(where, 0o700)
    report = json.loads(out)
    assert code == 1 and report["valid"] is False  # the violation, not a bad-input exit
    assert report["report"] is None and "cannot write reports" in report["report_error"]
    assert "the verdict stands" in err


def test_a_junit_xml_path_no_file_can_be_written_to_is_refused_before_the_first_run(capsys, tmp_path):
    """Protects: a --junit-xml typo (a directory, a path under a regular file, a folder that cannot
    be written) is exit 2 naming it before any run, as --report-dir is; before, every run was made
    and then the command ended exit 2 with nothing on stdout, its verdict lost. A missing parent
    folder is made, as pytest makes it."""
    import os

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    (tmp_path / "a-dir").mkdir()
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o500)
    cases = [(tmp_path / "a-dir", "is a directory"), (a_file / "k.xml", "Not a directory"),
             (a_file / "deeper" / "k.xml", "Not a directory")]
    if not os.access(locked, os.W_OK):  # root may write anywhere
        cases.append((locked / "k.xml", "Permission denied"))
    try:
        for command in (["replay", "A@charge.after_call:1*pause", "--target", "mutant:no-cas"],
                        ["selftest", "--quick", "--mutants", "no-cas"]):
            for where, why in cases:
                code, out, err = run_cli(capsys, *command, "--junit-xml", str(where), "--json")
                assert code == 2 and out == "", (where, code, out[:200])
                assert len(err.strip().splitlines()) == 1, err  # no progress line: no run made
                assert "--junit-xml" in err and str(where)[-40:] in err and why in err, err
    finally:
        os.chmod(locked, 0o700)
    assert os.listdir(locked) == []  # the check leaves nothing behind
    fresh = tmp_path / "made" / "for it" / "k.xml"
    code, out, err = run_cli(capsys, "replay", "", "--workload", "single", "--junit-xml", str(fresh))
    assert code == 0 and ET.parse(fresh).getroot().tag == "testsuites"


def test_a_junit_xml_that_cannot_be_written_after_the_runs_is_a_warning_and_the_verdict_stands(
        capsys, tmp_path, monkeypatch):
    """Protects the verdict: when the JUnit file cannot be written once the runs are done (a disk
    that filled, a folder removed meanwhile), the command says so in a warning line and still
    prints its JSON and exits with the verdict's code (1 here), in every command writing one."""
    import errno

    from killpoint.reports import junit

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(junit, "write", full)
    path = str(tmp_path / "k.xml")
    code, out, err = run_cli(capsys, "replay", "A@charge.after_call:1*pause", "--target", "mutant:no-cas",
                             "--junit-xml", path, "--json", "-q")
    report = json.loads(out)
    assert code == 1 and report["valid"] is False
    assert "No space left on device" in report["junit_error"]
    assert err.strip() == (f"killpoint: warning: --junit-xml '{path}': cannot write it there "
                           f"(No space left on device); the verdict stands")
    code, out, err = run_cli(capsys, "selftest", "--quick", "--mutants", "no-cas", "--junit-xml", path,
                             "--json", "-q")
    assert code == 0 and json.loads(out)["valid"] is True
    assert "killpoint: warning: --junit-xml" in err and "the verdict stands" in err


def test_each_command_leaves_only_its_own_runs_in_the_report_dir(capsys, tmp_path):
    import os

    where = tmp_path / "rep"
    code, out, _ = run_cli(capsys, "matrix", "--steps", "charge", "--points", "after_call,before_commit",
                           "--target", "mutant:no-fence-check", "--report-dir", str(where), "--json")
    results = json.loads(out)["results"]
    assert code == 1 and len(results) == 6
    first = [f"{r['run_id']}.html" for r in results]
    assert sorted(p for p in os.listdir(where) if p.endswith(".html")) == sorted(["index.html", *first])
    code, out, _ = run_cli(capsys, "replay", "A@charge.after_call:1*pause", "--target",
                           "mutant:no-fence-check", "--report-dir", str(where), "--json")
    assert code == 1
    (page,) = [f"{r['run_id']}.html" for r in json.loads(out)["results"]]
    assert sorted(p for p in os.listdir(where) if p.endswith(".html")) == sorted(["index.html", page])
    index = (where / "index.html").read_text(encoding="utf-8")
    assert not any(name in index for name in first)


def test_a_replayed_stall_that_races_the_stuck_monitor_is_run_with_a_one_line_warning(capsys):
    """A stall that ends where the stuck monitor may or may not have flagged its lease can give
    two verdicts for one seed: the command says so on stderr, naming the stall and the window, and
    still runs it (stdout stays the JSON). A stall clear of the window, or at a point where no
    lease is held, gets no warning."""
    code, out, err = run_cli(capsys, "replay", "A@charge.after_call:1*sleep(60000)", "--json", "-q")
    assert code == 0 and json.loads(out)["runs"] == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("killpoint: warning: sleep(60000)"), err
    assert "57000 to 78000 ms" in lines[0]
    for schedule in ("A@charge.after_call:1*sleep(45000)", "A@charge.before_claim:1*sleep(60000)"):
        code, out, err = run_cli(capsys, "replay", schedule, "--json", "-q")
        assert code == 0 and json.loads(out)["runs"] == 1 and "warning" not in err, (schedule, err)


def test_a_timing_of_a_year_is_the_largest_accepted_and_runs(capsys):
    # The bound of the timings is a year: that much is a timing (run on the virtual clock at no
    # wall cost), one millisecond more is bad input (above).
    code, out, err = run_cli(capsys, "replay", "A@charge.after_call:kill", "--workload", "single",
                             "--timing", "poll-ms=31536000000,lease-ttl-ms=31536000000", "--json")
    assert code == 0, err
    assert json.loads(out)["valid"] is True


def test_a_heartbeat_not_shorter_than_the_lease_is_run_with_a_one_line_warning(capsys):
    """A heartbeat that does not come before the lease runs out takes every long step away from a
    healthy worker: likely a timing given alone (`--timing lease-ttl-ms=200` keeps the 10 s
    heartbeat of the run clock). The run still happens; stderr says so once, naming both values."""
    argv = ["replay", "A@charge.after_call:kill", "--workload", "single", "--json", "-q"]
    code, out, err = run_cli(capsys, *argv, "--timing", "lease-ttl-ms=200")
    assert code == 0 and json.loads(out)["runs"] == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("killpoint: warning: timing heartbeat-ms 10000 is not "
                                                   "shorter than lease-ttl-ms 200"), err
    for timing in ("lease-ttl-ms=200,heartbeat-ms=50", "heartbeat-ms=29999"):
        code, out, err = run_cli(capsys, *argv, "--timing", timing)
        assert code == 0 and "warning" not in err, (timing, err)


def test_a_ctrl_c_while_the_command_line_is_still_imported_ends_in_one_line(monkeypatch, capsys):
    """Protects: a Ctrl-C in the first fifth of a second (Python still importing the command line)
    printed a KeyboardInterrupt traceback; the console script now says it in one line, exit 130.
    The interrupt is made to land in that import, whatever the machine's speed."""
    import importlib.abc

    from killpoint._main import main as console_script

    class Interrupting(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "killpoint.harness.cli":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "killpoint.harness.cli")
    monkeypatch.setattr(sys, "meta_path", [Interrupting(), *sys.meta_path])
    assert console_script() == 130
    assert capsys.readouterr().err == "killpoint: interrupted while starting; nothing was run\n"


@pytest.mark.parametrize("sig, code", [("SIGTERM", 143), ("SIGHUP", 129)])
def test_a_sigterm_or_sighup_while_the_command_line_is_still_imported_ends_in_one_line(monkeypatch, capsys, sig, code):
    """Protects: SIGTERM or SIGHUP in the command line's first fifth of a second ended it by the
    signal's default (no line); the console script now says it in one line with the signal's exit
    code. The signal is made to land in that import, whatever the machine's speed."""
    import importlib.abc
    import signal

    from killpoint._main import main as console_script

    class Signalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "killpoint.harness.cli":
                os.kill(os.getpid(), getattr(signal, sig))  # delivered here, before the import returns
            return None

    before = signal.getsignal(getattr(signal, sig))
    monkeypatch.delitem(sys.modules, "killpoint.harness.cli")
    monkeypatch.setattr(sys, "meta_path", [Signalled(), *sys.meta_path])
    assert console_script() == code
    assert capsys.readouterr().err == "killpoint: interrupted while starting; nothing was run\n"
    assert signal.getsignal(getattr(signal, sig)) == before  # the handler for the start is taken back


def test_the_console_script_is_the_one_that_ends_a_ctrl_c_at_start_in_one_line():
    from importlib.metadata import entry_points

    [script] = [e for e in entry_points(group="console_scripts") if e.name == "killpoint"]
    assert script.value == "killpoint._main:main"


_BAD_IMPORT = "raise RuntimeError('boom at import')\n"
_DUPLICATE_IDS = """
import dataclasses
from killpoint.harness.workload import resolve_workload

def twice(seed):
    w = resolve_workload("single", seed)
    return dataclasses.replace(w, name="twice", instances=(w.instances[0], w.instances[0]))
"""


@pytest.mark.parametrize("argv, named", [
    # A module that raises as it imports: an "infrastructure failure" (exit 3) before.
    (["replay", "A@charge.after_call:kill", "--target", "kp_badimport:fn"],
     "importing 'kp_badimport' raised RuntimeError: boom at import"),
    (["replay", "A@charge.after_call:kill", "--workload", "kp_badimport:fn"],
     "importing 'kp_badimport' raised RuntimeError"),
    # A path for a module: a TypeError from importlib (exit 3) before.
    (["replay", "A@charge.after_call:kill", "--target", "../etc:passwd"], "'../etc' is not a module name"),
    (["replay", "A@charge.after_call:kill", "--workload", "../etc:passwd"], "'../etc' is not a module name"),
    # Two instances of one id: exit 3 before.
    (["replay", "A@charge.after_call:kill", "--workload", "kp_twice:twice"],
     "instances 1 and 2 have the same id 'order-1'"),
    # Numbers float() reads and the reproduce line would give back otherwise, and a key given twice:
    # all taken silently before.
    (["replay", "A@charge.after_call:kill", "--timing", "lease-ttl-ms=1e3"], "'lease-ttl-ms=1e3'"),
    (["replay", "A@charge.after_call:kill", "--timing", "lease-ttl-ms= 200"], "'lease-ttl-ms= 200'"),
    (["replay", "A@charge.after_call:kill", "--timing", "lease-ttl-ms=200,lease-ttl-ms=300"],
     "'lease-ttl-ms' is given twice"),
    (["replay", "A@charge.after_call:kill", "--timing", "lease-ttl-ms=200,lease_ttl_ms=300"],
     "'lease_ttl_ms' is given twice"),
    # A schedule that starts with '-': taken for an option before ("arguments are required: schedule").
    (["replay", "-1*kill"], "schedule '-1*kill'"),
])
def test_user_errors_are_bad_input_exit_2_naming_the_module_or_field(capsys, tmp_path, monkeypatch, argv, named):
    (tmp_path / "kp_badimport.py").write_text(_BAD_IMPORT)
    (tmp_path / "kp_twice.py").write_text(_DUPLICATE_IDS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = run_cli(capsys, *argv)
    assert code == 2, err
    [line] = err.strip().splitlines()
    assert line.startswith("killpoint: error: ") and named in line, line


def test_explore_refuses_a_database_that_is_a_file_or_cannot_be_written(capsys, tmp_path):
    """Protects: --database naming a file (or a folder that cannot be written) ran the whole search
    and kept no example, without a word."""
    a_file = tmp_path / "examples.txt"
    a_file.write_text("mine")
    code, out, err = run_cli(capsys, "explore", "--budget", "1", "--database", str(a_file))
    assert code == 2 and a_file.read_text() == "mine"
    [line] = err.strip().splitlines()
    assert f"--database '{a_file}': not a folder" in line
    read_only = tmp_path / "ro"
    read_only.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(read_only)],
                             capture_output=True)
    if mounted.returncode != 0:  # not root: a folder without write permission is read-only enough
        read_only.chmod(0o555)
    try:
        code, out, err = run_cli(capsys, "explore", "--budget", "1", "--database", str(read_only))
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", "-l", str(read_only)], capture_output=True)
        read_only.chmod(0o755)
    assert code == 2, err
    [line] = err.strip().splitlines()
    assert f"--database '{read_only}': cannot write there" in line


def test_a_long_store_value_is_clipped_in_the_message(capsys):
    store = "postgresql://user:pw@127.0.0.1:1/" + "d" * 300
    code, out, err = run_cli(capsys, "replay", "A@charge.after_call:kill", "--store", store)
    assert code == 3
    [line] = err.strip().splitlines()
    assert "d" * 201 not in line and re.search(r"\.\.\. \(33\d characters\)", line) and ":pw@" not in line, line


def test_a_scenario_whose_target_raises_and_judges_nothing_is_unknown_not_invalid(capsys):
    """Protects: a target that is no worker (os:getcwd raises TypeError in every worker) made the
    lease-takeover story "INVALID, 8 expected facts missing", exit 1, though no invariant judged
    anything: a run that could not tell the story says nothing of the rule (exit 3)."""
    code, out, err = run_cli(capsys, "scenario", "lease_takeover", "--target", "os:getcwd", "--json")
    report = json.loads(out)
    assert code == 3 and report["valid"] is None and report["violations"] == [], report["unknown_reasons"]
    assert report["judged"] == 0 and not report["story_held"]
    assert any("the target raised TypeError" in r for r in report["unknown_reasons"])


def test_an_instance_id_outside_latin_1_runs_end_to_end(capsys, tmp_path, monkeypatch):
    """Protects: an instance id such as job-名前 crashed the reference worker (its idempotency key
    sent as a header: UnicodeEncodeError 'latin-1'), exit 3. Its effects are now keyed, judged and
    valid as any other id's."""
    (tmp_path / "kp_unicode.py").write_text(
        "import dataclasses\n"
        "from killpoint.harness.workload import resolve_workload\n"
        "def named(seed):\n"
        "    w = resolve_workload('single', seed)\n"
        "    return dataclasses.replace(w, name='named', instances=tuple(\n"
        "        dataclasses.replace(i, id=i.id.replace('order-', 'job-\\u540d\\u524d-')) for i in w.instances))\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = run_cli(capsys, "replay", "A@charge.after_call:kill", "--workload", "kp_unicode:named", "--json")
    report = json.loads(out)
    assert code == 0 and report["valid"] is True, (report["unknown_reasons"], err[-2000:])
    assert report["invariants"]["no_duplicate_effects"]["checked"] == 1
    assert report["results"][0]["fired"] == {"A@charge.after_call:kill": 1}


@pytest.mark.parametrize("password", ["s3cr#et", "s3cr@et", "s3/cr/et", "s3cr%et", "s3 cr et", "#@/% mix"])
@pytest.mark.parametrize("tail", ["", "?sslmode=bogus"])
def test_no_password_is_printed_whatever_its_characters(capsys, password, tail):
    """Protects: a password holding an unencoded '#' was printed in clear in the JSON's store field,
    one holding '@' in part by the error line: the patterns that found passwords ended the URL where
    such a character stood. The command's DSNs are parsed and their passwords hidden in every form."""
    from urllib.parse import quote

    store = f"postgresql://postgres:{password}@127.0.0.1:1/test{tail}"
    for argv in (["replay", "A@charge.after_call:kill", "--json"], ["matrix", "--steps", "charge", "--json"]):
        code, out, err = run_cli(capsys, *argv, "--store", store)
        assert code in (2, 3), err
        for form in {password, quote(password, safe=""), password.split(" ")[0] if " " in password else password}:
            assert form not in out + err, (form, out + err)
        assert "***" in out + err


def test_a_valid_matrix_with_report_dir_writes_the_index_and_says_so(capsys, tmp_path):
    """Protects: --report-dir on a valid matrix (--report on-failure, the default) left a folder
    holding only a marker, and said nothing. Now the index, its rows linking no page, and a line."""
    import os

    where = tmp_path / "rep"
    code, out, err = run_cli(capsys, "matrix", "--steps", "charge", "--points", "after_call,before_commit",
                             "--report-dir", str(where), "--json")
    report = json.loads(out)
    assert code == 0 and report["valid"] is True and report["report"] == str(where / "index.html")
    assert sorted(p for p in os.listdir(where) if p.endswith(".html")) == ["index.html"]
    index = (where / "index.html").read_text(encoding="utf-8")
    assert index.count("no page") == report["runs"] == 6 and ".html" not in index
    assert all(r["run_id"] in index for r in report["results"])  # each row names its run
    assert "wrote the index only (every run valid; --report always writes a page for each run)" in err


def test_report_pages_are_announced_and_their_run_ids_are_unique_and_match_the_file_names(capsys, tmp_path):
    """Protects: with --jobs, each runner numbered its runs from 1, so the index showed two
    different run0001-... ids; and pages were named by position (run-0001.html) while ids counted
    the matrix's fault-free path run too, so no page's name matched its run's id. Now a run's id is
    unique, its page is named after it, and the index and the JSON name it alike."""
    import os
    import re

    where = tmp_path / "rep"
    code, out, err = run_cli(capsys, "matrix", "--steps", "charge", "--points", "after_call,before_commit",
                             "--target", "mutant:no-fence-check", "--jobs", "2", "--report", "always",
                             "--report-dir", str(where), "--json")
    results = json.loads(out)["results"]
    assert code == 1 and len(results) == 6  # 2 kills, 2 points paused at two moments
    ids = [r["run_id"] for r in results]
    assert len(set(ids)) == 6 and all(re.fullmatch(r"run\d{4}-s0-[0-9a-f]{8}", i) for i in ids), ids
    numbers = [int(re.match(r"run(\d+)-", i)[1]) for i in ids]  # the session's runs, in order (the
    assert numbers == list(range(numbers[0], numbers[0] + 6))  # matrix's fault-free path run may come first)
    pages = sorted(p for p in os.listdir(where) if p.endswith(".html") and p != "index.html")
    assert pages == sorted(f"{i}.html" for i in ids)
    for run_id in ids:
        assert run_id in (where / f"{run_id}.html").read_text(encoding="utf-8")
    index = (where / "index.html").read_text(encoding="utf-8")
    assert all(f'<a href="{i}.html">{i}</a>' in index for i in ids)
    assert sorted(os.listdir(where)) == sorted([*pages, "index.html", "killpoint.css", "killpoint.js",
                                                ".killpoint-report"])
    # each page is written as its run ends (--report always): the closing line says so
    assert "killpoint: wrote 6 report page(s) as the runs came, and the index, to" in err