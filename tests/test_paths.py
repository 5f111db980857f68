"""The matrix's path exploration: the later hits a fault-free run reaches, and a kill at each.

First the pure part (which hits end a new path, the bound, what a recovery probe reveals) on
hand-written traces, then the command: a bug that lives only on a compensation's retry is caught
with paths explored and missed by the first hits alone; a hit never reached stays never fired.
"""

from __future__ import annotations

import json

import pytest

from killpoint import chaos
from killpoint.chaos.generator import hits_of, later_hits, path_schedules
from killpoint.harness.checkers.base import Verdict
from killpoint.harness.cli import main
from killpoint.harness.history import History, build
from killpoint.harness.paths import Exploration, explore_recovery, trace
from killpoint.harness.run import RunConfig, RunResult

ATTEMPT = ("before_claim", "after_claim", "before_call", "after_call", "before_commit")


def _trace(*visits: tuple[str, str, tuple[str, ...]]) -> list[tuple[str, str, str]]:
    return [(inst, step, p) for inst, step, points in visits for p in points]


def test_hits_are_counted_per_step_and_point_over_instances_as_a_fault_counts_them():
    hits = hits_of(_trace(("o1", "reserve", ATTEMPT), ("o2", "reserve", ATTEMPT)) + [(None, None, "before_claim")])
    assert [(h.point, h.hit, h.instance) for h in hits if h.point == "after_call"] == [
        ("after_call", 1, "o1"), ("after_call", 2, "o2")]
    assert len(hits) == 10  # the point outside any step is left out: no fault with a step lands there


def test_paths_are_the_later_hits_whose_points_no_earlier_hit_passed_all_is_every_later_hit():
    trace_ = _trace(("o1", "reserve", ATTEMPT),
                    ("o2", "reserve", ATTEMPT),                    # the same path on another instance
                    ("o2", "reserve", ATTEMPT),                    # o2 undone: a second pass, a new path
                    ("o4", "reserve", ATTEMPT[:4]), ("o4", "reserve", ATTEMPT))  # a transient retry
    hits = hits_of(trace_)
    steps, points = ("reserve",), ATTEMPT
    paths = later_hits(hits, steps, points, "paths")
    assert [(h.point, h.hit) for h in paths if h.point == "after_call"] == [("after_call", 3), ("after_call", 5)]
    assert all(h.hit > 1 for h in paths) and len(paths) == 5 + 5  # o2's second pass, o4's retry
    assert len(later_hits(hits, steps, points, "all")) == len(hits) - len(ATTEMPT)
    assert later_hits(hits, steps, points, "first") == []
    assert later_hits(hits, steps, ("after_call",), "paths") == [h for h in paths if h.point == "after_call"]
    with pytest.raises(ValueError, match="hits 'most'"):
        later_hits(hits, steps, points, "most")


def test_the_bound_keeps_the_first_paths_found_and_counts_the_rest_as_left():
    hits = later_hits(hits_of(_trace(("o1", "reserve", ATTEMPT), ("o1", "reserve", ATTEMPT))),
                      ("reserve",), ATTEMPT, "paths")
    schedules, left = path_schedules(hits, 2)
    assert [str(s) for s in schedules] == ["A@reserve.before_claim#2:kill", "A@reserve.after_claim#2:kill"]
    assert left == 3
    assert path_schedules(hits, None)[1] == 0 and path_schedules(hits, 0) == ([], 5)
    heartbeat = hits_of(_trace(("o1", "s", ("heartbeat",)), ("o1", "s", ("heartbeat",))))[1]
    assert str(heartbeat.fault()) == "A@s.heartbeat#2:hang"


def _probe(schedule: str, points: list[tuple[str, str, str, str]], fired: bool = True) -> RunResult:
    """A recovery probe's result: its hits (process, instance, step, point) in order."""
    history = build([(n, process, "point", "event", {"instance": i, "step": s, "point": p, "action": None})
                     for n, (process, i, s, p) in enumerate(points, start=1)])
    config = RunConfig(schedule=chaos.parse(schedule), workers=1, same_identity=1.0)
    return RunResult(config, "r", history, Verdict(True), {schedule: int(fired)}, (), 2, 0.0, "")


