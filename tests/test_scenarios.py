"""The scenarios: each story happens on the reference worker, breaks on the mutant that breaks its
rule, tells the same verdict every time, and the command line keeps its contract."""

from __future__ import annotations

import dataclasses
import json

import pytest

from killpoint import chaos
from killpoint.harness import checkpoint
from killpoint.harness.checkpoint import Migration, Migrations, Policy
from killpoint.harness.cli import main
from killpoint.harness.run import RunConfig, Session
from killpoint.harness.worker import ReferenceWorker
from killpoint.scenarios import SCENARIOS, checkpoint_version
from killpoint.scenarios._story import Story


@pytest.fixture(scope="module")
def session():
    with Session() as s:
        yield s


def violated(story: Story) -> set[str]:
    return {v.invariant for r in story.results for v in r.verdict.violations}


def missing(story: Story) -> list[str]:
    return [c.expected for c in story.checks if not c.held]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_story_happens_on_the_reference_worker(session, name):
    story = SCENARIOS[name].run(session)
    assert missing(story) == []
    assert [r.valid for r in story.results] == [True] * len(story.results)
    assert story.verdict is True and story.checks


def test_a_downstream_restart_is_written_down_without_the_sessions_secret(session):
    """The session's secret (the first path segment of the downstream's URL) keeps other local
    processes off the downstream; a restart's harness event, the narration and the history must
    name its address only, never the secret, since histories end up in reports and CI logs."""
    story = SCENARIOS["recovery_under_restart"].run(session)
    secret = session.downstream.url.rsplit("/", 1)[1]
    restarts = [e for r in story.results for e in r.history.harness_events("downstream_restart")]
    assert restarts and all(e.get("address") == session.downstream.address for e in restarts)
    dumped = json.dumps([e.to_json() for r in story.results for e in r.history.events], default=str)
    assert secret not in dumped and secret not in "\n".join(story.lines)
    assert session.downstream.address in "\n".join(story.lines)


@pytest.mark.parametrize("name", [n for n, s in SCENARIOS.items() if s.mutant])
def test_the_mutant_that_breaks_a_storys_rule_is_caught_by_its_invariant(session, name):
    scenario = SCENARIOS[name]
    story = scenario.run(session, target=f"mutant:{scenario.mutant}")
    assert story.verdict is False
    assert scenario.caught_by in violated(story)


def test_checkpoint_version_fails_a_worker_that_runs_checkpoints_unverified(session):
    # A worker that skips verification (defined here, like the zoo's trust-checkpoint) fails both
    # the story's checks and the invariant that watches checkpoints.
    class Trusting(ReferenceWorker):
        def load_instance(self, instance_id):
            return checkpoint.Loaded(instance_id, checkpoint.OK)

    def trusting(ctx):
        Trusting(ctx).run()

    story = SCENARIOS["checkpoint_version"].run(session, target=trusting)
    assert story.verdict is False
    assert "order-3's checkpoint refused: its integrity hash does not match" in missing(story)
    assert "the downstream never heard of order-4" in missing(story)
    assert "checkpoints_honoured" in violated(story)


@pytest.mark.parametrize("name", ["lease_takeover", "unsafe_activity", "recovery_under_restart"])
def test_a_story_gives_the_same_verdict_ten_times(session, name):
    outcomes = {(s.verdict, tuple(sorted(violated(s))), tuple(missing(s)))
                for s in (SCENARIOS[name].run(session) for _ in range(10))}
    assert outcomes == {(True, (), ())}


def test_lease_takeover_shows_both_refusals_and_one_effect(capsys):
    assert main(["scenario", "lease_takeover"]) == 0
    out = capsys.readouterr().out
    assert "store: REFUSED A's commit with fence 1" in out
    assert "store: accepted B's commit with fence 2" in out
    assert "downstream: A -> payment key order-1:charge:payment-v1 fence 1: 409 stale_fence" in out
    assert "downstream: B -> payment key order-1:charge:payment-v1 fence 2: 200 replay" in out
    assert "applied effects for K: 1" in out
    assert "-> 422 intent_conflict" in out  # question 3, asked for real
    assert "with no migration registered: refused" in out  # question 4
    # step 5: A back in the takeover window, after B's claim and before its commit: the provider
    # replays A's late call (it has not seen fence 2), and the store's fence alone refuses A
    assert "held B" in out and "B reached after_claim of order-1/charge, the moment its pause waited for" in out
    assert "downstream: A -> payment key order-1:charge:payment-v1 fence 1: 200 replay" in out
    assert "ok   [run 2] A came back once B had claimed the step (fence 2), before B's commit" in out


