"""The fourteen invariant checkers, judged on small hand-written histories (no processes, no clock).

Each invariant gets a history where it holds, one where it is violated (naming the right step and
the proving events) and, where it matters, one with nothing to judge.
"""

from __future__ import annotations

from typing import Any

import pytest

from killpoint.harness.checkers import (ALL, Result, Verdict, Violation, check_all, checkpoints_honoured,
                              effects_accounted, intent_conflict, legal_transitions, manual_stable,
                              no_duplicate_effects, retry_budget, stale_writes_rejected,
                              stuck_detected, terminates, version_chain, lease_fenced, fence_rises,
                              receipt_first)
from killpoint.harness.checkers.base import rank
from killpoint.harness.history import History, StepConfig, build

MS = 1_000_000  # nanoseconds per millisecond
Raw = tuple[int, str, str, str, dict[str, Any]]

# ---------------------------------------------------------------------------------------------
# compact event makers (times in ms, converted to ns)


def store(t: float, kind: str, inst: str, step: str, **data: Any) -> Raw:
    return (int(t * MS), "store", kind, "event", {"instance": inst, "step": step, **data})


def created(t: float, inst: str = "order-1", step: str = "charge", sv: int = 0) -> Raw:
    return store(t, "created", inst, step, to_state="pending", state_version=sv, lease_version=0)


def claimed(t: float, inst: str, step: str, worker: str, fence: int, sv: int,
            from_state: str = "pending", to_state: str = "running") -> Raw:
    return store(t, "claimed", inst, step, worker=worker, fence=fence, lease_version=fence,
                 state_version=sv, from_state=from_state, to_state=to_state)


def committed(t: float, inst: str, step: str, worker: str, fence: int, sv: int,
              from_state: str = "running", to_state: str = "succeeded") -> Raw:
    return store(t, "committed", inst, step, worker=worker, fence=fence, state_version=sv,
                 from_state=from_state, to_state=to_state)


def rejected(t: float, inst: str, step: str, worker: str, fence: int, current: int) -> Raw:
    return store(t, "commit_rejected", inst, step, worker=worker, fence=fence,
                 lease_version=current)


def operator(t: float, inst: str, step: str, sv: int, to_state: str, actor: str | None = "ops",
             evidence: str | None = "ticket-7", from_state: str = "manual_intervention") -> Raw:
    return store(t, "operator_resolved", inst, step, from_state=from_state, to_state=to_state,
                 state_version=sv, actor=actor, evidence=evidence)


def request(t: float, inst: str = "order-1", step: str = "charge", *, key: str | None = "k1",
            intent: str = "h1", outcome: str = "applied", applied: bool | None = None,
            status: int = 200, fence: int | None = None, resource: str = "payment",
            scope: str | None = None, worker: str = "A", direction: str = "forward",
            attempt: int = 1) -> Raw:
    if applied is None:
        applied = outcome in ("applied", "dropped")
    return (int(t * MS), "downstream", "request", "event", {
        "resource": resource, "key": key, "scope": scope, "fence": fence, "intent_hash": intent,
        "outcome": outcome, "applied": applied, "status": status,
        "meta": {"instance": inst, "step": step, "worker": worker, "attempt": attempt,
                 "direction": direction}})


def call(t: float, worker: str, inst: str, step: str, attempt: int) -> Raw:
    return (int(t * MS), worker, "call", "invoke",
            {"instance": inst, "step": step, "resource": "payment", "attempt": attempt})


def point(t: float, worker: str, inst: str, step: str, action: str | None,
          name: str = "after_call") -> Raw:
    return (int(t * MS), worker, "point", "event",
            {"point": name, "instance": inst, "step": step, "hit": 1, "action": action})


def harness(t: float, kind: str, **data: Any) -> Raw:
    return (int(t * MS), "harness", kind, "event", data)


def final(*rows: tuple[str, str, str]) -> tuple[dict[str, Any], ...]:
    return tuple({"instance": i, "step": s, "state": st} for i, s, st in rows)


CHARGE = StepConfig("order-1", "charge", "payment", "k1")
NOTIFY = StepConfig("order-1", "notify", None, None)  # a pure step


def only(result: Result) -> Violation:
    assert result.valid is False and result.checked is True, result
    assert len(result.violations) == 1, result.violations
    return result.violations[0]


def holds(result: Result) -> None:
    assert (result.valid, result.checked, result.violations) == (True, True, ()), result


def unjudged(result: Result) -> None:
    assert (result.valid, result.checked, result.violations) == (True, False, ()), result


# ---------------------------------------------------------------------------------------------
# 1. no_duplicate_effects


def test_no_duplicate_effects_holds_when_retry_is_a_replay():
    h = build([request(1), request(2, outcome="replay", applied=False)])
    holds(no_duplicate_effects(h))


def test_no_duplicate_effects_flags_two_applied_effects_for_one_key():
    h = build([request(1, worker="A"), request(2, worker="B")])
    v = only(no_duplicate_effects(h))
    assert (v.instance, v.step, v.events) == ("order-1", "charge", (0, 1))
    assert "k1" in v.detail and "2 times" in v.detail


def test_no_duplicate_effects_counts_a_dropped_answer_as_an_effect():
    h = build([request(1, outcome="dropped"), request(2)])
    assert only(no_duplicate_effects(h)).events == (0, 1)


def test_no_duplicate_effects_groups_legacy_requests_by_step_and_direction():
    ok = build([request(1, key=None), request(2, key=None, direction="compensation")])
    holds(no_duplicate_effects(ok))
    bad = build([request(1, key=None), request(2, step="ship", key=None), request(3, key=None)])
    v = only(no_duplicate_effects(bad))
    assert (v.step, v.events) == ("charge", (0, 2))


def test_no_duplicate_effects_unchecked_without_applied_effects():
    unjudged(no_duplicate_effects(build([request(1, outcome="conflict", status=422)])))


# ---------------------------------------------------------------------------------------------
# 2. effects_accounted


