"""Resume moments: where a paused worker comes back is part of the schedule (``pause(until=...)``).

The grammar (round trip, bad values named), each moment firing in a real run at the moment asked
(the history's ``held`` and ``cont`` events, in order with the store's), the state-guarded commit
that only the takeover window shows, a pause whose other workers are blocked on the frozen one
ending as a named resume instead of at the run's bound, and a target whose workers give up on a
held lease meeting a real takeover.
"""

from __future__ import annotations

import fcntl
import os

import pytest

from killpoint import chaos, vocab
from killpoint.chaos.actions import parse as parse_actions
from killpoint.chaos.generator import PAUSES, matrix
from killpoint.chaos.points import DEFAULT_POINTS
from killpoint.errors import InvalidAction, InvalidSchedule
from killpoint.harness import events
from killpoint.harness.run import RunConfig, Session
from killpoint.harness.worker import ReferenceWorker
from killpoint.harness.workload import WORKLOADS


@pytest.fixture(scope="module")
def session():
    with Session() as s:
        yield s


def run(session, schedule, **kw):
    return session.run(RunConfig(schedule=chaos.parse(schedule), **kw))


def harness(result, kind, worker=None):
    return [e for e in result.history.events if e.process == vocab.HARNESS and e.kind == kind
            and (worker is None or e.get("worker") == worker)]


def store_events(result, kind, instance="order-1", step="charge"):
    return [e for e in result.history.events if e.process == vocab.STORE and e.kind == kind
            and e.get("instance") == instance and e.get("step") == step]


# -- the grammar --------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "A@charge.after_call:1*pause(until=after_claim)",
    "A@charge.after_call:pause(until=lapse)",
    "A@after_claim:1*off->1*pause(until=before_commit)->kill",
    "A@charge.before_commit#2:50%1*pause(until=after_commit),B@charge.after_call:kill",
])
def test_a_resume_moment_round_trips_through_the_text_form(text):
    parsed = chaos.parse(text)
    assert str(parsed) == text
    assert chaos.parse(str(parsed)) == parsed


def test_a_pause_without_a_moment_reads_as_before_and_names_none():
    term = parse_actions("1*pause").terms[0]
    assert term.until is None and str(term) == "1*pause"
    assert chaos.parse("A@charge.after_call:1*pause").moments == frozenset()
    assert chaos.parse("A@after_call:pause(until=lapse),B@before_call:pause(until=after_claim)").moments \
        == frozenset({"lapse", "after_claim"})


@pytest.mark.parametrize("text, named", [
    ("A@charge.after_call:pause(until=nowhere)", "'nowhere'"),
    ("A@charge.after_call:pause(till=after_claim)", "'pause(till=after_claim)'"),
    ("A@charge.after_call:pause(until=)", "'pause(until=)'"),
    ("A@charge.after_call:kill(until=after_claim)", "'kill(until=after_claim)'"),
    ("A@charge.after_call:sleep(until=after_claim)", "'sleep(until=after_claim)'"),
])
def test_a_bad_resume_moment_is_one_line_naming_it(text, named):
    with pytest.raises((InvalidSchedule, InvalidAction)) as info:
        chaos.parse(text)
    message = str(info.value)
    assert named in message and "\n" not in message


def test_a_target_s_own_point_is_a_moment_only_where_it_is_declared():
    own = frozenset({"before_ack", "after_ack"})
    assert chaos.parse("A@before_ack:pause(until=after_ack)", points=own).moments == {"after_ack"}
    with pytest.raises(InvalidSchedule, match="'after_claim'"):
        chaos.parse("A@before_ack:pause(until=after_claim)", points=own)


def test_the_default_matrix_pauses_in_the_takeover_window_and_after_the_commit_where_a_lease_is_held():
    steps = WORKLOADS["orders"]().step_names
    pauses = [str(p.schedule) for p in matrix(steps, DEFAULT_POINTS, actions=("kill", "pause"))
              if "pause" in str(p.schedule)]
    for point in ("after_claim", "before_call", "in_call", "after_call", "before_receipt", "after_receipt",
                  "before_commit"):
        for pause in PAUSES:
            assert f"A@charge.{point}:{pause}" in pauses
    assert "A@charge.after_commit:1*pause" not in pauses  # no lease held there
    assert "1*pause(until=after_claim)" in PAUSES and "1*pause" in PAUSES
    # a target without after_claim gets the plain pause only (the moment could never come)
    own = matrix(["charge"], ("before_call", "after_call"), actions=("pause",), order=("before_call", "after_call"))
    assert [str(p.schedule) for p in own] == ["A@charge.before_call:1*pause", "A@charge.after_call:1*pause"]


