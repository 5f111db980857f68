"""The command line contract of DESIGN section 10: exit codes, one-line errors, the JSON shape."""

from __future__ import annotations

import json

import pytest

from killpoint.chaos.points import DEFAULT_POINTS, POINTS
from killpoint.harness.checkers import ALL
from killpoint.harness.cli import main


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


@pytest.mark.parametrize("argv, named", [
    (["matrix", "--store", "mysql://x"], "mysql://x"),
    (["matrix", "--target", "mutant:nope"], "nope"),
    (["matrix", "--target", "no_such_module:fn"], "no_such_module"),
    (["matrix", "--workers", "0"], "0"),
    (["matrix", "--steps", "ship"], "ship"),
    (["matrix", "--workload", "bogus"], "bogus"),
    (["matrix", "--actions", "explode"], "explode"),
    (["nosuchcommand"], "nosuchcommand"),
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
    fired_points = {s.split(".")[1].split(":")[0] for r in report["results"] for s in r["fired"]}
    assert fired_points == set(DEFAULT_POINTS)  # the PostgreSQL store's own points only when asked


def test_json_mode_prints_exactly_one_object_and_no_progress(capsys):
    code, out, err = run_cli(capsys, "matrix", "--json", "--points", "after_call", "--steps", "charge")
    assert code == 0
    report = json.loads(out)  # the whole of stdout is one object
    assert [r["schedule"] for r in report["results"]] == ["A@charge.after_call:kill",
                                                          "A@charge.after_call:1*pause"]
    assert err == ""


def test_demo_tells_the_story_and_exits_0(capsys):
    code, out, err = run_cli(capsys, "demo")
    assert code == 0
    assert "REFUSED A's commit with fence 1" in out
    assert "manual_intervention" in out and "flagged A stuck" in out
    assert out.strip().splitlines()[-1].endswith("valid")


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
            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": salt})
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
                                             ("no_such_pkg:jobs", "no_such_pkg")])
def test_a_bad_user_workload_exits_2_naming_it(capsys, user_project, workload, named):
    code, out, err = run_cli(capsys, "replay", "", "--workload", workload)
    assert code == 2 and named in err and len(err.strip().splitlines()) == 1


def test_a_user_workload_by_pkg_module_function_on_the_reference(capsys, user_project):
    code, out, err = run_cli(capsys, "replay", "A@charge.after_call:kill", "--workload", "mytarget:two_charges",
                             "--json")
    assert code == 0 and json.loads(out)["valid"] is True


def test_a_target_that_raises_on_start_exits_3_within_seconds_naming_the_exception(capsys):
    import time

    started = time.monotonic()
    code, out, err = run_cli(capsys, "replay", "", "--target", "os:getcwd", "--json")
    elapsed = time.monotonic() - started
    report = json.loads(out)
    assert code == 3 and report["valid"] is None
    reasons = " ".join(r for u in report["unknown"] for r in u["reasons"])
    assert "TypeError" in reasons and "replacements stopped" in reasons and "bound" not in reasons
    assert report["results"][0]["workers_spawned"] <= 3
    assert elapsed < 20  # a few seconds; generous for a loaded machine