def test_effects_accounted_holds_for_one_effect_per_succeeded_step():
    h = build([created(0), request(1), committed(2, "order-1", "charge", "A", 1, 2)],
              steps=(CHARGE, NOTIFY), final=final(("order-1", "charge", "succeeded"),
                                                  ("order-1", "notify", "succeeded")))
    holds(effects_accounted(h))


def test_effects_accounted_flags_a_succeeded_step_without_effect_as_lost():
    h = build([created(0), committed(2, "order-1", "charge", "A", 1, 2)],
              steps=(CHARGE,), final=final(("order-1", "charge", "succeeded")))
    v = only(effects_accounted(h))
    assert (v.instance, v.step, v.events) == ("order-1", "charge", (1,))
    assert "lost" in v.detail


def test_effects_accounted_flags_an_effect_on_a_failed_step():
    h = build([request(1), committed(2, "order-1", "charge", "A", 1, 2, to_state="failed")],
              steps=(CHARGE,), final=final(("order-1", "charge", "failed")))
    v = only(effects_accounted(h))
    assert (v.step, v.events) == ("charge", (0, 1))
    assert "failed" in v.detail and "nobody accounts" in v.detail


def test_effects_accounted_allows_in_flight_effects_only_when_not_quiescent():
    events = [request(1)]
    running = final(("order-1", "charge", "running"))
    holds(effects_accounted(build(events, steps=(CHARGE,), final=running, quiescent=False)))
    assert only(effects_accounted(build(events, steps=(CHARGE,), final=running))).step == "charge"


def test_effects_accounted_requires_a_compensation_effect_for_a_compensated_step():
    h = build([request(1)], steps=(CHARGE,), final=final(("order-1", "charge", "compensated")))
    assert "compensat" in only(effects_accounted(h)).detail
    ok = build([request(1), request(2, key="k1-undo", direction="compensation")],
               steps=(CHARGE,), final=final(("order-1", "charge", "compensated")))
    holds(effects_accounted(ok))


def test_effects_accounted_unchecked_when_nothing_settled_and_no_effects():
    unjudged(effects_accounted(build([created(0)], steps=(CHARGE,),
                                     final=final(("order-1", "charge", "pending")))))


# ---------------------------------------------------------------------------------------------
# 3. stale_writes_rejected


def _takeover(stale_commit: Raw) -> History:
    return build([
        created(0),
        claimed(1, "order-1", "charge", "A", 1, 1),
        claimed(5, "order-1", "charge", "B", 2, 2, from_state="running"),  # A's lease expired
        stale_commit,
        committed(9, "order-1", "charge", "B", 2, 3),
    ])


def test_stale_writes_rejected_holds_when_the_stale_commit_is_rejected():
    holds(stale_writes_rejected(_takeover(rejected(7, "order-1", "charge", "A", 1, 2))))


def test_stale_writes_rejected_flags_an_accepted_commit_with_an_old_fence():
    h = _takeover(committed(7, "order-1", "charge", "A", 1, 3))
    v = only(stale_writes_rejected(h))
    assert (v.instance, v.step) == ("order-1", "charge")
    assert v.events == (1, 2, 3)  # A's claim, B's takeover, A's accepted commit
    assert "fence 1" in v.detail and "2" in v.detail


def test_stale_writes_rejected_flags_a_downstream_that_applied_a_lower_fence():
    h = build([
        claimed(1, "order-1", "charge", "A", 1, 1),
        claimed(5, "order-1", "charge", "B", 2, 2, from_state="running"),
        request(6, worker="B", fence=2, scope="order-1:charge"),
        request(7, worker="A", key="k2", fence=1, scope="order-1:charge"),
    ])
    v = only(stale_writes_rejected(h))
    assert (v.step, v.events) == ("charge", (2, 3))


def test_stale_writes_rejected_unchecked_when_a_retaken_step_has_no_fenced_commit():
    """A library that records no fence (procrastinate's job events) retakes a step: nothing to compare."""
    unjudged(stale_writes_rejected(build([
        created(0),
        store(1, "claimed", "order-1", "charge", worker=None, state_version=2, from_state="pending",
              to_state="running"),
        store(2, "committed", "order-1", "charge", worker=None, state_version=3, from_state="running",
              to_state="retry_scheduled"),
        store(3, "claimed", "order-1", "charge", worker=None, state_version=4, from_state="retry_scheduled",
              to_state="running"),
        store(4, "committed", "order-1", "charge", worker=None, state_version=5, from_state="running",
              to_state="succeeded")])))


def test_stale_writes_rejected_unchecked_without_a_takeover():
    unjudged(stale_writes_rejected(build([
        created(0), claimed(1, "order-1", "charge", "A", 1, 1),
        committed(2, "order-1", "charge", "A", 1, 2)])))


# ---------------------------------------------------------------------------------------------
# 4. version_chain


def test_version_chain_holds_for_plus_one_steps():
    holds(version_chain(build([
        created(0), claimed(1, "order-1", "charge", "A", 1, 1),
        rejected(2, "order-1", "charge", "Z", 0, 1),  # changes nothing, not in the chain
        committed(3, "order-1", "charge", "A", 1, 2)])))


def test_version_chain_flags_a_fork():
    v = only(version_chain(build([
        created(0), claimed(1, "order-1", "charge", "A", 1, 1),
        claimed(2, "order-1", "charge", "B", 2, 2, from_state="running"),
        committed(3, "order-1", "charge", "A", 1, 2)])))
    assert (v.step, v.events) == ("charge", (2, 3))
    assert "fork" in v.detail


def test_version_chain_flags_a_gap():
    v = only(version_chain(build([
        created(0), claimed(1, "order-1", "charge", "A", 1, 1),
        committed(2, "order-1", "charge", "A", 1, 3)])))
    assert (v.step, v.events) == ("charge", (1, 2))
    assert "expected 2" in v.detail


def test_version_chain_flags_a_state_change_the_history_does_not_show():
    # A target's recover hook put a finished job back in its queue (state pending, version
    # unchanged, nothing in its audit log); the job was claimed and run again. The versions run +1
    # each, every transition is legal by itself: only the states between two events give it away.
    v = only(version_chain(build([
        created(0), claimed(1, "order-1", "charge", "A", 1, 1),
        committed(2, "order-1", "charge", "A", 1, 2),
        claimed(3, "order-1", "charge", "C", 2, 3, from_state="pending"),
        committed(4, "order-1", "charge", "C", 2, 4)])))
    assert (v.step, v.events) == ("charge", (2, 3))
    assert "left it succeeded" in v.detail