# -- each moment in a real run -----------------------------------------------------------------------

@pytest.mark.parametrize("moment", ["after_claim", "before_call", "before_commit", "after_commit"])
def test_each_point_moment_resumes_the_frozen_worker_when_the_new_holder_reaches_it(session, moment):
    # A frozen right after its claim: B takes the step over on the full path (no receipt yet), so
    # it passes every point. A comes back exactly when B reaches the moment, with B held there.
    result = run(session, f"A@charge.after_claim:1*pause(until={moment})")
    assert result.valid is True and not result.unfired
    held = harness(result, vocab.HELD)
    assert [(e.get("worker"), e.get("point"), e.get("instance"), e.get("step"), e.get("frozen"))
            for e in held] == [("B", moment, "order-1", "charge", "A")]
    [cont] = [e for e in harness(result, vocab.CONT, "A")]
    assert cont.get("why") == vocab.RESUMED_AT and cont.get("moment") == moment and cont.get("by") == "B"
    assert held[0].index < cont.index
    [b_claim] = [e for e in store_events(result, vocab.CLAIMED) if e.get("worker") == "B"]
    assert b_claim.index < cont.index  # after the new holder's claim
    b_commit = [e for e in store_events(result, vocab.COMMITTED) if e.get("worker") == "B"]
    if moment == "after_commit":
        assert b_commit and b_commit[0].index < cont.index
    else:  # before the new holder's commit: the takeover window
        assert b_commit and b_commit[0].index > cont.index
    # A went on while B held the lease (its late call or commit), and none of it was accepted
    assert [e for e in result.history.events if e.process == "A" and e.index > cont.index]
    assert not [e for e in store_events(result, vocab.COMMITTED) if e.get("worker") == "A"]
    # B is let go once A's late attempt is over, said so
    [release] = [e for e in harness(result, vocab.CONT, "B") if e.get("signal") is None]
    assert release.get("why") == vocab.RELEASED_AFTER and release.get("frozen") == "A"
    assert release.index > cont.index


def test_the_lapse_moment_resumes_the_frozen_worker_before_anybody_claims_its_step(session):
    result = run(session, "A@charge.after_call:1*pause(until=lapse)")
    assert result.valid is True and not result.unfired
    [cont] = harness(result, vocab.CONT, "A")
    assert cont.get("why") == vocab.RESUMED_LAPSED and cont.get("moment") == "lapse"
    typed = events.parse(cont)  # the typed history reads the moment by attribute
    assert isinstance(typed, events.Resume) and (typed.why, typed.moment, typed.by) == ("lapsed", "lapse", "B")
    [held] = harness(result, vocab.HELD)
    assert held.get("point") == "before_claim" and held.get("frozen") == "A"
    # nobody took the step: A's own commit, under its own fence, is the one accepted
    claims = store_events(result, vocab.CLAIMED)
    assert [e.get("worker") for e in claims] == ["A"]
    [commit] = store_events(result, vocab.COMMITTED)
    assert commit.get("worker") == "A" and commit.get("fence") == 1 and commit.index > cont.index


def test_the_narration_says_the_moment_and_why(session):
    from killpoint.harness.narrate import describe

    result = run(session, "A@charge.after_call:1*pause(until=after_claim)")
    lines = [describe(e) for e in result.history.events if e.process == vocab.HARNESS]
    assert any("until another worker reaches after_claim" in line for line in lines)
    assert any(line.startswith("held B") and "after_claim of order-1/charge" in line for line in lines)
    assert any("B reached after_claim of order-1/charge, the moment its pause waited for" in line
               for line in lines)


# -- the takeover window's bug ----------------------------------------------------------------------

