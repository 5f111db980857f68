"""The mutant zoo proves the checkers: each mutant breaks one rule and its named invariant must
report it under a schedule of at most two faults, while the reference stays valid under the very
same schedule (otherwise the schedule, not the mutant, would be what the checker caught)."""

from __future__ import annotations

import json

import pytest

from killpoint import chaos
from killpoint.harness.checkers import ALL
from killpoint.harness.cli import main
from killpoint.harness.mutants import MUTANTS
from killpoint.harness.run import RunConfig, Session
from killpoint.harness.targets import declared, resolve
from killpoint.harness.workload import default_for

REQUIRED = {"random-request-id", "no-fence-check", "local-clock-lease", "retry-unsafe",
            "auto-resolve-manual", "commit-before-call", "no-cas", "unbounded-retry",
            "downstream-ignores-intent", "no-heartbeat-progress", "trust-checkpoint",
            "renew-by-instance", "fence-reset", "commit-before-receipt", "state-guarded-commit",
            "gives-up-on-held-lease", "fresh-compensation-key", "reprice-on-recovery", "renew-by-id-owned"}


@pytest.fixture(scope="module")
def session():
    with Session() as s:
        yield s


def run_mutant(session, mutant, target=None):
    """The mutant's schedule on ``target`` (default the mutant), with that target's own points and
    workload, as ``killpoint selftest`` runs it."""
    target = target or mutant.target_name
    own = declared(target)
    schedule = chaos.parse(mutant.schedule, points=frozenset(own.points))
    return session.run(RunConfig(schedule=schedule, target=target, **{"workload": default_for(target, own),
                                                                       **mutant.run_overrides()}))


def test_the_zoo_has_every_mutant_the_issue_asks_for_each_naming_a_real_invariant():
    assert REQUIRED <= set(MUTANTS)
    for m in MUTANTS.values():
        assert m.caught_by in ALL, m
        assert m.breaks and m.name == m.name.lower()
        assert resolve(m.target_name) is m.target


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_each_mutant_is_caught_by_its_named_invariant_within_two_faults(session, name):
    mutant = MUTANTS[name]
    result = run_mutant(session, mutant)
    assert len(result.config.schedule.faults) <= 2
    assert result.unfired == ()  # every fault landed where the schedule put it
    assert result.valid is False
    violated = {v.invariant for v in result.verdict.violations}
    assert mutant.caught_by in violated, (violated, result.verdict.unknown_reasons)


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_reference_or_the_mutants_correct_twin_is_valid_under_its_schedule(session, name):
    mutant = MUTANTS[name]  # the reference worker, or the mutant's own correct twin
    result = run_mutant(session, mutant, target=mutant.reference or "reference")
    assert result.unfired == ()
    assert result.valid is True, [v.detail for v in result.verdict.violations]


def test_a_downstream_mutant_changes_only_its_own_run(session):
    # The downstream is shared by the session; ignore_intent is configured per run id.
    broken = run_mutant(session, MUTANTS["downstream-ignores-intent"])
    after = session.run(RunConfig())
    assert "intent_conflict" in {v.invariant for v in broken.verdict.violations}
    assert after.valid is True
    conflicts = [e for e in after.history.events if e.process == "downstream" and e.get("outcome") == "conflict"]
    assert conflicts and all(e.get("status") == 422 for e in conflicts)