def test_version_chain_holds_for_a_compensation_and_a_retry():
    holds(version_chain(build([
        created(0), claimed(1, "order-1", "charge", "A", 1, 1),
        committed(2, "order-1", "charge", "A", 1, 2, to_state="retry_scheduled"),
        claimed(3, "order-1", "charge", "B", 2, 3, from_state="retry_scheduled"),
        committed(4, "order-1", "charge", "B", 2, 4),
        claimed(5, "order-1", "charge", "B", 3, 5, from_state="succeeded", to_state="compensating"),
        committed(6, "order-1", "charge", "B", 3, 6, from_state="compensating", to_state="compensated")])))


def test_version_chain_unchecked_with_only_created():
    unjudged(version_chain(build([created(0)])))


# ---------------------------------------------------------------------------------------------
# 5. legal_transitions


def test_legal_transitions_holds_for_the_happy_path():
    holds(legal_transitions(build([
        claimed(1, "order-1", "charge", "A", 1, 1),
        committed(2, "order-1", "charge", "A", 1, 2)])))


def test_legal_transitions_flags_rerunning_a_succeeded_step():
    v = only(legal_transitions(build([
        claimed(1, "order-1", "charge", "A", 1, 1),
        committed(2, "order-1", "charge", "A", 1, 2),
        claimed(3, "order-1", "charge", "B", 2, 3, from_state="succeeded")])))
    assert (v.step, v.events) == ("charge", (2,))
    assert "succeeded -> running" in v.detail


RESERVE = StepConfig("order-1", "reserve", "inventory", "k0")


def test_legal_transitions_flags_a_step_claimed_before_the_one_before_it_succeeded():
    """Protects: steps run in order. A worker that started an instance's next step while the one
    before was still running (its charge later declined) broke no invariant: the run came out valid."""
    v = only(legal_transitions(build([
        claimed(1, "order-1", "reserve", "A", 1, 1),
        claimed(2, "order-1", "charge", "B", 1, 1),
        committed(3, "order-1", "reserve", "A", 1, 2)], steps=(RESERVE, CHARGE))))
    assert (v.step, v.events) == ("charge", (1,)) and "before reserve" in v.detail and "in order" in v.detail
    # in order it holds, a takeover of the running step included
    holds(legal_transitions(build([
        claimed(1, "order-1", "reserve", "A", 1, 1),
        committed(2, "order-1", "reserve", "A", 1, 2),
        claimed(3, "order-1", "charge", "B", 1, 1),
        claimed(4, "order-1", "charge", "C", 2, 2, from_state="running"),
        committed(5, "order-1", "charge", "C", 2, 3)], steps=(RESERVE, CHARGE))))


def test_legal_transitions_judges_no_order_where_the_target_owns_its_state():
    """A target's own history may give one job's start as a claim of every step of its instance
    (procrastinate's: one job an order); the order is judged in killpoint's store only."""
    holds(legal_transitions(build([
        claimed(1, "order-1", "reserve", None, 1, 1),
        claimed(1, "order-1", "charge", None, 1, 1),
        committed(2, "order-1", "reserve", None, 1, 2),
        committed(2, "order-1", "charge", None, 1, 2)], steps=(RESERVE, CHARGE), owns_state=True)))


def test_legal_transitions_ignores_rejected_commits_and_judges_nothing_without_transitions():
    unjudged(legal_transitions(build([store(1, "commit_rejected", "order-1", "charge",
                                            from_state="succeeded", to_state="running")])))


# ---------------------------------------------------------------------------------------------
# 6. manual_stable


def _to_manual() -> list[Raw]:
    return [claimed(1, "order-1", "charge", "A", 1, 1),
            committed(2, "order-1", "charge", "A", 1, 2, to_state="manual_intervention")]


def test_manual_stable_holds_when_an_operator_resolves_with_evidence():
    holds(manual_stable(build([*_to_manual(), operator(3, "order-1", "charge", 3, "failed")])))


def test_manual_stable_flags_a_worker_claiming_a_manual_step():
    v = only(manual_stable(build([
        *_to_manual(),
        claimed(3, "order-1", "charge", "B", 2, 3, from_state="manual_intervention")])))
    assert (v.instance, v.step, v.events) == ("order-1", "charge", (1, 2))
    assert "claimed by B" in v.detail


def test_manual_stable_flags_an_operator_event_without_evidence():
    v = only(manual_stable(build([*_to_manual(),
                                  operator(3, "order-1", "charge", 3, "succeeded", evidence="")])))
    assert v.events == (1, 2) and "evidence" in v.detail


def test_manual_stable_unchecked_without_manual_review():
    unjudged(manual_stable(build(_to_manual()[:1])))


# ---------------------------------------------------------------------------------------------
# 7. intent_conflict


def test_intent_conflict_holds_when_another_intent_gets_422():
    holds(intent_conflict(build([
        request(1, intent="h1"), request(2, intent="h2", outcome="conflict", status=422),
        request(3, intent="h1", outcome="replay")])))


def test_intent_conflict_flags_a_replayed_success_for_another_intent():
    v = only(intent_conflict(build([
        request(1, intent="h1"), request(2, step="charge", intent="h2", outcome="replay")])))
    assert (v.instance, v.step, v.events) == ("order-1", "charge", (0, 1))
    assert "replayed success" in v.detail


def test_intent_conflict_established_by_the_first_finished_request():
    # the first request was still in flight: the one that finished first owns the key
    v = only(intent_conflict(build([
        request(1, intent="h1", outcome="in_flight", status=409),
        request(2, intent="h2"), request(3, intent="h1", outcome="replay")])))
    assert v.events == (1, 2)


def test_intent_conflict_unchecked_when_no_key_saw_two_intents():
    unjudged(intent_conflict(build([request(1), request(2, outcome="replay")])))