def test_a_state_guarded_commit_is_caught_by_the_default_matrix_only_in_the_takeover_window(session):
    # UPDATE ... WHERE state = 'running': the plain pauses (all the matrix had) come back after
    # the new holder committed, and the stale commit is refused by the state; the takeover-window
    # pauses land it. Only the charge step's pauses run here (the full matrix is the CLI's test).
    steps = WORKLOADS["orders"]().step_names
    pauses = [p.schedule for p in matrix(steps, DEFAULT_POINTS, actions=("pause",))
              if p.schedule.faults[0].step == "charge"]
    window = [s for s in pauses if "until=after_claim" in str(s)]
    plain = [s for s in pauses if "until" not in str(s)]
    assert window and plain
    for schedule in plain:
        result = session.run(RunConfig(schedule=schedule, target="mutant:state-guarded-commit"))
        assert result.valid is True, (str(schedule), [v.detail for v in result.verdict.violations])
    caught = []
    for schedule in window:
        result = session.run(RunConfig(schedule=schedule, target="mutant:state-guarded-commit"))
        if result.valid is False:
            caught.append({v.invariant for v in result.verdict.violations})
    assert caught and all("stale_writes_rejected" in c for c in caught)


def test_workers_that_give_up_on_a_held_lease_meet_a_replacement_after_it_lapsed(session):
    # B exits at once on A's lease; before, A was then resumed ("no other worker can move") with
    # nobody having taken its step: the pause tested nothing. Now a worker is started once the
    # lease lapsed, takes the step over, and the stale commit shows.
    result = run(session, "A@charge.after_call:1*pause", target="mutant:gives-up-on-held-lease")
    assert not result.unfired
    [b_exit] = harness(result, vocab.EXIT, "B")
    assert b_exit.get("code") == 0
    claims = [e.get("worker") for e in store_events(result, vocab.CLAIMED)]
    assert claims[0] == "A" and len(claims) == 2 and claims[1] not in ("A", "B")
    [cont] = harness(result, vocab.CONT, "A")
    assert cont.get("why") == vocab.RESUMED_MOVED
    assert "stale_writes_rejected" in {v.invariant for v in result.verdict.violations}


# -- blocked is not moving ------------------------------------------------------------------------------

class LockedWorker(ReferenceWorker):
    """The reference, with every step worked under one file lock of the run (a library lock every
    worker takes): a worker frozen inside it blocks every other one, off the run clock."""

    def execute(self, task):
        fd = os.open(os.path.join(self.ctx.run_dir, "step.lock"), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            super().execute(task)
        finally:
            os.close(fd)


def locked_worker(ctx):
    LockedWorker(ctx).run()


def test_a_pause_whose_other_workers_are_blocked_on_it_ends_as_a_named_resume_not_at_the_bound(session):
    result = run(session, "A@charge.after_claim:1*pause(until=after_claim)", target=locked_worker,
                 workload="single", bound_s=30)
    # Nobody could take the step over while A was frozen: the pause tested nothing, and says so
    # (unknown, never valid), and the run ends by a named resume, not at its bound.
    assert result.valid is None and not result.unfired and not result.verdict.violations
    assert [r for r in result.verdict.unknown_reasons if "not exercised" in r], result.verdict.unknown_reasons
    assert not harness(result, vocab.BOUND_HIT)
    [cont] = harness(result, vocab.CONT, "A")
    assert cont.get("why") == vocab.RESUMED_BLOCKED and cont.get("moment") == "after_claim"
    assert "blocked" in cont.get("reason")


# -- a target that owns its state: its own lease points and claim point -----------------------------


def test_a_target_declares_where_it_holds_a_lease_and_where_it_took_one():
    """Protects: a target that owns its state names its points as it likes (``taken``,
    ``before_ack``); the matrix paused it only at the built-in protocol's names, never in its
    takeover window. ``lease_points`` and ``claim_point`` say where; the defaults are the protocol's
    among the declared points, and a name that is not declared is one line naming it."""
    import killpoint
    from killpoint import InvalidTarget

    def body(ctx):
        return None

    own = killpoint.Target(body, points=("before_take", "taken", "before_ack"), owns_state=True,
                           lease_points=("taken", "before_ack"), claim_point="taken")
    schedules = [str(p.schedule) for p in matrix(["charge"], own.points, actions=("kill", "pause"),
                                                   order=own.points, lease=own.lease_points,
                                                   claim=own.claim_point)]
    assert schedules[3:] == ["A@charge.taken:1*pause(until=taken)", "A@charge.taken:1*pause",
                             "A@charge.before_ack:1*pause(until=taken)", "A@charge.before_ack:1*pause"]
    plain = killpoint.Target(body, points=("after_claim", "before_call", "before_ack"))
    assert (plain.lease_points, plain.claim_point) == (("after_claim", "before_call"), "after_claim")
    none = killpoint.Target(body, points=("before_take", "before_ack"), owns_state=True)
    assert (none.lease_points, none.claim_point) == ((), None)
    for bad, named in [({"lease_points": ("taken", "nope")}, "'nope'"), ({"claim_point": "nope"}, "'nope'"),
                       ({"lease_points": "taken"}, "'taken'")]:
        with pytest.raises(InvalidTarget, match=named) as caught:
            killpoint.Target(body, points=("taken",), **bad)
        assert "\n" not in str(caught.value)


def _matrix_json(target):
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "killpoint.harness.cli", "matrix", "--target", target, "--json", "-q"],
                         capture_output=True, timeout=600)
    return out.returncode, json.loads(out.stdout)