def test_scenario_json_has_the_design_shape_and_the_storys_checks(capsys):
    assert main(["scenario", "dangerous_window", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"valid", "runs", "violations", "invariants", "report"} <= set(out)
    assert out["valid"] is True and out["runs"] == 1 and out["violations"] == []
    assert out["invariants"]["no_duplicate_effects"] == {"checked": 1, "violated": 0, "not_applicable": 0}
    assert out["scenario"] == "dangerous_window" and out["story_held"] is True and out["target"] == "reference"
    assert out["checks"] and all(c["held"] for c in out["checks"])


def test_a_mutant_exits_1_naming_the_invariant_and_how_to_reproduce(capsys):
    assert main(["scenario", "dangerous_window", "--target", "mutant:random-request-id", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] is False and out["story_held"] is False
    assert {v["invariant"] for v in out["violations"]} == {"no_duplicate_effects"}
    assert out["violations"][0]["reproduce"] == \
        "killpoint scenario dangerous_window --target mutant:random-request-id"
    # what ran, beside the mutant the story is known to catch (before, only the latter was there)
    assert out["target"] == "mutant:random-request-id" and out["mutant"] == "random-request-id"


def test_a_bad_name_exits_2_listing_the_valid_ones(capsys):
    assert main(["scenario", "lease-takover"]) == 2
    err = capsys.readouterr().err
    assert "unknown scenario 'lease-takover'" in err and all(name in err for name in SCENARIOS)
    assert len(err.strip().splitlines()) == 1


def test_list_names_every_scenario_with_its_mutant(capsys):
    assert main(["scenario", "--list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in listed] == list(SCENARIOS)
    assert {s["name"]: s["caught_by"] for s in listed}["lease_takeover"] == "stale_writes_rejected"


def test_a_restart_hook_must_name_a_fault_of_the_schedule(session):
    config = RunConfig(schedule=chaos.parse("A@charge.after_claim:1*pause"),
                       restarts={"B@charge.after_claim:1*pause": ("downstream",)})
    with pytest.raises(ValueError, match="name a fault of the schedule"):
        session.run(config)


# -- the checkpoint judgement the workers run (pure, no processes) --------------------------------

V1, V2 = checkpoint_version.definitions(0, 2)
MIGRATIONS = checkpoint_version.migrations(0)
KEY = b"k" * 32


def test_an_intact_checkpoint_of_this_definition_is_read_as_is():
    loaded = checkpoint.verify(checkpoint.checkpoint_row(V2), V2)
    assert loaded.outcome == checkpoint.OK and loaded.data == V2.data


def test_an_old_definition_is_migrated_when_registered_and_refused_otherwise():
    row = checkpoint.checkpoint_row(V1)
    migrated = checkpoint.verify(row, V2, Policy(migrations=MIGRATIONS))
    assert migrated.outcome == checkpoint.MIGRATED and migrated.data == V2.data
    refused = checkpoint.verify(row, V2, Policy(migrations=Migrations()))
    assert refused.outcome == checkpoint.REFUSED and "no migration is registered" in refused.reason


def test_a_migration_stays_within_one_definition():
    with pytest.raises(ValueError, match="within one definition"):
        Migration.between(V1, dataclasses.replace(V2, definition="invoice"), dict)


def test_a_corrupt_checkpoint_is_refused_by_its_hash():
    row = checkpoint_version.corrupt(checkpoint.checkpoint_row(V2))
    loaded = checkpoint.verify(row, V2)
    assert loaded.outcome == checkpoint.REFUSED and "integrity hash mismatch" in loaded.reason


def test_a_forged_checkpoint_passes_a_plain_hash_but_not_an_hmac():
    forged = checkpoint_version.forge(V2)
    assert checkpoint.verify(forged, V2).ok  # a hash is not authentication
    assert not checkpoint.verify(forged, V2, Policy(hmac_key=KEY)).ok
    signed = checkpoint.checkpoint_row(V2, hmac_key=KEY)
    assert checkpoint.verify(signed, V2, Policy(hmac_key=KEY)).ok
    assert not checkpoint.verify(signed, V2, Policy(hmac_key=b"x" * 32)).ok
    assert not checkpoint.verify(signed, V2).ok  # a MAC this deployment cannot check


def test_an_unknown_format_version_is_refused():
    row = {**checkpoint.checkpoint_row(V2), "format_version": 99}
    assert "format version 99" in checkpoint.verify(row, V2).reason