# ---------------------------------------------------------------------------------------------
# 8. retry_budget


def test_retry_budget_holds_within_max_attempts():
    holds(retry_budget(build([call(1, "A", "order-1", "charge", 1),
                              call(2, "B", "order-1", "charge", 2)], steps=(CHARGE,))))


def test_retry_budget_flags_an_attempt_beyond_the_step_maximum():
    cfg = StepConfig("order-1", "charge", "payment", "k1", max_attempts=2)
    v = only(retry_budget(build([call(1, "A", "order-1", "charge", 1),
                                 call(2, "B", "order-1", "charge", 3)], steps=(cfg,))))
    assert (v.step, v.events) == ("charge", (1,))
    assert "maximum of 2" in v.detail


def test_retry_budget_defaults_to_three_attempts_without_config():
    holds(retry_budget(build([call(1, "A", "order-1", "ship", 3)])))
    assert only(retry_budget(build([call(1, "A", "order-1", "ship", 4)]))).step == "ship"


def test_retry_budget_unchecked_without_retries():
    unjudged(retry_budget(build([call(1, "A", "order-1", "charge", 1)])))


# ---------------------------------------------------------------------------------------------
# 9. terminates


def test_terminates_holds_when_every_step_settled():
    holds(terminates(build([], final=final(("order-1", "charge", "succeeded"),
                                          ("order-1", "notify", "manual_intervention")))))


def test_terminates_flags_a_step_left_running():
    h = build([created(0), claimed(1, "order-1", "charge", "A", 1, 1)],
              final=final(("order-1", "charge", "running"), ("order-1", "notify", "pending"),
                          ("order-2", "charge", "succeeded")))
    r = terminates(h)
    assert r.valid is False and len(r.violations) == 2
    v = r.violations[0]
    assert (v.instance, v.step, v.events) == ("order-1", "charge", (1,))
    assert v.detail == "instance order-1 did not reach a terminal state: step charge is running"


def test_terminates_is_unknown_when_the_run_hit_its_bound():
    r = terminates(build([], final=final(("order-1", "charge", "running")), bound_hit=True,
                         quiescent=False))
    assert (r.valid, r.checked, r.detail) == (None, False, "run hit its bound")


def test_terminates_holds_despite_the_bound_when_everything_settled():
    holds(terminates(build([], final=final(("order-1", "charge", "failed")), bound_hit=True)))


def test_terminates_unchecked_when_not_quiescent_or_no_steps():
    unjudged(terminates(build([], final=final(("order-1", "charge", "running")),
                              quiescent=False)))
    unjudged(terminates(build([])))


# ---------------------------------------------------------------------------------------------
# 10. stuck_detected (bound 1000 ms + slack 500 ms by default)


def test_stuck_detected_holds_when_flagged_within_bound_and_slack():
    holds(stuck_detected(build([
        point(1000, "A", "order-1", "charge", "hang"),
        store(2400, "stuck_flagged", "order-1", "charge", lease_version=2),
        harness(3000, "kill", worker="A", pid=1, signal=9, reason="stuck")])))


def test_stuck_detected_flags_a_hang_never_flagged():
    v = only(stuck_detected(build([
        point(1, "A", "order-1", "other", None),
        point(1000, "A", "order-1", "charge", "hang"),
        store(1500, "stuck_flagged", "order-1", "ship"),  # another step
        harness(3000, "bound_hit")])))
    assert (v.instance, v.step, v.events) == ("order-1", "charge", (1,))
    assert "never flagged within 1500 ms" in v.detail


def test_stuck_detected_flags_a_late_flag():
    v = only(stuck_detected(build([
        point(1000, "A", "order-1", "charge", "hang"),
        store(2600, "stuck_flagged", "order-1", "charge")])))
    assert v.events == (0, 1) and "only after 1600 ms" in v.detail


def test_stuck_detected_cannot_judge_a_hang_when_history_ends_before_deadline():
    unjudged(stuck_detected(build([point(1000, "A", "order-1", "charge", "hang"),
                                   harness(2000, "bound_hit")])))


def test_stuck_detected_cannot_judge_a_hang_whose_worker_died():
    unjudged(stuck_detected(build([point(1000, "A", "order-1", "charge", "hang"),
                                   harness(1200, "exit", worker="A", pid=1, code=None, signal=9),
                                   harness(5000, "bound_hit")])))


# ---------------------------------------------------------------------------------------------
# 11. checkpoints_honoured (the harness's own verification of each stored checkpoint)

REFUSED = ({"instance": "order-1", "outcome": "refused",
            "reason": "integrity hash mismatch: the checkpoint is corrupt"},
           {"instance": "order-2", "outcome": "ok", "reason": ""})
MIGRATED = ({"instance": "order-1", "outcome": "migrated", "reason": "order v1 -> v2"},)


def commit_ok(t: float, worker: str, inst: str, step: str, to_state: str = "succeeded") -> Raw:
    return (int(t * MS), worker, "commit", "ok", {"instance": inst, "step": step, "to_state": to_state})


def test_checkpoints_honoured_holds_when_a_refused_checkpoints_step_went_to_manual_review():
    # The correct worker: refused, its step to manual review, the downstream never called; an
    # intact instance next to it runs as usual.
    holds(checkpoints_honoured(build([
        claimed(100, "order-1", "charge", "A", 1, 2),
        committed(110, "order-1", "charge", "A", 1, 3, to_state="manual_intervention"),
        claimed(200, "order-2", "charge", "A", 1, 2), request(210, "order-2"),
        committed(220, "order-2", "charge", "A", 1, 3)], checkpoints=REFUSED)))


def test_checkpoints_honoured_flags_a_step_run_on_a_refused_checkpoint():
    v = only(checkpoints_honoured(build([
        claimed(100, "order-1", "charge", "A", 1, 2), request(110, "order-1"),
        committed(120, "order-1", "charge", "A", 1, 3)], checkpoints=REFUSED)))
    assert (v.instance, v.step) == ("order-1", "charge")
    assert "had to be refused" in v.detail and "integrity hash mismatch" in v.detail
    assert v.events == (1, 2)  # the applied effect and the commit to succeeded