def test_a_probe_reveals_the_recovery_hits_after_its_kill_on_paths_not_seen_before():
    first = [("A", "o1", "charge", p) for p in ATTEMPT[:4]]  # killed at after_call
    recovery = [("A.2", "o1", "charge", p) for p in ("before_claim", "after_claim", "before_commit")]
    probe = _probe("A@charge.after_call:kill", first + recovery)
    found = Exploration("paths", (), (), (), 0)
    out = explore_recovery(found, [probe], ("charge",), ATTEMPT, None)
    assert [str(p.schedule) for p in out.plans] == [
        "A@charge.after_call:kill,A@charge.before_claim#2:kill",
        "A@charge.after_call:kill,A@charge.after_claim#2:kill",
        "A@charge.after_call:kill,A@charge.before_commit:kill"]  # A's first before_commit: hit 1
    assert all(p.same_identity == 1.0 for p in out.plans) and out.recovery == 3 and out.probes == 1
    # The same recovery seen again adds nothing; a bound leaves the rest counted; an unfired kill
    # reveals nothing (its run says so itself).
    again = explore_recovery(out, [probe], ("charge",), ATTEMPT, None)
    assert again.plans == out.plans and again.left == 0
    bounded = explore_recovery(found, [probe], ("charge",), ATTEMPT, 1)
    assert len(bounded.plans) == 1 and bounded.left == 2
    assert explore_recovery(found, [_probe("A@charge.after_call:kill", first + recovery, fired=False)],
                            ("charge",), ATTEMPT, None).plans == ()


def test_trace_reads_every_incarnation_of_the_worker_and_no_other():
    history = build([(1, "A", "point", "event", {"instance": "o1", "step": "s", "point": "p"}),
                     (2, "B", "point", "event", {"instance": "o1", "step": "s", "point": "p"}),
                     (3, "A.2", "point", "event", {"instance": "o1", "step": "s", "point": "q"}),
                     (4, "AB", "point", "event", {"instance": "o1", "step": "s", "point": "r"})])
    assert trace(history) == [("o1", "s", "p"), ("o1", "s", "q")]
    assert trace(History(())) == []


# ---------------------------------------------------------------------------------------------
# the command


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.startswith("{") else out, err


def test_a_fresh_key_on_a_compensation_retry_is_caught_only_with_paths_explored(capsys):
    """The declined order's reservation is undone by A's third reserve call; a kill right after it
    makes the release retried, under a fresh key by this mutant. The first hits never reach it."""
    args = ("matrix", "--target", "mutant:fresh-compensation-key", "--steps", "reserve", "--points",
            "after_call", "--actions", "kill", "--json")
    code, report, err = run_cli(capsys, *args)
    assert code == 1
    (violation,) = report["violations"]
    assert violation["invariant"] == "no_duplicate_effects"
    assert violation["schedule"] == "A@reserve.after_call#3:kill"
    assert report["hits"]["mode"] == "paths" and report["hits"]["explored"] >= 1
    assert report["hits"]["left"] == 0 and report["hits"]["never_fired"] == 0
    assert report["hits"]["discovery_valid"] is True
    code, report, err = run_cli(capsys, *args, "--hits", "first")
    assert code == 0 and report["runs"] == 1 and "hits" not in report


def test_paths_on_the_reference_are_valid_every_later_hit_fired_and_the_bound_is_reported(capsys):
    code, report, err = run_cli(capsys, "matrix", "--steps", "reserve", "--points", "after_call,before_commit",
                                "--actions", "kill", "--json")
    assert code == 0 and report["valid"] is True
    later = [r for r in report["results"] if "#" in r["schedule"]]
    assert len(later) == report["hits"]["explored"] >= 3
    assert all(r["unfired"] == [] for r in report["results"])
    code, report, err = run_cli(capsys, "matrix", "--steps", "reserve", "--points", "after_call,before_commit",
                                "--actions", "kill", "--json", "--max-hits", "1")
    assert code == 0 and report["hits"]["explored"] == 1 and report["hits"]["left"] == len(later) - 1
    code, out, err = run_cli(capsys, "matrix", "--steps", "reserve", "--points", "after_call",
                             "--actions", "kill", "--max-hits", "0")
    assert code == 0 and "later hits explored (paths; " in out and " left" in out
    assert "--hits all kills every hit reached" in out


def test_recovery_paths_kill_the_restarted_worker_again_and_stay_valid_on_the_reference(capsys):
    code, report, err = run_cli(capsys, "matrix", "--steps", "charge", "--points", "before_call,after_call",
                                "--actions", "kill", "--recovery-paths", "--json")
    assert code == 0 and report["valid"] is True
    hits = report["hits"]
    assert hits["probes"] == 2 and hits["recovery"] >= 1 and hits["never_fired"] == 0
    pairs = [r["schedule"] for r in report["results"] if r["schedule"].count("@") == 2]
    assert len(pairs) == hits["recovery"] and all(p.startswith("A@charge.") for p in pairs)