def test_a_heartbeat_that_renews_by_id_alone_in_a_target_that_owns_its_state_is_caught_in_its_window():
    """Protects: a queue with its own jobs table whose heartbeat renews a running job by id alone
    was valid on the matrix: resumed after the new holder acknowledged the job, the stale worker
    finds nothing to renew. The matrix now pauses at the target's declared lease points and resumes
    at its claim point, while the new holder holds the job: ``lease_fenced``, and only there. Its
    correct twin (renewing only its own lease and fence) is valid on the same matrix, every pause
    exercising a takeover."""
    code, out = _matrix_json("mutant:renew-by-id-owned")
    assert code == 1
    caught = {v["schedule"] for v in out["violations"]}
    assert {v["invariant"] for v in out["violations"]} == {"lease_fenced"}
    lease_points = ("taken", "before_call", "after_call", "before_ack")
    assert caught == {f"A@charge.{p}:1*pause(until=taken)" for p in lease_points}
    code, out = _matrix_json("killpoint.harness.zoo_queue:fenced_renewal")
    assert code == 0, out.get("unknown_reasons")
    assert out["runs"] == 14 and out["exercise"]["pauses"] == out["exercise"]["pauses_exercised"] == 8
    assert out["invariants"]["lease_fenced"]["checked"] == 14


import json  # noqa: E402

import killpoint  # noqa: E402
from killpoint.harness import zoo_queue  # noqa: E402
from killpoint.harness.cli import main  # noqa: E402

no_claim_point = killpoint.Target(
    lambda ctx: zoo_queue._Worker(ctx, renew_by_id=False).work(), name="test_moments:no_claim_point",
    points=zoo_queue.POINTS, owns_state=True, workload="killpoint.harness.zoo_queue:jobs", run_clock=True,
    setup=zoo_queue.setup, done=zoo_queue.done, final_states=zoo_queue.final_states, history=zoo_queue.history)


def test_a_target_that_does_not_say_where_it_holds_a_lease_is_told_what_the_matrix_cannot_pause(capsys):
    """Protects: a target with points of its own names and no lease_points or claim_point got fewer
    windows without a word. The matrix pauses at the built-in names it declares and warns, in one
    line naming the declaration, that no pause comes back in the takeover window."""
    code = main(["matrix", "--target", "test_moments:no_claim_point", "--actions", "pause", "--json", "-q"])
    captured = capsys.readouterr()
    schedules = [r["schedule"] for r in json.loads(captured.out)["results"]]
    assert code == 0 and schedules == ["A@charge.before_call:1*pause", "A@charge.after_call:1*pause"]
    lines = [line for line in captured.err.splitlines() if "takeover window" in line]
    assert len(lines) == 1 and "claim_point=" in lines[0], captured.err