def test_checkpoints_honoured_flags_an_effect_even_without_a_commit():
    # Killed after the call: the downstream applied an effect for an instance that must not run.
    v = only(checkpoints_honoured(build([
        claimed(100, "order-1", "charge", "A", 1, 2), request(110, "order-1")], checkpoints=REFUSED)))
    assert v.step == "charge" and "1 downstream effect(s) applied" in v.detail


def test_checkpoints_honoured_has_nothing_to_judge_in_a_migrated_checkpoint():
    # A migration is the worker's business; what the store and ledger show cannot tell it apart.
    unjudged(checkpoints_honoured(build([commit_ok(120, "A", "order-1", "charge")],
                                        checkpoints=MIGRATED)))


def test_checkpoints_honoured_has_nothing_to_judge_when_every_checkpoint_was_read_as_is():
    unjudged(checkpoints_honoured(build([
        claimed(100, "order-1", "charge", "A", 1, 2), committed(120, "order-1", "charge", "A", 1, 3)],
        checkpoints=({"instance": "order-1", "outcome": "ok", "reason": ""},))))
    unjudged(checkpoints_honoured(build([])))  # a history from before the oracle existed


# ---------------------------------------------------------------------------------------------
# check_all, ALL and ranking


def test_all_lists_the_fourteen_invariants_in_design_order():
    assert list(ALL) == ["no_duplicate_effects", "effects_accounted", "stale_writes_rejected",
                         "version_chain", "legal_transitions", "manual_stable", "intent_conflict",
                         "retry_budget", "terminates", "stuck_detected", "checkpoints_honoured",
                         "lease_fenced", "fence_rises", "receipt_first"]
    assert all(ALL[name].__name__ == name for name in ALL)


def test_an_empty_history_is_judged_by_nobody_so_its_verdict_is_unknown_never_valid():
    verdict = check_all(build([]))
    assert verdict.valid is None
    assert not any(r.checked for r in verdict.results) and verdict.judged == 0
    assert len(verdict.results) == 14
    assert any("no invariant had anything to judge" in r for r in verdict.unknown_reasons)


def test_a_checker_that_raises_makes_the_verdict_unknown_never_valid():
    def broken(history: History) -> Result:
        raise KeyError("state")

    verdict = check_all(build([]), {"broken": broken, "terminates": terminates})
    assert verdict.valid is None
    r = verdict.results[0]
    assert (r.invariant, r.valid, r.checked) == ("broken", None, False)
    assert r.detail.startswith("checker raised: KeyError")
    assert verdict.unknown_reasons and verdict.unknown_reasons[0].startswith("broken:")


def test_a_violation_outranks_an_unknown():
    def broken(history: History) -> Result:
        raise RuntimeError("boom")

    h = build([request(1), request(2)])
    assert check_all(h, [broken, no_duplicate_effects]).valid is False


def test_rank_orders_false_over_none_over_true():
    assert rank([True, None, False]) is False
    assert rank([True, None]) is None
    assert rank([True, True]) is True
    assert rank([]) is True


def test_check_all_fills_the_schedule_into_every_violation():
    h = build([request(1), request(2)], schedule="A@charge.after_call:kill")
    verdict = check_all(h, schedule="B@charge.before_commit#2:pause")
    assert isinstance(verdict, Verdict) and verdict.valid is False
    assert verdict.violations
    assert {v.schedule for v in verdict.violations} == {"B@charge.before_commit#2:pause"}
    # without an explicit schedule, the history's own is used
    assert {v.schedule for v in check_all(h).violations} == {"A@charge.after_call:kill"}


@pytest.mark.parametrize("name", list(ALL))
def test_every_checker_names_itself_in_its_result(name):
    assert ALL[name](build([])).invariant == name


# ---------------------------------------------------------------------------------------------
# what the mutant zoo taught the checkers


def test_no_duplicate_effects_groups_by_the_steps_stable_key_not_the_key_a_worker_sent():
    # A worker that mints a fresh request id per retry must not make a duplicate look like a new
    # intent: the step's configured key, not the key sent, names the logical intent.
    h = build([request(1, key="req-1"), request(2, key="req-2")], steps=(CHARGE,))
    v = only(no_duplicate_effects(h))
    assert (v.instance, v.step, v.events) == ("order-1", "charge", (0, 1))
    assert "'k1'" in v.detail and "'req-1'" in v.detail and "'req-2'" in v.detail


def test_stale_writes_rejected_does_not_judge_a_lease_free_settle_by_another_worker():
    # A planning transition (cancel, auto-resolve) carries no fence: no lease guards it, so the
    # last claimer being someone else does not make it a stale write (manual_stable judges those).
    settle = store(5, "committed", "order-1", "charge", worker="B", state_version=4,
                   from_state="manual_intervention", to_state="succeeded")
    h = build([created(0), claimed(1, "order-1", "charge", "A", 1, 2),
               rejected(2, "order-1", "charge", "C", 0, 1),
               committed(3, "order-1", "charge", "A", 1, 3, to_state="manual_intervention"), settle])
    holds(stale_writes_rejected(h))


def test_stuck_detected_does_not_judge_a_hang_while_the_worker_held_no_lease():
    # Hung before its claim: its heartbeat renews nothing and blocks nobody, so nothing is stuck.
    h = build([created(0), claimed(10, "order-1", "charge", "B", 1, 2),
               committed(20, "order-1", "charge", "B", 1, 3),
               point(1000, "A", "order-1", "charge", "hang", name="before_claim"),
               harness(5000, "bound_hit")])
    unjudged(stuck_detected(h))


def test_stuck_detected_judges_a_hang_of_a_restarted_incarnation_holding_its_identitys_lease():
    h = build([created(0), harness(1, "spawn", worker="A.2", identity="A", pid=2),
               harness(2, "spawn", worker="B", identity="B", pid=3),  # someone free to flag it
               claimed(10, "order-1", "charge", "A", 1, 2),
               point(1000, "A.2", "order-1", "charge", "hang", name="heartbeat"),
               harness(5000, "bound_hit")])
    assert only(stuck_detected(h)).events == (4,)  # the hang (after the two spawns)


