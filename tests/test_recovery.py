"""The recovery decision table and the worker's planner: pure functions, judged without processes."""

from __future__ import annotations

import itertools

import pytest

from killpoint.harness import recovery, states
from killpoint.harness.recovery import Evidence, recover
from killpoint.harness.worker import DONE, WAIT, plan
from killpoint.harness.workload import default_workload
from hang import HANG_S


def test_the_four_cases_of_the_source_document():
    cases = [Evidence(False, None, True, 1, 3), Evidence(True, "succeeded", True, 1, 3),
             Evidence(True, None, False, 1, 3), Evidence(True, None, True, 1, 3)]
    assert [recover(c) for c in cases] == ["wait", "record_completion", "manual_review",
                                           "retry_same_activity"]


def test_a_live_lease_is_never_taken_whatever_the_receipt():
    for receipt in (None, "succeeded", "failed_permanent"):
        assert recover(Evidence(False, receipt, False, 9, 3)) == recovery.WAIT


def test_known_outcomes_are_recorded_never_redone():
    assert recover(Evidence(True, "succeeded", False, 5, 3)) == recovery.RECORD_COMPLETION
    assert recover(Evidence(True, "failed_permanent", True, 0, 3)) == recovery.RECORD_FAILURE


def test_unsafe_activity_with_unknown_outcome_goes_to_manual_not_retry():
    assert recover(Evidence(True, None, False, 0, 3)) == recovery.MANUAL_REVIEW


def test_retry_budget_exhausts():
    assert recover(Evidence(True, None, True, 3, 3)) == recovery.EXHAUSTED
    assert recover(Evidence(True, None, True, 2, 3)) == recovery.RETRY_SAME_ACTIVITY


def test_same_evidence_always_gives_the_same_action():
    space = itertools.product((True, False), (None, "succeeded", "failed_permanent"), (True, False),
                              range(5), (3,))
    for args in space:
        e = Evidence(*args)
        assert len({recover(e) for _ in range(3)}) == 1
        assert recover(e) in recovery.ACTIONS


def _rows(instance, *spec, now=100.0):
    return [{"instance": instance, "step": step, "idx": i, "state": state, "state_version": 1,
             "owner_worker": owner, "expires_at": expires, "attempt": 0}
            for i, (step, state, owner, expires) in enumerate(spec)]


WL = default_workload(0)


def test_plan_runs_steps_in_order():
    rows = _rows("order-1", ("reserve", states.SUCCEEDED, None, None), ("charge", states.PENDING, None, None),
                 ("notify", states.PENDING, None, None))
    task = plan(rows, 100.0, WL)
    assert task.kind == "run" and task.row["step"] == "charge"


def test_plan_waits_on_a_live_lease_and_takes_over_an_expired_one():
    live = _rows("order-1", ("reserve", states.RUNNING, "A", 200.0), ("charge", states.PENDING, None, None),
                 ("notify", states.PENDING, None, None))
    assert plan(live, 100.0, WL) == WAIT
    expired = _rows("order-1", ("reserve", states.RUNNING, "A", 50.0), ("charge", states.PENDING, None, None),
                    ("notify", states.PENDING, None, None))
    assert plan(expired, 100.0, WL).row["step"] == "reserve"


def test_plan_compensates_and_cancels_after_a_declined_charge():
    rows = _rows("order-2", ("reserve", states.SUCCEEDED, None, None), ("charge", states.FAILED, None, None),
                 ("notify", states.PENDING, None, None))
    first = plan(rows, 100.0, WL)
    assert (first.kind, first.row["step"]) == ("compensate", "reserve")
    rows[0]["state"] = states.COMPENSATED
    second = plan(rows, 100.0, WL)
    assert (second.kind, second.row["step"]) == ("cancel", "notify")
    rows[2]["state"] = states.CANCELLED
    assert plan(rows, 100.0, WL) == DONE


def test_plan_never_touches_a_step_in_manual_review_and_finishes():
    rows = _rows("order-1", ("reserve", states.SUCCEEDED, None, None), ("charge", states.SUCCEEDED, None, None),
                 ("notify", states.MANUAL, None, None))
    assert plan(rows, 100.0, WL) == DONE


@pytest.mark.parametrize("state", sorted(states.SETTLED))
def test_settled_states_have_no_automatic_way_out_but_the_table(state):
    # manual review leaves only by an operator; the others are terminal or wait for an outside event
    assert state not in states.CLAIMABLE


def test_the_heartbeat_survives_a_dead_store_connection_and_keeps_renewing(tmp_path):
    """Protects: a lease renewed to the end. A heartbeat thread that met StoreUnavailable (its
    session ended, the store restarted) used to die with a traceback on stderr, so the lease then
    lapsed under a business thread still at work. It journals the loss and renews at the next beat."""
    import json
    import time

    from killpoint.chaos.journal import Journal
    from killpoint.harness.mutants import Delegating
    from killpoint.harness.store import SQLiteStore, StoreUnavailable
    from killpoint.harness.worker import Heartbeat, Timing

    class DropsOnce(Delegating):
        dropped = 0

        def heartbeat(self, claim, ttl_ms):
            if DropsOnce.dropped == 0:
                DropsOnce.dropped += 1
                raise StoreUnavailable("the store ended the session")
            return self.inner.heartbeat(claim, ttl_ms)

    wl = default_workload(0)
    store = SQLiteStore(str(tmp_path / "hb.sqlite"))
    store.setup(wl.checkpoints())
    row = store.steps()[0]
    claim = store.claim(row["instance"], row["step"], "A", expected_state_version=row["state_version"],
                        from_state=row["state"], to_state=states.RUNNING, ttl_ms=500)
    journal = Journal(str(tmp_path / "journal.jsonl"))
    beat = Heartbeat(DropsOnce(store), journal, Timing(lease_ttl_ms=500, heartbeat_ms=10,
                                                       stuck_bound_ms=1000, poll_ms=1))
    beat.hold(claim)
    deadline = time.monotonic() + HANG_S
    renewals: list = []
    while time.monotonic() < deadline and len(renewals) < 3:
        time.sleep(0.02)
        renewals = [e for e in store.events() if e["kind"] == "renewed"]
    beat.release()
    assert DropsOnce.dropped == 1 and len(renewals) >= 3  # renewed after the loss, again and again
    entries = [json.loads(line) for line in open(journal.path)]
    assert [e["thread"] for e in entries if e["kind"] == "store_unavailable"] == ["heartbeat"]
    store.close()