def test_a_hit_the_run_never_reaches_is_never_fired_and_unknown_never_valid(capsys):
    code, report, err = run_cli(capsys, "replay", "A@reserve.after_call#99:kill", "--json")
    assert code == 3 and report["valid"] is None
    assert any("never fired" in r for r in report["unknown_reasons"])


@pytest.mark.parametrize("argv, named", [
    (["--depth", "2", "--hits", "all"], "--hits"),
    (["--depth", "2", "--recovery-paths"], "--recovery-paths"),
    (["--max-hits", "-1"], "--max-hits -1"),
    (["--hits", "first", "--recovery-paths"], "--recovery-paths --hits first"),
    (["--hits", "all", "--actions", "pause"], "--actions 'pause'"),
])
def test_bad_path_options_exit_2_naming_them(capsys, argv, named):
    code, out, err = run_cli(capsys, "matrix", *argv)
    assert code == 2 and named in err and len(err.strip().splitlines()) == 1


def test_the_fixtures_matrix_explores_the_paths_killpoint_matrix_explores(killpoint):
    """``killpoint.matrix()`` in a test runs what ``killpoint matrix`` runs for the same arguments,
    later hits included: the compensation's retry is crashed, and caught, only with paths."""
    verdict = killpoint.matrix(target="mutant:fresh-compensation-key", steps=["reserve"],
                               points=["after_call"], actions="kill")
    assert verdict.valid is False
    assert "A@reserve.after_call#3:kill" in [str(r.config.schedule) for r in verdict.results]
    assert {v.invariant for v in verdict.violations} == {"no_duplicate_effects"}
    first = killpoint.matrix(target="mutant:fresh-compensation-key", steps=["reserve"],
                             points=["after_call"], actions="kill", hits="first")
    assert first.valid is True and first.runs == 1


def test_hits_outside_any_instance_are_one_path_however_often_a_claim_loop_passes_them():
    """A queue worker polls before its claim with no instance yet: its fifth poll is not a new path
    (before, each poll grew one path and the matrix crashed every poll of the loop)."""
    hits = hits_of([(None, "queue", "before_claim")] * 5 + _trace(("o1", "queue", ("after_claim",))))
    assert later_hits(hits, ("queue",), ("before_claim", "after_claim"), "paths") == []
    assert len(later_hits(hits, ("queue",), ("before_claim", "after_claim"), "all")) == 4


# -- a point passed outside any step -------------------------------------------------------------

import killpoint  # noqa: E402
from killpoint.harness import zoo_queue  # noqa: E402


class _ClaimLoop(zoo_queue._Worker):
    """The zoo's queue, its claim loop outside any step (no ``ctx.at`` before it knows the job)."""

    def next_job(self):
        self.ctx.point("before_take")
        return self.take()


stepless_queue = killpoint.Target(
    lambda ctx: _ClaimLoop(ctx, renew_by_id=False).work(), name="test_paths:stepless_queue",
    points=zoo_queue.POINTS, owns_state=True, workload="killpoint.harness.zoo_queue:jobs", run_clock=True,
    lease_points=zoo_queue.LEASE_POINTS, claim_point="taken", setup=zoo_queue.setup, done=zoo_queue.done,
    final_states=zoo_queue.final_states, history=zoo_queue.history)


def test_a_point_passed_outside_any_step_is_crashed_once_per_worker_not_once_per_step(capsys):
    """Protects: a queue whose claim loop passes ``before_take`` before it knows the job (outside
    any step) was crashed at ``A@charge.before_take``, which never fires: a run that waited for it
    and ended unknown. The fault-free run shows the point is passed only outside a step, and the
    matrix crashes it there once (``A@before_take:kill``): fired, recovered, judged."""
    code = main(["matrix", "--target", "test_paths:stepless_queue", "--json", "-q", "--actions", "kill"])
    report = json.loads(capsys.readouterr().out)
    schedules = [r["schedule"] for r in report["results"]]
    assert "A@before_take:kill" in schedules and "A@charge.before_take:kill" not in schedules
    assert code == 0 and report["valid"] is True, report["unknown_reasons"]
    assert all(not r["unfired"] for r in report["results"])