def test_terminates_holds_for_pending_steps_behind_a_step_in_manual_review():
    # Nothing after a step in manual review runs until an operator acts: waiting, not stuck.
    holds(terminates(build([], final=final(("order-3", "notify", "manual_intervention"),
                                          ("order-3", "amend", "pending"),
                                          ("order-4", "charge", "succeeded")))))
    r = terminates(build([], final=final(("order-3", "notify", "pending"),
                                         ("order-3", "amend", "pending"))))
    assert r.valid is False and len(r.violations) == 2


def test_terminates_flags_a_workload_step_the_final_states_leave_out():
    # Protects: a target whose final_states() named only the steps it did (its queue never
    # enqueued the last order) was judged valid -- a lost job passed as "nothing to judge".
    steps = tuple(StepConfig(i, s, "payment", f"{i}:{s}") for i in ("order-1", "order-2")
                  for s in ("reserve", "charge"))
    h = build([], steps=steps, owns_state=True,
              final=final(("order-1", "reserve", "succeeded"), ("order-1", "charge", "succeeded")))
    r = terminates(h)
    assert r.valid is False and [(v.instance, v.step) for v in r.violations] == [
        ("order-2", "reserve"), ("order-2", "charge")]
    assert "has no final state" in r.violations[0].detail
    # Behind a step awaiting an operator, a step with no final state is waiting, not lost.
    holds(terminates(build([], steps=steps, owns_state=True, final=final(
        ("order-1", "reserve", "succeeded"), ("order-1", "charge", "succeeded"),
        ("order-2", "reserve", "manual_intervention")))))
    # With the bound hit, a missing step means not every step settled: unknown, never valid.
    r = terminates(build([], steps=steps, owns_state=True, bound_hit=True, quiescent=False,
                         final=final(("order-1", "reserve", "succeeded"))))
    assert r.valid is None


# ---------------------------------------------------------------------------------------------
# lease_fenced, fence_rises, receipt_first: the bug classes of DESIGN section 7 beyond its ten


def renewed(t: float, worker: str, fence: int, current: int, inst: str = "order-1",
            step: str = "charge") -> Raw:
    return store(t, "renewed", inst, step, worker=worker, fence=fence, lease_version=current)


def released(t: float, worker: str, fence: int, inst: str = "order-1", step: str = "charge") -> Raw:
    return store(t, "released", inst, step, worker=worker, fence=fence, lease_version=fence)


def flagged(t: float, inst: str = "order-1", step: str = "charge") -> Raw:
    return store(t, "stuck_flagged", inst, step, worker="B", lease_version=1, stuck_owner="A")


def receipt(t: float, key: str = "k1", status: str = "succeeded", worker: str = "A",
            inst: str = "order-1", step: str = "charge") -> Raw:
    return store(t, "receipt_recorded", inst, step, worker=worker, fence=1, key=key, status=status)


def test_lease_fenced_holds_for_the_holders_own_renewals_and_release():
    holds(lease_fenced(build([created(0), claimed(1, "order-1", "charge", "A", 1, 2),
                              renewed(2, "A", 1, 1), renewed(3, "A", 1, 1), released(4, "A", 1),
                              claimed(5, "order-1", "charge", "B", 2, 3), renewed(6, "B", 2, 2),
                              committed(7, "order-1", "charge", "B", 2, 4)])))


def test_lease_fenced_flags_a_stale_heartbeat_renewing_by_instance_alone():
    # aegra #502: A hung, the monitor freed its lease, B took it; A's heartbeat renews it anyway.
    h = build([created(0), claimed(1, "order-1", "charge", "A", 1, 2), renewed(2, "A", 1, 1),
               flagged(300), claimed(301, "order-1", "charge", "B", 2, 3),
               renewed(310, "A", 1, 2), committed(320, "order-1", "charge", "B", 2, 4)])
    v = only(lease_fenced(h))
    assert (v.instance, v.step, v.events) == ("order-1", "charge", (4, 5))
    assert "A renewed" in v.detail and "belonged to B with fence 2" in v.detail


def test_lease_fenced_flags_a_renewal_or_release_of_a_lease_nobody_holds():
    v = only(lease_fenced(build([created(0), claimed(1, "order-1", "charge", "A", 1, 2),
                                 flagged(300), renewed(310, "A", 1, 1)])))
    assert "nobody held the lease" in v.detail
    v = only(lease_fenced(build([created(0), claimed(1, "order-1", "charge", "A", 1, 2),
                                 committed(5, "order-1", "charge", "A", 1, 3), released(6, "A", 1)])))
    assert "A released" in v.detail


def test_lease_fenced_has_nothing_to_judge_without_renewals_or_releases():
    unjudged(lease_fenced(build([created(0), claimed(1, "order-1", "charge", "A", 1, 2),
                                 committed(5, "order-1", "charge", "A", 1, 3)])))


def test_fence_rises_holds_when_every_claim_of_a_step_raises_its_fence():
    holds(fence_rises(build([created(0), claimed(1, "order-1", "charge", "A", 1, 2),
                             claimed(2, "order-1", "charge", "B", 2, 3),
                             claimed(3, "order-1", "charge", "A", 5, 4)])))


def test_fence_rises_flags_a_lease_generation_reset_on_re_grant():
    # semaprax #192: the re-granted lease starts again at 1, so A and B share one fencing token.
    h = build([created(0), claimed(1, "order-1", "charge", "A", 1, 2),
               claimed(2, "order-1", "charge", "B", 1, 3)])
    v = only(fence_rises(h))
    assert v.events == (1, 2) and "fence 1, not above fence 1" in v.detail


def test_fence_rises_judges_each_step_on_its_own():
    unjudged(fence_rises(build([claimed(1, "order-1", "charge", "A", 1, 2),
                                claimed(2, "order-1", "reserve", "A", 1, 2)])))


def test_receipt_first_holds_when_the_receipt_precedes_the_commit():
    holds(receipt_first(build([claimed(1, "order-1", "charge", "A", 1, 2), receipt(2),
                               committed(3, "order-1", "charge", "A", 1, 3)], steps=(CHARGE,))))