def test_mutants_json_is_a_list_of_name_breaks_caught_by(capsys):
    assert main(["mutants", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in listed] == list(MUTANTS)
    assert all(set(m) == {"name", "breaks", "caught_by", "schedule"} for m in listed)
    # the schedule that shows each bug, as the text output's "shown by" (before: not in the JSON)
    assert {m["name"]: m["schedule"] for m in listed}["no-fence-check"] == "A@charge.after_call:1*pause"
    assert {m["name"]: m["caught_by"] for m in listed}["no-fence-check"] == "stale_writes_rejected"


def test_mutants_text_names_each_mutant_and_its_invariant(capsys):
    assert main(["mutants"]) == 0
    out = capsys.readouterr().out
    assert all(f"mutant:{name}" in out and m.caught_by in out for name, m in MUTANTS.items())


def test_selftest_exits_0_with_every_mutant_caught_and_the_reference_valid(capsys):
    # The full selftest: every mutant, and the reference on the whole single-crash matrix plus
    # every mutant's schedule (about 50 runs; some 20 s on a 2-core machine).
    code = main(["selftest", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["valid"] is True and report["reference"]["valid"] is True
    assert report["score"] == {"caught": len(MUTANTS), "mutants": len(MUTANTS)}
    assert all(m["caught"] and m["faults"] <= 2 and m["reproduce"].startswith("killpoint replay ")
               for m in report["mutants"])


def test_selftest_json_has_the_crash_points_of_each_mutant_of_the_reference_and_of_the_whole(capsys):
    """Protects the documented promise that --stats output is always in the JSON, as "points" of each
    result and of the whole: selftest --json had no "points" at all (with or without --stats)."""
    code = main(["selftest", "--quick", "--mutants", "no-cas,no-fence-check", "--json", "-q"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    mutants = [m["points"] for m in report["mutants"]]
    reference, whole = report["reference"]["points"], report["points"]
    assert [p["runs"] for p in mutants] == [1, 1] and reference["runs"] == 2 and whole["runs"] == 4
    assert all(p["fired_total"] >= 1 for p in mutants)  # each mutant's schedule fired
    assert whole["fired_total"] == sum(p["fired_total"] for p in mutants) + reference["fired_total"]
    assert whole["reached"]["after_call"] == (sum(p["reached"].get("after_call", 0) for p in mutants)
                                              + reference["reached"]["after_call"])


def test_selftest_fails_when_a_mutant_escapes(monkeypatch, capsys):
    # A mutant whose bug its schedule cannot show must fail the selftest, not pass it quietly.
    import dataclasses

    import killpoint.harness.mutants as zoo

    blind = dataclasses.replace(zoo.MUTANTS["no-cas"], schedule="A@charge.after_call:kill")
    monkeypatch.setattr(zoo, "MUTANTS", {"no-cas": blind})
    code = main(["selftest", "--quick"])
    out = capsys.readouterr().out
    assert code == 1
    assert "0/1 mutants caught" in out and "SELFTEST FAILED" in out


def test_selftest_names_an_unknown_mutant(capsys):
    assert main(["selftest", "--mutants", "no-such-bug"]) == 2
    err = capsys.readouterr().err
    assert "no-such-bug" in err and len(err.strip().splitlines()) == 1


def test_no_fence_check_and_no_cas_are_different_mutants_with_different_counterexamples(session):
    # They once had the same flags and the same counterexample, so the score counted one bug twice.
    # no-fence-check compares a freshly read version: the chain stays whole, only the fence sees it.
    # no-cas writes blind: the stale write steps the version chain back.
    unfenced = run_mutant(session, MUTANTS["no-fence-check"])
    blind = run_mutant(session, MUTANTS["no-cas"])
    unfenced_violated = {v.invariant for v in unfenced.verdict.violations}
    blind_violated = {v.invariant for v in blind.verdict.violations}
    assert "stale_writes_rejected" in unfenced_violated and "version_chain" not in unfenced_violated
    assert "version_chain" in blind_violated
    assert resolve("mutant:no-fence-check") is not resolve("mutant:no-cas")


def test_a_mutant_with_timings_of_its_own_runs_them_everywhere_unless_given_others(capsys):
    """Protects: renew-by-instance's timings (heartbeat 5 ms) were applied by replay, explore and
    selftest but not by the matrix or the plugin's fixture, so the matrix ran the defaults and its
    reproduce lines replayed another run; and replay let them override a --timing the user gave."""
    assert RunConfig(target="mutant:renew-by-instance").timing.heartbeat_ms == 5
    assert RunConfig(target="mutant:renew-by-instance", virtual_time=False).timing.heartbeat_ms == 5
    assert RunConfig(target="mutant:no-cas").timing == RunConfig().timing
    code = main(["matrix", "--target", "mutant:renew-by-instance", "--steps", "charge", "--points", "heartbeat",
                 "--json", "--quiet"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and "heartbeat-ms=5" in report["violations"][0]["reproduce"]
    code = main(["replay", "A@charge.heartbeat:hang", "--target", "mutant:renew-by-instance", "--timing",
                 "heartbeat-ms=7", "--json"])
    line = json.loads(capsys.readouterr().out)["reproduce"]
    assert "heartbeat-ms=7" in line and "lease-ttl-ms" not in line, line
