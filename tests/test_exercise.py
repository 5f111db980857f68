"""Exercise accounting: what a run's faults provoked, on small hand-written histories (no processes),
then on real runs: a pause nobody took over is reported as not exercised (never valid), and the
closing line, the JSON and JUnit carry the counts; ``killpoint.sometimes`` reached and not reached.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from hang import HANG_S

from killpoint import vocab as v
from killpoint.chaos.schedule import parse
from killpoint.harness.exercise import NOT_EXERCISED, Exercise, Tally, exercised, matrix_reasons, total
from killpoint.harness.history import History, build

MS = 1_000_000


def ev(t: float, process: str, kind: str, type: str = v.EVENT, **data: Any):
    return (int(t * MS), process, kind, type, data)


def spawn(t: float, label: str, identity: str | None = None):
    return ev(t, v.HARNESS, v.SPAWN, worker=label, identity=identity or label, pid=1)


def claim_ok(t: float, process: str, inst: str = "o", step: str = "s", fence: int = 1):
    return ev(t, process, v.CLAIM, v.OK, op=1, instance=inst, step=step, fence=fence)


def claimed(t: float, worker: str, inst: str = "o", step: str = "s", fence: int = 1):
    return ev(t, v.STORE, v.CLAIMED, instance=inst, step=step, worker=worker, fence=fence,
              lease_version=fence, from_state="pending", to_state="running")


def fired(t: float, process: str, point: str, action: str, fault: int = 0, inst: str | None = "o",
          step: str | None = "s"):
    return ev(t, process, v.POINT, point=point, instance=inst, step=step, hit=1, action=action, fault=fault)


def stop(t: float, worker: str):
    return ev(t, v.HARNESS, v.STOP, worker=worker, pid=1, signal="SIGSTOP", reason="pause")


def cont(t: float, worker: str, signal: str | None = "SIGCONT"):
    return ev(t, v.HARNESS, v.CONT, worker=worker, pid=1, signal=signal, reason="its step moved on")


def pause_history(*, taken_over: bool, late: str | None = "commit_rejected") -> History:
    """A claims o/s and is frozen at before_commit; B claims it (or not) while A is stopped; A is
    resumed and its late commit is refused (or accepted)."""
    raw = [spawn(0, "A"), spawn(0.5, "B"), claimed(1, "A"), claim_ok(1, "A"),
           fired(2, "A", "before_commit", "pause"), stop(3, "A")]
    if taken_over:
        raw += [claimed(5, "B", fence=2), claim_ok(5, "B", fence=2)]
    raw += [cont(8, "A")]
    if late is not None:
        raw += [ev(9, v.STORE, late, instance="o", step="s", worker="A", fence=1, lease_version=2)]
    return build(raw)


SCHEDULE = parse("A@s.before_commit:1*pause")


def test_a_pause_whose_step_another_worker_claimed_is_exercised_with_its_late_write():
    (p,) = exercised(pause_history(taken_over=True), SCHEDULE.faults).faults
    assert (p.fault, p.action, p.worker, p.takeover_by, p.takeover_evidence) == \
        ("A@s.before_commit:1*pause", "pause", "A", "B", "claim")
    assert p.exercised and p.reason() is None
    assert p.late_write == "refused"


def test_a_stale_commit_accepted_is_counted_as_accepted():
    (p,) = exercised(pause_history(taken_over=True, late=v.COMMITTED), SCHEDULE.faults).faults
    assert p.late_write == "accepted"
    tally = exercised(pause_history(taken_over=True, late=v.COMMITTED), SCHEDULE.faults).tally()
    assert tally.late_writes_accepted == 1


def test_a_pause_nobody_took_over_is_not_exercised_and_says_so():
    e = exercised(pause_history(taken_over=False, late=None), SCHEDULE.faults)
    (p,) = e.faults
    assert not p.exercised and p.takeover_by is None and p.late_write is None
    (reason,) = e.reasons()
    assert NOT_EXERCISED in reason and "A@s.before_commit:1*pause" in reason and "s of o" in reason
    t = e.tally()
    assert (t.pauses, t.pauses_exercised) == (1, 0)
    assert t.brief() == "0 of 1 pause exercised a takeover"


def test_a_claim_after_the_resume_is_no_takeover():
    """Only a claim while the worker was stopped counts: one after its resume met no stale worker."""
    h = build([spawn(0, "A"), spawn(0.5, "B"), claimed(1, "A"), fired(2, "A", "after_claim", "pause"),
               stop(3, "A"), cont(4, "A"), claimed(6, "B", fence=2), claim_ok(6, "B", fence=2)])
    (p,) = exercised(h, parse("A@s.after_claim:1*pause").faults).faults
    assert not p.exercised


def test_a_replacement_under_the_same_identity_is_another_worker():
    """The harness may start a replacement under the frozen worker's own identity (A.2): its claim,
    seen in its journal, is a takeover although the store names worker A."""
    h = build([spawn(0, "A"), claimed(1, "A"), fired(2, "A", "after_claim", "pause"), stop(3, "A"),
               spawn(4, "A.2", "A"), claimed(5, "A", fence=2), claim_ok(5, "A.2", fence=2), cont(7, "A")])
    (p,) = exercised(h, parse("A@s.after_claim:1*pause").faults).faults
    assert p.takeover_by == "A.2" and p.exercised


def test_a_pause_released_at_once_for_a_restart_is_not_asked_for_a_takeover():
    h = build([spawn(0, "A"), claimed(1, "A"), fired(2, "A", "after_claim", "pause"), cont(2.5, "A", signal=None)])
    (p,) = exercised(h, parse("A@s.after_claim:1*pause").faults).faults
    assert p.exempt and p.exercised and not p.needs_takeover
    assert exercised(h, parse("A@s.after_claim:1*pause").faults).tally().pauses == 0


def test_a_hang_taken_over_while_the_worker_hangs_is_exercised():
    h = build([spawn(0, "A"), spawn(0.5, "B"), claimed(1, "A"), fired(2, "A", "heartbeat", "hang"),
               ev(4, v.STORE, v.STUCK_FLAGGED, instance="o", step="s", worker="A"), claimed(5, "B", fence=2),
               ev(9, v.HARNESS, v.KILL, worker="A", pid=1, signal="SIGKILL", reason="quiescent")])
    t = exercised(h, parse("A@s.heartbeat:1*hang").faults).tally()
    assert (t.hangs, t.hangs_exercised) == (1, 1)


def test_a_step_less_pause_is_judged_on_the_steps_its_worker_held():
    """A point with no step (a queue worker's before_ack outside ctx.at): the steps whose last claim
    was the frozen worker's are the ones another worker must take."""
    h = build([spawn(0, "A"), spawn(0.5, "B"), claimed(1, "A", inst="j1", step="job"),
               claimed(1.5, "B", inst="j2", step="job"), fired(2, "A", "before_ack", "pause", inst=None, step=None),
               stop(3, "A"), claimed(4, "B", inst="j3", step="job"), cont(5, "A")])
    (p,) = exercised(h, parse("A@before_ack:1*pause", points=frozenset({"before_ack"})).faults).faults
    assert not p.exercised  # B took another job, never A's
    h2 = build([spawn(0, "A"), spawn(0.5, "B"), claimed(1, "A", inst="j1", step="job"),
                fired(2, "A", "before_ack", "pause", inst=None, step=None), stop(3, "A"),
                claimed(4, "B", inst="j1", step="job", fence=2), cont(5, "A")])
    (p2,) = exercised(h2, parse("A@before_ack:1*pause", points=frozenset({"before_ack"})).faults).faults
    assert p2.takeover_by == "B"


def test_without_claims_in_the_history_another_workers_call_for_the_step_is_the_takeover():
    """A target that owns its state and gives no history(): its downstream calls still show who worked."""
    call = ev(5, v.DOWNSTREAM, v.REQUEST, resource="payment", key="o:s", outcome=v.APPLIED, applied=True,
              meta={"instance": "o", "step": "s", "worker": "B"})
    h = build([spawn(0, "A"), spawn(0.5, "B"), fired(2, "A", "after_claim", "pause"), stop(3, "A"), call, cont(7, "A")])
    (p,) = exercised(h, parse("A@s.after_claim:1*pause").faults).faults
    assert (p.takeover_by, p.takeover_evidence) == ("B", "call")


def test_a_kill_recovered_by_another_worker_and_an_indeterminate_call_retried():
    h = build([spawn(0, "A"), claimed(1, "A"), claim_ok(1, "A"),
               ev(2, "A", v.CALL, v.INVOKE, op=2, instance="o", step="s", key="o:s", direction="forward"),
               fired(3, "A", "in_call", "kill"),
               ev(4, "A", v.CALL, v.INFO, op=2, instance="o", step="s", key="o:s", indeterminate=True),
               spawn(5, "C"), claimed(6, "C", fence=2), claim_ok(6, "C", fence=2),
               ev(7, "C", v.RECOVER, instance="o", step="s", action="retry_same_activity"),
               ev(8, v.DOWNSTREAM, v.REQUEST, key="o:s", outcome=v.REPLAY, applied=False,
                  meta={"instance": "o", "step": "s", "worker": "C", "direction": "forward"})])
    e = exercised(h, parse("A@s.in_call:kill").faults)
    (p,) = e.faults
    assert p.recovered_by == "C" and p.exercised
    t = e.tally()
    assert (t.kills, t.kills_recovered, t.indeterminate_calls, t.retries_after_indeterminate,
            t.decided_after_indeterminate) == (1, 1, 1, 1, 1)


def test_sometimes_events_and_declared_names_give_expected_and_reached():
    h = build([ev(1, "A", v.SOMETIMES, name="refund retried", reached=False),
               ev(2, "B", v.SOMETIMES, name="refund retried", reached=True),
               ev(3, "B", v.SOMETIMES, name="lease lost", reached=False)])
    e = exercised(h, (), declared=("card declined",))
    assert e.expected == {"refund retried", "lease lost", "card declined"}
    assert e.reached == {"refund retried"}
    reasons = matrix_reasons(total([e, exercised(build([]), ())]))
    assert len(reasons) == 2 and "'card declined' was never reached in 2 runs" in reasons[0]


def test_tallies_add_up_and_a_matrix_without_one_exercised_pause_is_unknown():
    ok = exercised(pause_history(taken_over=True), SCHEDULE.faults)
    idle = exercised(pause_history(taken_over=False, late=None), SCHEDULE.faults)
    both = total([ok, idle, None])
    assert (both.runs, both.pauses, both.pauses_exercised) == (3, 2, 1)
    assert matrix_reasons(both) == ()
    (reason,) = matrix_reasons(total([idle, idle]))
    assert "none of the 2 pauses exercised a takeover" in reason
    assert json.loads(json.dumps(both.to_json()))["pauses_exercised"] == 1
    assert Tally() + Tally() == Tally()


def test_a_fault_that_never_fired_provokes_nothing_and_is_not_counted():
    h = build([spawn(0, "A"), claimed(1, "A")])
    assert exercised(h, SCHEDULE.faults) == Exercise()


# -- real runs -------------------------------------------------------------------------------------
IDLE_TARGET = textwrap.dedent('''
    """A target whose other workers never take a frozen worker's step: the first A owns instance i1
    and every other worker i2, so A frozen at its step is never taken over."""
    import killpoint
    from killpoint import InstanceSpec, StepSpec, Workload


    def two(seed=0):
        return Workload("two", tuple(InstanceSpec(f"i{n}", (StepSpec("work", resource="payment",
                        params={"n": n}),)) for n in (1, 2)), {"payment": {"legacy": False}})


    @killpoint.target(points=("before_call", "after_call"), owns_state=True, workload="idle_target:two",
                      sometimes=("i1 retried",))
    def worker(ctx):
        mine = "i1" if ctx.worker_id == "A" and ctx.replaces is None else "i2"
        with ctx.at(mine, "work"):
            ctx.point("before_call")
            answer = ctx.downstream.call("payment", key=f"{mine}:work", params={"n": int(mine[1])},
                                         meta={"instance": mine, "step": "work", "worker": ctx.worker_id})
            killpoint.sometimes("replay seen", answer.replay)
            killpoint.sometimes("i1 retried", answer.replay and mine == "i1")
            ctx.point("after_call")
''')


@pytest.fixture()
def idle_target(tmp_path, monkeypatch):
    (tmp_path / "idle_target.py").write_text(IDLE_TARGET)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


def killpoint_cli(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "killpoint.harness.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=HANG_S)


def test_a_real_pause_that_provoked_no_takeover_is_not_exercised_and_the_run_unknown(idle_target):
    """Nobody else ever takes A's instance: the pause tested nothing, so the run is unknown (exit 3)
    naming it, and the JSON and the closing line say 0 of 1 pause exercised a takeover."""
    done = killpoint_cli("replay", "A@work.after_call:1*pause", "--target", "idle_target:worker", "--json",
                         cwd=idle_target)
    assert done.returncode == 3, done.stdout + done.stderr
    out = json.loads(done.stdout)
    assert out["valid"] is None
    assert any(NOT_EXERCISED in r and "A@work.after_call:1*pause" in r for r in out["unknown_reasons"])
    assert (out["exercise"]["pauses"], out["exercise"]["pauses_exercised"]) == (1, 0)
    (fault,) = out["results"][0]["exercise"]["faults"]
    assert fault["exercised"] is False and fault["takeover_by"] is None
    text = killpoint_cli("replay", "A@work.after_call:1*pause", "--target", "idle_target:worker",
                         cwd=idle_target)
    assert text.returncode == 3
    (verdict,) = [line for line in text.stdout.splitlines() if line.startswith("verdict:")]
    assert "0 of 1 pause exercised a takeover" in verdict


def test_a_matrix_names_the_expectation_no_run_reached(idle_target, tmp_path):
    """``killpoint.sometimes``: 'replay seen' is reached (a replacement calls i2 again), 'i1 retried'
    never is (declared, and evaluated false): the matrix is unknown naming it, and its JUnit says so."""
    junit = tmp_path / "junit.xml"
    done = killpoint_cli("matrix", "--target", "idle_target:worker", "--json", "--jobs", "1",
                         "--junit-xml", str(junit), cwd=idle_target)
    assert done.returncode == 3, done.stdout + done.stderr
    out = json.loads(done.stdout)
    sometimes = out["exercise"]["sometimes"]
    assert sometimes["reached"] == ["replay seen"] and sometimes["not_reached"] == ["i1 retried"]
    assert any("'i1 retried' was never reached" in r for r in out["unknown_reasons"])
    assert "i1 retried" in junit.read_text()


def test_a_reference_pause_is_taken_over_and_its_late_commit_refused():
    """The reference worker frozen before its commit: B takes the step over, A's late commit is
    refused; the run is valid and its result says what was exercised."""
    from killpoint import RunConfig, Session, parse_schedule

    with Session() as session:
        result = session.run(RunConfig(schedule=parse_schedule("A@charge.before_commit:1*pause")))
    assert result.valid is True, result.verdict.unknown_reasons
    assert result.exercise is not None
    (p,) = result.exercise.faults
    assert p.takeover_by is not None and p.takeover_by != "A" and p.late_write == "refused"
    assert result.exercise.tally().brief() == "1 of 1 pause exercised a takeover"
    from killpoint.reports.index import build_index
    from killpoint.reports.model import build_run

    (line,) = build_run(result).banner.provoked
    assert line.startswith("A@charge.before_commit:1*pause: taken over by ") and "its late commit refused" in line
    index = build_index([result], ["run-0001.html"], title="t")
    assert index.exercise.startswith("1 of 1 pause exercised a takeover") and index.whole_reasons == ()
    assert index.verdict == "valid"


def test_a_pause_resumed_at_its_leases_lapse_counts_the_claim_right_after_it():
    """A pause whose moment is the lease's lapse comes back with the other worker held just before
    its claim: that claim, right after the resume, is the takeover."""
    h = build([spawn(0, "A"), spawn(0.5, "B"), claimed(1, "A"), fired(2, "A", "after_claim", "pause"),
               stop(3, "A"), ev(6, v.HARNESS, v.CONT, worker="A", pid=1, signal="SIGCONT", why=v.RESUMED_LAPSED,
                                by="B"),
               claimed(7, "B", fence=2), claim_ok(7, "B", fence=2)])
    (p,) = exercised(h, parse("A@s.after_claim:1*pause").faults).faults
    assert p.takeover_by == "B" and p.exercised