def test_receipt_first_flags_a_commit_recorded_before_its_receipt():
    h = build([claimed(1, "order-1", "charge", "A", 1, 2),
               committed(3, "order-1", "charge", "A", 1, 3), receipt(4)], steps=(CHARGE,))
    v = only(receipt_first(h))
    assert (v.step, v.events) == ("charge", (1,)) and "'k1'" in v.detail


def test_receipt_first_speaks_once_per_worker_and_names_the_key_the_worker_sent():
    """A worker that commits before its receipt does so at every step: one violation for the worker
    (not one line per committed step, 370 a matrix), naming the key it sent, not killpoint's."""
    two = StepConfig("order-2", "charge", "payment", "k2")
    h = build([receipt(0.5, key="other", inst="order-9"),
               claimed(1, "order-1", "charge", "A", 1, 2), request(1.5, key="order-1/charge/mine"),
               committed(3, "order-1", "charge", "A", 1, 3),
               claimed(4, "order-2", "charge", "A", 1, 2), committed(5, "order-2", "charge", "A", 1, 3),
               claimed(6, "order-2", "charge", "B", 2, 4), committed(7, "order-2", "charge", "B", 2, 5)],
              steps=(CHARGE, two))
    result = receipt_first(h)
    assert result.valid is False and len(result.violations) == 2  # A and B, once each
    a = next(v for v in result.violations if v.detail.startswith("A "))
    assert (a.instance, a.step) == ("order-1", "charge") and len(a.events) == 2
    assert "(and 1 more step)" in a.detail and "'order-1/charge/mine'" in a.detail and "'k1'" not in a.detail


def test_receipt_first_does_not_take_a_failed_receipt_for_a_succeeded_commit():
    h = build([receipt(2, status="failed_permanent"),
               committed(3, "order-1", "charge", "A", 1, 3)], steps=(CHARGE,))
    only(receipt_first(h))


def test_receipt_first_takes_a_receipt_under_the_workers_own_key_for_the_same_step():
    # A correct worker that keys its calls "order-1/charge" (the README's own advice: any key that
    # stays the same on every retry) and records its receipt before committing: no violation.
    holds(receipt_first(build([claimed(1, "order-1", "charge", "A", 1, 2),
                               receipt(2, key="order-1/charge"),
                               committed(3, "order-1", "charge", "A", 1, 3)], steps=(CHARGE,))))
    # ... but a receipt of another step does not count, nor one recorded after the commit.
    only(receipt_first(build([claimed(1, "order-1", "charge", "A", 1, 2),
                              receipt(2, key="order-1/reserve", step="reserve"),
                              committed(3, "order-1", "charge", "A", 1, 3),
                              receipt(4, key="order-1/charge")], steps=(CHARGE,))))


def test_receipt_first_takes_the_forward_receipt_of_an_own_key_never_for_the_compensation():
    reserve = StepConfig("order-1", "reserve", "inventory", "k1", compensation_key="k1-undo")
    forward = [claimed(1, "order-1", "reserve", "A", 1, 2), receipt(2, key="o1/reserve", step="reserve"),
               committed(3, "order-1", "reserve", "A", 1, 3),
               claimed(4, "order-1", "reserve", "A", 2, 4, from_state="succeeded", to_state="compensating")]
    done = committed(6, "order-1", "reserve", "A", 2, 5, from_state="compensating", to_state="compensated")
    holds(receipt_first(build([*forward, receipt(5, key="o1/reserve-undo", step="reserve"), done],
                              steps=(reserve,))))
    v = only(receipt_first(build([*forward, done], steps=(reserve,))))
    assert "compensated" in v.detail and "'k1-undo'" in v.detail


def test_receipt_first_judges_neither_a_target_without_receipts_nor_a_pure_step():
    unjudged(receipt_first(build([committed(3, "order-1", "charge", "A", 1, 3)], steps=(CHARGE,))))
    unjudged(receipt_first(build([receipt(1, key="k9"),
                                  committed(3, "order-1", "notify", "A", 1, 3)], steps=(NOTIFY,))))


# ---------------------------------------------------------------------------------------------
# a target that owns its state: not applicable, never a silent pass


def test_owned_state_without_store_events_makes_store_invariants_not_applicable_ledger_ones_judge():
    h = build([request(1, key="order-1:charge:payment:v1")], owns_state=True,
              steps=(StepConfig("order-1", "charge", "payment", "order-1:charge:payment:v1"),))
    verdict = check_all(h)
    by = {r.invariant: r for r in verdict.results}
    for name in ("version_chain", "legal_transitions", "manual_stable", "stuck_detected",
                 "effects_accounted", "terminates", "checkpoints_honoured", "lease_fenced",
                 "fence_rises", "receipt_first"):
        assert by[name].applicable is False and not by[name].judged, name
        assert by[name].detail.startswith("not applicable:")
    assert by["no_duplicate_effects"].applicable and by["no_duplicate_effects"].judged
    assert by["intent_conflict"].applicable and by["stale_writes_rejected"].applicable
    assert verdict.valid is True and verdict.judged == 1
    assert set(verdict.not_applicable) >= {"version_chain", "terminates"}


def test_owned_state_with_history_and_final_states_lets_store_invariants_judge_them():
    h = build([created(0), claimed(1, "order-1", "charge", "A", 1, 1),
               committed(3, "order-1", "charge", "A", 1, 1), request(2, key="order-1:charge:payment:v1")],
              owns_state=True, final=({"instance": "order-1", "step": "charge", "state": "succeeded"},),
              steps=(StepConfig("order-1", "charge", "payment", "order-1:charge:payment:v1"),))
    by = {r.invariant: r for r in check_all(h).results}
    assert by["legal_transitions"].applicable and by["legal_transitions"].judged
    assert by["version_chain"].valid is False  # the hand-written commit skipped a version: judged, caught
    assert by["effects_accounted"].applicable and by["terminates"].judged


def test_owned_state_duplicate_effect_is_still_violated_when_nothing_else_applies():
    key = "order-1:charge:payment:v1"
    h = build([request(1, key="random-1"), request(2, key="random-2")], owns_state=True,
              steps=(StepConfig("order-1", "charge", "payment", key),))
    verdict = check_all(h)
    assert verdict.valid is False
    assert [v.invariant for v in verdict.violations] == ["no_duplicate_effects"]


SLEEPER = "A@charge.heartbeat:1*hang,B@before_claim:1*sleep(1985)"


def _two_workers(*raw: Raw, bound: float = 300) -> History:
    """A run's history with its spawns: A claims charge at 10 ms and hangs at its heartbeat at
    20 ms (bound 300 ms + slack 250 ms), B runs beside it; then ``raw``. Its schedule is
    ``SLEEPER`` (whose sleep tells the checker how long B slept)."""
    return build([created(0), harness(1, "spawn", worker="A", identity="A", pid=1),
                  harness(2, "spawn", worker="B", identity="B", pid=2),
                  claimed(10, "order-1", "charge", "A", 1, 2),
                  point(20, "A", "order-1", "charge", "hang", name="heartbeat"), *raw,
                  harness(10_000, "bound_hit")], stuck_bound_ms=bound, stuck_slack_ms=250,
                 schedule=SLEEPER)


def _asleep(t: float) -> Raw:
    """B's sleep of SLEEPER firing at ``t`` ms (1985 ms long)."""
    raw = point(t, "B", "order-2", "charge", "sleep", name="before_claim")
    return (raw[0], raw[1], raw[2], raw[3], {**raw[4], "fault": 1})


def test_stuck_detected_counts_only_time_another_worker_was_free_to_flag_the_hang():
    # B asleep in a sleep fault from 15 ms to 2000 ms: nobody could look. Before, the reference
    # was violated here (explore drew A hung and B asleep three bounds long); the window runs from
    # B's waking, and a flag then holds, a flag later than B's waking plus the window does not.
    # (B's heartbeat thread may write meanwhile: the sleep's length comes from the schedule)
    asleep = [_asleep(15), (int(500 * MS), "B", "heartbeat_lost", "event", {"instance": "order-2"})]
    holds(stuck_detected(_two_workers(*asleep, store(2100, "stuck_flagged", "order-1", "charge", worker="B"))))
    v = only(stuck_detected(_two_workers(*asleep, store(2600, "stuck_flagged", "order-1", "charge", worker="B"))))
    assert "only after 2580 ms" in v.detail
    only(stuck_detected(_two_workers(*asleep)))  # never flagged, and B free long enough: caught
    # without the sleep, the same late flag is late
    only(stuck_detected(_two_workers(store(2100, "stuck_flagged", "order-1", "charge", worker="B"))))
    # frozen by a pause (SIGSTOP to SIGCONT) counts as not free, as does a worker not yet started
    paused = [harness(15, "stop", worker="B", pid=2), harness(2000, "cont", worker="B", pid=2)]
    holds(stuck_detected(_two_workers(*paused, store(2100, "stuck_flagged", "order-1", "charge", worker="B"))))
    # B hung too, and nobody else: nobody could ever flag A: not judged
    unjudged(stuck_detected(_two_workers(point(15, "B", "order-2", "charge", "hang", name="heartbeat"))))


def test_stuck_detected_takes_a_claim_of_the_step_by_another_worker_as_its_end():
    # A hung before its first heartbeat: its lease ran out and B claimed the step: the step is
    # free again. Before, this was a violation whenever the history went on past the bound.
    holds(stuck_detected(_two_workers(claimed(500, "order-1", "charge", "B", 2, 3))))
    # a claim later than the window is late all the same
    only(stuck_detected(_two_workers(claimed(2000, "order-1", "charge", "B", 2, 3))))


def test_a_verdict_resting_only_on_not_applicable_invariants_is_unknown():
    verdict = check_all(build([], owns_state=True))
    assert verdict.valid is None and verdict.judged == 0
    assert any("no invariant had anything to judge" in r for r in verdict.unknown_reasons)


def test_stuck_detected_counts_only_time_the_machine_gave_the_run():
    # Flagged 690 ms after the hang against a 550 ms bound: late on an idle machine, but the
    # harness recorded it was starved for 200 ms meanwhile (a loaded runner), so the monitors were
    # held back too and the deadline moves by as much. Without the record it stays a violation.
    def history(starved: list) -> History:
        return build([created(0), claimed(10, "order-1", "charge", "A", 1, 2),
                      point(20, "A", "order-1", "charge", "hang", name="heartbeat"), *starved,
                      store(710, "stuck_flagged", "order-1", "charge", worker="B", lease_version=1),
                      harness(5000, "bound_hit")], stuck_bound_ms=300, stuck_slack_ms=250)

    only(stuck_detected(history([])))
    holds(stuck_detected(history([harness(300, "starved", ms=200.0)])))
    # starvation after the deadline excuses nothing
    only(stuck_detected(history([harness(600, "starved", ms=200.0)])))


def test_a_journal_is_read_whole_a_torn_last_line_tolerated_and_a_bad_middle_line_never_dropped(tmp_path):
    """Protects: the verdict's evidence. Journals are parsed in one go; a worker killed mid-write
    tears at most its last line, which is left out, but an entry that is not JSON in the middle of
    a journal raises instead of being skipped: dropping it could hide a call and let a broken
    worker come out valid."""
    from killpoint.harness.history import read_journal

    path = tmp_path / "journal-A.jsonl"
    lines = [b'{"t": 1, "kind": "call", "type": "invoke", "op": 1}',
             b'{"t": 2, "kind": "call", "type": "ok", "op": 1}']
    path.write_bytes(b"\n".join(lines) + b"\n" + b'{"t": 3, "kind": "com')
    assert [e["t"] for e in read_journal(path)] == [1, 2]
    path.write_bytes(lines[0] + b"\n\n" + lines[1])  # a blank line, and a last line whole but unterminated
    assert [e["t"] for e in read_journal(path)] == [1, 2]
    path.write_bytes(lines[0] + b'\n{"t": 2, "kind": "ca\n' + lines[1] + b"\n")
    with pytest.raises(ValueError):
        read_journal(path)
